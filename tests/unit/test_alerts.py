"""healer's alerting rules (deploy/prometheus/healer-rules.yaml) and what is generated from them.

* ``promtool check rules`` accepts the rule file and the PrometheusRule's groups;
* ``promtool test rules`` passes deploy/prometheus/healer-rules.test.yaml, and that file has,
  for every alert, a case where it fires and a case where it stays quiet;
* every alert carries a severity, a summary, a description and a ``runbook_url`` naming
  docs/runbooks/<AlertName>.md, which exists and covers meaning, impact, investigation, fix
  and silencing;
* every metric an alert uses is one healer exports (healer.obs.metrics.METRICS);
* deploy/prometheus/prometheusrule.yaml and deploy/grafana/alerting.yaml carry the same rules
  (healer_dev/grafana/alerts.py generates them: ``make grafana``; tests/unit/test_generated.py
  fails while they are stale).

promtool comes with Debian's prometheus package (hack/install-system-deps.sh); when it is
missing these tests FAIL, they never skip.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from healer_dev.grafana import alerts as render_alerts
from tests.unit.test_dashboards import known_metrics, metric_names, promtool

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/healer-rules.yaml"
RULE_TESTS = ROOT / "deploy/prometheus/healer-rules.test.yaml"
PROMETHEUS_RULE = ROOT / "deploy/prometheus/prometheusrule.yaml"
GRAFANA = ROOT / "deploy/grafana/alerting.yaml"
RUNBOOKS = ROOT / "docs/runbooks"
SEVERITIES = {"critical", "warning", "info"}
#: Each runbook answers these, in a section whose heading starts with the word(s).
RUNBOOK_SECTIONS = ("What it means", "Impact", "Investigate", "Fix", "Silence")


def _alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


ALERTS = _alerts()
NAMES = [a["alert"] for a in ALERTS]


def _promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def test_there_are_alerts_and_names_are_unique() -> None:
    assert len(NAMES) >= 8
    assert len(set(NAMES)) == len(NAMES), NAMES


def test_promtool_check_rules() -> None:
    r = _promtool("check", "rules", str(RULES.relative_to(ROOT)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in r.stdout, r.stdout


def test_promtool_unit_tests_pass() -> None:
    r = _promtool("test", "rules", str(RULE_TESTS.relative_to(ROOT)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout, r.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    assert doc["rule_files"] == [RULES.name]
    fires: set[str] = set()
    quiet: set[str] = set()
    for group in doc["tests"]:
        for case in group.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    unknown = (fires | quiet) - set(NAMES)
    assert not unknown, f"tests for alerts that do not exist: {sorted(unknown)}"
    assert not set(NAMES) - fires, f"never shown firing: {sorted(set(NAMES) - fires)}"
    assert not set(NAMES) - quiet, f"never shown quiet: {sorted(set(NAMES) - quiet)}"


@pytest.mark.parametrize("name", NAMES)
def test_alert_metadata_and_runbook(name: str) -> None:
    rule = next(a for a in ALERTS if a["alert"] == name)
    assert name.startswith("Healer"), name
    assert rule.get("labels", {}).get("severity") in SEVERITIES, rule.get("labels")
    ann = rule.get("annotations", {})
    assert ann.get("summary", "").strip(), f"{name}: no summary"
    assert len(ann.get("description", "").strip()) > 40, f"{name}: no real description"
    assert ann.get("runbook_url") == f"docs/runbooks/{name}.md", ann.get("runbook_url")
    book = ROOT / ann["runbook_url"]
    assert book.is_file(), f"{name}: {book} is missing"
    text = book.read_text()
    assert text.startswith(f"# {name}\n"), f"{book}: must start with '# {name}'"
    headings = [line[3:].strip() for line in text.splitlines() if line.startswith("## ")]
    for section in RUNBOOK_SECTIONS:
        assert any(h.startswith(section) for h in headings), f"{book}: no '## {section}...'"
    for tool in ("healer status", "kubectl"):
        assert tool in text, f"{book}: never mentions `{tool}`"


def test_no_orphan_runbooks() -> None:
    books = {p.stem for p in RUNBOOKS.glob("*.md")} - {"README"}
    assert books == set(NAMES), sorted(books ^ set(NAMES))


def test_alerts_use_only_exported_metrics() -> None:
    known = {n for n, src in known_metrics().items() if src == "healer"}
    problems = []
    for a in ALERTS:
        names = metric_names(a["expr"])
        assert names, a["alert"]
        problems += [f"{a['alert']}: {n}" for n in sorted(names - known)]
    assert not problems, problems


def test_prometheusrule_carries_the_same_rules(tmp_path: Path) -> None:
    obj = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert obj["kind"] == "PrometheusRule"
    assert obj["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    rules = tmp_path / "from-prometheusrule.yaml"
    rules.write_text(yaml.safe_dump({"groups": obj["spec"]["groups"]}))
    r = _promtool("check", "rules", str(rules))
    assert r.returncode == 0, r.stdout + r.stderr


def test_grafana_alerting_carries_the_same_rules() -> None:
    doc = yaml.safe_load(GRAFANA.read_text())
    assert doc["apiVersion"] == 1
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert [r["title"] for r in rules] == NAMES
    assert len({r["uid"] for r in rules}) == len(rules)
    for src, gr in zip(ALERTS, rules, strict=True):
        refs = [q["refId"] for q in gr["data"]]
        assert gr["condition"] in refs, gr["condition"]
        query = next(q for q in gr["data"] if q["refId"] == "query")
        assert query["model"]["expr"] == src["expr"].strip()
        assert query["model"]["instant"] is True
        assert gr["for"] == src.get("for", "0s")
        assert gr["labels"] == src["labels"]
        assert gr["noDataState"] == "OK"
        for key, text in src["annotations"].items():
            assert gr["annotations"][key] == render_alerts.grafana_template(text)
            assert not re.search(r"\$value\b(?!s)", gr["annotations"][key])
        assert gr["annotations"]["runbook_url"] == f"docs/runbooks/{src['alert']}.md"


def test_grafana_template_rewrites_value_only() -> None:
    t = render_alerts.grafana_template
    assert t("{{ $value }} x {{ $labels.node }}") == \
        "{{ $values.query.Value }} x {{ $labels.node }}"
    assert t("{{ $value | humanizeDuration }}") == "{{ $values.query.Value | humanizeDuration }}"
    assert t("{{ $values.A.Value }}") == "{{ $values.A.Value }}"
