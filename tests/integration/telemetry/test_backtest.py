"""healer backtest against a real Prometheus holding a scripted WEEK of DCGM history.

The DCGM simulator is rendered every minute for a week (8 nodes, 2 GPUs each), written as
OpenMetrics and backfilled with ``promtool tsdb create-blocks-from openmetrics`` into the TSDB
of a LocalPrometheus started afterwards (it scrapes nothing). The scripted faults:

* day 2: XID 79 (fell off the bus) on gpu-1 GPU 1 → failed, replaced at once;
* day 4: an ECC single-bit storm on gpu-3 GPU 0 → degrading, checkpoint, replaced;
* day 5: gpu-5's exporter is down for 3 hours → stale (unknown), never an incident;
* day 6: XID 48 on gpu-2, gpu-4 and gpu-6 two minutes apart → the fleet breaker (3 nodes in
  10 minutes) holds gpu-6 for its 30-minute cooldown.

The backtest runs policies/default.yaml (both policies observe-only, evaluated as act) with a
FleetGuardrails whose breaker trips at 3 nodes, twice (through the API and through the
command): the reports match the script and the JSON is byte-identical. Run with ``-s`` to see
the wall times and the report.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from healer.backtest.cli import add_backtest_flags, cmd_backtest
from healer.backtest.replay import backtest
from healer.backtest.report import Report
from healer.core.timefmt import rfc3339
from healer.policy.load import load_policy_set
from healer_dev.devstack.prometheus import LocalPrometheus
from healer_dev.sim.dcgm import DcgmSim, M, make_node
from tests.integration.telemetry.history import aligned_start, history_prometheus, write_history

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]

D, H, MIN = 86400, 3600, 60
STEP = 60
#: 2025-12-30T12:00:00Z, a TSDB block boundary: the week fits one block.
T0 = aligned_start(1_767_000_000)
END = T0 + 7 * D
NODES = [f"gpu-{i}" for i in range(8)]
XID79 = T0 + 1 * D + 10 * H + 3 * MIN
SBE = T0 + 3 * D + 2 * H
OUTAGE = (T0 + 4 * D + 1 * H, T0 + 4 * D + 4 * H)
BURST = T0 + 5 * D + 1 * H
BURST_NODES = {"gpu-2": (0, BURST), "gpu-4": (1, BURST + 2 * MIN), "gpu-6": (0, BURST + 4 * MIN)}
BREAKER = {"window": "10m", "threshold": 3, "cooldown": "30m"}
#: The families the policies and the freshness query read (plus ``up``).
FAMILIES = {M.GPU_TEMP, M.XID_ERRORS, M.XID_COUNT, M.ECC_SBE_VOL, M.ECC_DBE_VOL,
            M.ROW_REMAP_FAILURE, M.ROW_REMAP_PENDING, M.NVLINK_CRC_FLIT, M.PCIE_REPLAY,
            M.THERMAL_VIOLATION}


@pytest.fixture(autouse=True)
def _clear_faults() -> None:
    """Overrides the package's fixture: this module needs no live DCGM exporters."""


def scripted_week() -> DcgmSim:
    sim = DcgmSim([make_node(n, 2) for n in NODES])
    sim.xid("gpu-1", 1, 79, at=XID79)
    sim.ecc_sbe("gpu-3", 0, 20000, rate=5.0, at=SBE, duration=2 * H)
    sim.exporter_down("gpu-5", at=OUTAGE[0], duration=OUTAGE[1] - OUTAGE[0])
    for node, (g, t) in BURST_NODES.items():
        sim.xid(node, g, 48, at=t)
    return sim


