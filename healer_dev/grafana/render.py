"""Every file the generator writes, and whether the repository's copies are current.

:func:`render` maps each generated path (relative to the repository root) to its text: the
dashboards (``dashboards/*.json``, from the ``dashboard_*`` modules, in :data:`DASHBOARDS`),
the alert files generated from ``deploy/prometheus/healer-rules.yaml`` (:mod:`.alerts`), and
the Helm chart's copies of both under ``deploy/helm/healer/files/`` (what ``make chart-files``
copies). :func:`stale` lists those whose file differs (``tests/unit/test_generated.py`` fails on
any), :func:`write` writes them (``make grafana``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from healer_dev.grafana import (
    alerts,
    dashboard_controller,
    dashboard_gpu_health,
    dashboard_guardrails,
    dashboard_outcomes,
    dashboard_remediation,
    dashboard_spare_capacity,
    dashboard_step_latency,
)

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = Path("dashboards")
CHART_FILES = Path("deploy/helm/healer/files")

#: Every dashboard: its file name in dashboards/ and how it is built.
DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    m.FILE: m.build for m in (
        dashboard_controller, dashboard_gpu_health, dashboard_guardrails, dashboard_outcomes,
        dashboard_remediation, dashboard_spare_capacity, dashboard_step_latency)
}


def dashboard_json(d: Dashboard) -> str:
    """A dashboard as the file holds it: the SDK's JSON, indented, UTF-8, a final newline."""
    return json.dumps(d, cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"


def render(root: Path = ROOT,
           datasource_uid: str = alerts.DATASOURCE_UID) -> dict[Path, str]:
    """Every generated file (relative path → text); the alert files from ``root``'s rules,
    the Grafana rules querying the data source ``datasource_uid``."""
    out: dict[Path, str] = {}
    for name, build in DASHBOARDS.items():
        text = dashboard_json(build())
        out[DASHBOARD_DIR / name] = text
        out[CHART_FILES / "dashboards" / name] = text
    for path, text in alerts.render(root, datasource_uid).items():
        out[path] = text
        if path == alerts.GRAFANA_ALERTING:
            out[CHART_FILES / "grafana-alerting.yaml"] = text
    return out


def stale(root: Path = ROOT) -> list[Path]:
    """The generated files whose content differs from :func:`render`'s, and dashboards in
    ``dashboards/`` (or the chart's copies) that no module generates."""
    files = render(root)
    out = [rel for rel, text in files.items()
           if not (root / rel).is_file() or (root / rel).read_text() != text]
    for folder in (DASHBOARD_DIR, CHART_FILES / "dashboards"):
        out += [p.relative_to(root) for p in sorted((root / folder).glob("*.json"))
                if p.relative_to(root) not in files]
    return out


def write(root: Path = ROOT, datasource_uid: str = alerts.DATASOURCE_UID) -> list[Path]:
    """Write every generated file (and remove dashboards no module generates); what changed."""
    changed = []
    files = render(root, datasource_uid)
    for rel, text in files.items():
        path = root / rel
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(rel)
    for folder in (DASHBOARD_DIR, CHART_FILES / "dashboards"):
        for p in sorted((root / folder).glob("*.json")):
            if p.relative_to(root) not in files:
                p.unlink()
                changed.append(p.relative_to(root))
    return changed
