"""Generated files are current: the docs and schema.json (``make docs``, ``make schema``), and
the dashboards, the Grafana and prometheus-operator alert files and the chart's copies of them
(``make grafana``, from healer_dev/grafana/)."""

from __future__ import annotations

import shutil
from pathlib import Path

from healer.cli import build_parser
from healer.docs import generated_files, write_generated
from healer_dev.grafana import alerts, render

ROOT = Path(__file__).resolve().parents[2]


def test_generated_files_are_current() -> None:
    stale = write_generated(True, build_parser)
    assert not stale, f"run `make docs` (healer docs --write): stale {stale}"


def test_workflow_doc_names_every_phase() -> None:
    from healer.core.phases import Phase

    text = next(t for p, t in generated_files(build_parser).items() if p.name == "workflow.md")
    for phase in Phase:
        assert phase.value in text
    assert "stateDiagram-v2" in text


def test_dashboards_and_alert_files_are_current() -> None:
    stale = render.stale()
    assert not stale, f"run `make grafana` (python -m healer_dev grafana): stale {stale}"


def test_the_staleness_check_names_a_changed_a_missing_and_a_foreign_file(
        tmp_path: Path) -> None:
    for rel in render.render():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / alerts.SOURCE, tmp_path / alerts.SOURCE)
    assert len(render.write(tmp_path)) == len(render.render())
    assert render.stale(tmp_path) == []
    (tmp_path / "dashboards" / "outcomes.json").write_text("{}")
    (tmp_path / alerts.GRAFANA_ALERTING).unlink()
    (tmp_path / "dashboards" / "hand-made.json").write_text("{}")
    assert sorted(map(str, render.stale(tmp_path))) == [
        "dashboards/hand-made.json", "dashboards/outcomes.json", str(alerts.GRAFANA_ALERTING)]
    render.write(tmp_path)
    assert render.stale(tmp_path) == []
    assert not (tmp_path / "dashboards" / "hand-made.json").exists()