@dataclass(frozen=True)
class Week:
    prom: LocalPrometheus
    policies: Path


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Week]:
    work = tmp_path_factory.mktemp("backtest-week")
    began = time.monotonic()
    history = write_history(scripted_week(), work / "week.om", T0, END, STEP, families=FAMILIES)
    prom = history_prometheus(work / "prometheus", history)
    history.path.unlink()  # hundreds of MB, in the TSDB now
    print(f"\nhistory: {history.samples} samples in {history.series} series "
          f"({history.renders} renders, {history.seconds:.1f}s to write), backfilled "
          f"{time.monotonic() - began:.1f}s after the start")

    docs = [d for d in yaml.safe_load_all((ROOT / "policies" / "default.yaml").read_text())
            if d["kind"] == "RemediationPolicy"]
    fleet = {"apiVersion": "healer.io/v1alpha1", "kind": "FleetGuardrails",
             "metadata": {"name": "fleet"},
             "spec": {"guardrails": {"maxConcurrent": 2, "maxUnavailable": "25%",
                                     "breaker": BREAKER}}}
    policies = work / "policies"
    policies.mkdir()
    (policies / "default.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    (policies / "fleet.yaml").write_text(yaml.safe_dump(fleet, sort_keys=False))

    prom.start()  # ConfigError with the log tail if it does not come up: the tests error
    try:
        # queryable: every minute of the week is there (both ends: Prometheus 2 ranges are
        # closed), minus gpu-5's outage
        q = 'count_over_time(DCGM_FI_DEV_GPU_TEMP{gpu="0"}[7d])'
        deadline = time.monotonic() + 30
        while True:
            result = prom.query(q, at=END)
            if len(result) == len(NODES) or time.monotonic() > deadline:
                break
            time.sleep(0.1)  # polling against the deadline (the blocks load at start-up)
        counts = {r["metric"]["Hostname"]: int(r["value"][1]) for r in result}
        outage = (OUTAGE[1] - OUTAGE[0]) // STEP
        assert counts == {n: 7 * D // STEP + 1 - (outage if n == "gpu-5" else 0) for n in NODES}
        down = prom.query('sum_over_time((up{instance="gpu-5:9400"} == bool 0)[7d:1m])', at=END)
        assert int(float(down[0]["value"][1])) == outage
        yield Week(prom, policies)
    finally:
        prom.stop()


def within_a_step(actual: float | None, expected: float) -> bool:
    return actual is not None and expected <= actual <= expected + STEP


def check(report: Report) -> None:
    inc = {i.node: i for i in report.incidents}
    assert sorted(inc) == ["gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-6"], report.table()

    xid79 = inc["gpu-1"]
    assert (xid79.severity, xid79.rules) == ("failed", ("fatal-xid",))
    assert [g.index for g in xid79.gpus] == [1]
    assert within_a_step(xid79.opened_at, XID79)
    assert within_a_step(xid79.drained_at, xid79.opened_at)
    assert xid79.spare
    assert xid79.phase == "Repair"
    assert not xid79.blocks

    sbe = inc["gpu-3"]
    assert (sbe.severity, sbe.rules, sbe.policy) == ("degrading", ("ecc-sbe-storm",),
                                                     "gpu-degrading")
    assert [g.index for g in sbe.gpus] == [0]
    assert within_a_step(sbe.opened_at, SBE)
    assert sbe.steps[0].step == "checkpoint"

    for node, (g, t) in BURST_NODES.items():
        i = inc[node]
        assert (i.severity, i.rules, [x.index for x in i.gpus]) == ("failed", ("fatal-xid",),
                                                                    [g]), node
        assert within_a_step(i.opened_at, t), node
    assert not inc["gpu-2"].blocks
    assert not inc["gpu-4"].blocks
    held = inc["gpu-6"]
    assert [(b.guardrail, b.current, b.limit) for b in held.blocks] == [("breaker", 3, 3)]
    block = held.blocks[0]
    assert block.since == held.opened_at
    assert block.until == held.opened_at + 30 * MIN
    assert held.admitted_at == block.until
    assert held.drained_at is not None

    s = report.summary
    assert [(t.scope, t.node, t.count, t.threshold) for t in s.breaker_trips] == [
        ("fleet", "gpu-6", 3, 3)]
    assert s.breaker_trips[0].at == held.opened_at
    assert dict(s.blocks) == {"breaker": 1}
    assert (s.incidents, s.nodes_taken_out, s.max_concurrently_out) == (5, 5, 1)
    assert (s.spares_claimed, s.spares_needed, s.escalations) == (5, 5, 0)

    # the exporter outage: stale (unknown) for its duration, no incident, no disruption
    g5 = report.node("gpu-5")
    assert not g5.incidents
    assert not g5.disruptions
    (stale,) = g5.stale
    assert OUTAGE[0] <= stale.since <= OUTAGE[0] + 2 * STEP
    assert within_a_step(stale.until, OUTAGE[1])
    for quiet in ("gpu-0", "gpu-7"):
        assert not report.node(quiet).incidents
        assert not report.node(quiet).stale
    assert s.stale_nodes == 1


@pytest.mark.timeout(600)
async def test_a_week_of_history(week: Week, monkeypatch: pytest.MonkeyPatch) -> None:
    policies = load_policy_set([week.policies])
    began = time.monotonic()
    report = await backtest(week.prom.url, policies, T0, END, step=STEP)
    api_seconds = time.monotonic() - began
    check(report)
    first = report.to_json()
    assert report.policies[0].configured == "observe"
    assert {p.evaluated for p in report.policies} == {"act"}
    t = report.timings
    print(f"\nbacktest of a week, {len(NODES)} nodes x 2 GPUs, step {STEP}s: "
          f"{report.signals} signals, {api_seconds:.1f}s wall time (fetching from Prometheus "
          f"{t['fetch']:.1f}s, replaying {t['replay']:.1f}s)\n")
    print(report.table())

    # the second run goes through the command line: byte-identical JSON on stdout
    monkeypatch.setattr("healer.obs.logging.setup", lambda *a, **k: None)
    parser = argparse.ArgumentParser()
    add_backtest_flags(parser)
    args = parser.parse_args(["--prometheus", week.prom.url, "--policies", str(week.policies),
                              "--from", rfc3339(T0), "--to", rfc3339(END), "--step", "60s",
                              "--json"])
    out = io.StringIO()
    began = time.monotonic()
    code = await asyncio.to_thread(functools.partial(cmd_backtest, args, out=out.write))
    assert code == 0
    print(f"second run (healer backtest --json): {time.monotonic() - began:.1f}s wall time")
    assert out.getvalue() == first
    doc = json.loads(first)
    assert doc["summary"]["breakerTrips"][0]["node"] == "gpu-6"
    assert doc["assumptions"]["world"] == "optimistic"
