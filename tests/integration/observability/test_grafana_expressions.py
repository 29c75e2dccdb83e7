"""Every query the chart ships to Grafana evaluates without error on a real Prometheus.

The expressions come from what the Helm chart renders with ``grafana.dashboards.enabled`` and
``grafana.alerting.enabled`` (tests/integration/test_helm_grafana.py checks those ConfigMaps
equal dashboards/*.json and deploy/grafana/alerting.yaml): every dashboard target and query
variable, with Grafana's variables substituted as Grafana would send them, and the PromQL query
of every Grafana alert rule (its ``__expr__`` math and threshold steps are Grafana's, not
PromQL).

They run against a real Prometheus (:class:`~healer_dev.devstack.prometheus.LocalPrometheus`)
scraping the real daemon process (the ``fleet`` fixture; an incident opened on it so that the
transition and step series exist) and DCGM-exporter simulators labelling the host both ways
(``Hostname`` and ``hostname``). Dashboard targets run as Grafana runs them
(a range query, or an instant one where the target says so), variables and alert queries as
instant queries. Each must answer without an error: a parse error, a many-to-many match, a
duplicate series after a label_replace, a bad range. That data make each one non-empty is
test_dashboards_live.py's business (the long scenario); this test asks only that nothing errs,
and proves with a deliberately conflicting join that an error on this data would be reported.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from healer.errors import ConfigError
from healer_dev.devstack.prometheus import LocalPrometheus
from healer_dev.sim.dcgm import DcgmSim, make_node
from healer_dev.sim.dcgm_server import ThreadedDcgmFleet
from tests.integration.daemon.conftest import Fleet
from tests.integration.test_helm import Helm, helm
from tests.integration.waiting import wait_for
from tests.unit.test_dashboards import iter_panels, substitute, variable_promql, variables

__all__ = ["helm"]  # the fixture, imported for the test below

Obj = dict[str, Any]

#: Grafana's Prometheus data source UID in the rendered alerting (the chart's default).
DATASOURCE_UID = "prometheus"


@dataclass
class Query:
    where: str
    expr: str
    instant: bool
    series: int = 0
    error: str = ""


def _rendered_configmaps(helm: Helm) -> tuple[dict[str, Obj], Obj]:
    """(file name → dashboard, alerting provisioning) from the chart rendered with both on."""
    objs = helm.template("--set", "grafana.dashboards.enabled=true",
                         "--set", "grafana.alerting.enabled=true")
    dashboards: dict[str, Obj] = {}
    alerting: Obj = {}
    for o in objs:
        if o["kind"] != "ConfigMap":
            continue
        for key, text in o["data"].items():
            if "-dashboard-" in o["metadata"]["name"]:
                dashboards[key] = json.loads(text)
            elif o["metadata"]["name"].endswith("-grafana-alerting"):
                alerting = yaml.safe_load(text)
    assert dashboards, "the chart rendered no dashboard ConfigMap"
    assert alerting, "the chart rendered no alerting ConfigMap"
    return dashboards, alerting


def dashboard_queries(dashboards: dict[str, Obj]) -> list[Query]:
    out = []
    for fname, dash in sorted(dashboards.items()):
        for panel in iter_panels(dash):
            for t in panel.get("targets", []):
                where = f"{fname} #{panel['id']} {panel.get('title', '')!r} {t.get('refId')}"
                out.append(Query(where, substitute(t["expr"], dash), bool(t.get("instant"))))
        for name, var in variables(dash).items():
            if var["type"] == "query":
                out.append(Query(f"{fname} variable ${name}",
                                 substitute(variable_promql(var), dash), True))
    return out


def alert_queries(alerting: Obj) -> list[Query]:
    """The PromQL step of every Grafana alert rule (one per rule)."""
    out = []
    for group in alerting["groups"]:
        for rule in group["rules"]:
            steps = [d for d in rule["data"] if d["datasourceUid"] != "__expr__"]
            assert len(steps) == 1, f"{rule['title']}: {len(steps)} data source queries"
            [step] = steps
            assert step["datasourceUid"] == DATASOURCE_UID, (rule["title"], step)
            model = step["model"]
            assert model["instant"] is True, rule["title"]
            out.append(Query(f"alert {rule['title']} {step['refId']}", model["expr"], True))
    return out


def evaluate(prom: LocalPrometheus, q: Query, start: float, end: float) -> None:
    try:
        if q.instant:
            q.series = len(prom.query(q.expr, at=end))
        else:
            q.series = len(prom.query_range(q.expr, start, end, 1.0))
        q.error = ""
    except ConfigError as e:
        q.error = str(e)


@pytest.mark.timeout(300)
async def test_every_grafana_query_the_chart_ships_evaluates_without_error(
        helm: Helm, fleet: Fleet, tmp_path: Path) -> None:
    dashboards, alerting = _rendered_configmaps(helm)
    dash_qs = dashboard_queries(dashboards)
    alert_qs = alert_queries(alerting)
    n_rules = sum(len(g["rules"]) for g in alerting["groups"])
    assert len(alert_qs) == n_rules > 0
    n_targets = sum(len(p.get("targets", [])) for d in dashboards.values()
                    for p in iter_panels(d))
    assert len(dash_qs) >= n_targets > 0

    sim = DcgmSim([make_node(n, 2, host_label="Hostname" if i % 2 else "hostname")
                   for i, n in enumerate(fleet.gpus)])
    sim.ecc_sbe(fleet.gpus[0], 1, rate=2.0)
    sim.xid(fleet.gpus[1], 0, 79)
    dcgm = ThreadedDcgmFleet(sim)
    prom: LocalPrometheus | None = None
    try:
        await asyncio.to_thread(dcgm.start)
        exporters = {t: {"component": "dcgm-exporter"} for t in dcgm.targets}
        prom = LocalPrometheus(tmp_path / "prometheus", exporters, "1s", job="healer-grafana")
        await asyncio.to_thread(prom.start)
        daemon = fleet.start("--prometheus-url", prom.url, "--poll-interval", "1")
        await fleet.ready(daemon)
        await asyncio.to_thread(prom.reload, {f"127.0.0.1:{daemon.port}": {"component": "healer"},
                                              **exporters})
        start = time.time()
        # an incident, so that the per-transition and per-step series exist too
        fleet.xid(fleet.gpus[1])

        async def opened() -> bool:
            return bool(await fleet.remediations(fleet.gpus[1]))

        await wait_for(opened, timeout=60, description=f"an incident on {fleet.gpus[1]}")
        for series in ("healer_up", "healer_transitions_total", "DCGM_FI_DEV_GPU_TEMP"):
            await asyncio.to_thread(prom.wait_for_series, series, 60.0)
        end = time.time()

        def run_all() -> None:
            assert prom is not None
            for q in (*dash_qs, *alert_qs):
                evaluate(prom, q, start, end)

        await asyncio.to_thread(run_all)

        # the control: a join this data makes ambiguous IS reported as an error
        control = Query("control", "healer_up + on () DCGM_FI_DEV_GPU_TEMP", True)
        await asyncio.to_thread(evaluate, prom, control, start, end)
        assert "many-to-many" in control.error, control
    finally:
        if prom is not None:
            await asyncio.to_thread(prom.stop)
        await asyncio.to_thread(dcgm.stop)

    everything = [*dash_qs, *alert_qs]
    with_data = sum(1 for q in everything if q.series)
    print(f"\n{len(dash_qs)} dashboard queries, {len(alert_qs)} alert queries: "
          f"no error; {with_data} with series now")
    failed = [q for q in everything if q.error]
    assert not failed, f"{len(failed)} quer(ies) failed on the real Prometheus:\n" + "\n".join(
        f"  {q.where}: {q.expr}\n    {q.error}" for q in failed)
