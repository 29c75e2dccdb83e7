"""``healer report`` as a subprocess against the real kube-apiserver.

First, a remediation the real daemon process carries out (an XID, a swap to a spare, the
repair reported): the report's figures are those of the NodeRemediation it left, and the
daemon's own outcome metrics agree.

Then NodeRemediations written through healer's own store adapter (``CRStateStore``, as the
daemon writes them): a replaced, a recovered-after-drain and an escalated incident in the last
week, an older one on the same node (outside the window, but the gap to it counts), and one of
a node the report is not asked about. One node has a Node with ``nvidia.com/gpu: 4``; the other
has none any more, so ``--gpus-per-node`` stands for it. The JSON and text outputs are checked
against the figures the records imply.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from healer.adapters.kube.crd import from_object
from healer.adapters.kube.store import CRStateStore, ensure_crd
from healer.core.model import NodeRecord
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import fake_node
from tests.integration.daemon.conftest import Fleet
from tests.integration.waiting import wait_for
from tests.unit.test_outcomes import ESCALATED, RECOVERED_LATE, REPLACED, T0, at

ROOT = Path(__file__).resolve().parents[3]
DAY = 86400.0


def run_report(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "healer", "report", "--kubeconfig",
                           str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=120, check=False, env=env, cwd=ROOT)


@pytest.mark.timeout(240)
async def test_report_of_a_real_remediation_matches_its_record_and_the_metrics(
        fleet: Fleet) -> None:
    d = fleet.start()
    await fleet.ready(d)
    bad = fleet.gpus[2]
    fleet.xid(bad)
    await wait_for(lambda: fleet.play_repair(bad), timeout=120,
                   description=f"remediation of {bad} Done")
    (item,) = await fleet.remediations(bad)
    rec = from_object(item)  # the NodeRemediation as healer reads it
    drain, cordon, undrain = (rec.step(n) for n in ("drain", "cordon", "undrain"))
    assert drain is not None
    assert cordon is not None
    assert undrain is not None
    assert undrain.finished_at is not None
    opened, undrained = rec.incident.opened_at, undrain.finished_at
    out_of_service = undrained - min(drain.started_at, cordon.started_at)
    kubeconfig = fleet.kubeconfig or fleet.stack.kubeconfig
    run = await asyncio.to_thread(run_report, kubeconfig, "--node", bad, "--format", "json")
    assert run.returncode == 0, run.stderr
    r = json.loads(run.stdout)
    assert r["closings"]["replaced"] == 1
    assert r["incidents"] == r["finished"] == 1
    (inc,) = r["perIncident"]
    assert inc["incident"] == rec.incident.id
    assert inc["nodeGpus"] == 8  # the kwok Node has no nvidia.com/gpu: the default
    assert inc["timeToReplacementSeconds"] == pytest.approx(undrained - opened, abs=1e-3)
    assert inc["outOfServiceSeconds"] == pytest.approx(out_of_service, abs=1e-3)
    assert inc["gpuHoursLost"] == pytest.approx(out_of_service * 8 / 3600, abs=1e-3)
    assert 0 <= inc["timeToDetectSeconds"] < 60  # the XID was written just before
    assert r["falsePositiveRate"] == 0
    assert set(r["stepSeconds"]) >= {"drain", "cordon", "claim-spare", "move-workload",
                                     "await-replacement", "undrain", "return-to-pool"}
    # the daemon observed the same incident finishing (no node labels: fleet-wide figures)
    assert await d.metric("healer_remediations_finished_total", closing="replaced") == 1
    assert await d.metric("healer_time_to_replacement_seconds_count") == 1
    assert await d.metric("healer_time_to_replacement_seconds_sum") == pytest.approx(
        undrained - opened, abs=1e-3)
    lost = await d.metric("healer_capacity_lost_gpu_hours_total", closing="replaced")
    assert lost == pytest.approx(out_of_service * 8 / 3600, abs=1e-3)
    assert await d.metric("healer_remediations_found_nothing_total",
                          why="recovered-before-disruption") == 0


async def test_report_counts_what_the_stored_records_cost(
        kube_stack: KubeStack, kube_api: client.ApiClient) -> None:
    await ensure_crd(kube_api, install=True)
    tag = secrets.token_hex(3)
    a, b, other = f"rpt-{tag}-a", f"rpt-{tag}-b", f"rpt-{tag}-c"
    now = time.time()

    def days_ago(template: NodeRecord, days: float, node: str, serial: str) -> NodeRecord:
        return at(template, now - days * DAY - T0, node, (serial,) if serial else ())

    records = [days_ago(REPLACED, 2, a, "SER-X"),  # out 609 s, replacement after 610 s
               days_ago(RECOVERED_LATE, 1, a, "SER-X"),  # drained for 54 s, found nothing
               days_ago(ESCALATED, 3, b, "SER-Y"),  # out 299 s when handed to a human
               days_ago(REPLACED, 9, a, "SER-X"),  # before the window
               days_ago(REPLACED, 1, other, "")]  # not asked about
    core = client.CoreV1Api(kube_api)
    await core.create_node(fake_node(a, capacity={"nvidia.com/gpu": "4"}))  # type: ignore[arg-type]
    store = CRStateStore(kube_api)
    saved = [await store.save(r, None) for r in records]
    try:
        out = await asyncio.to_thread(run_report, kube_stack.kubeconfig, "--since", "7d",
                                      "--format", "json", "--node", a, "--node", b,
                                      "--gpus-per-node", "2")
        assert out.returncode == 0, out.stderr
        d = json.loads(out.stdout)
        assert d["window"]["nodes"] == [a, b]
        assert d["recordsRead"] == 4
        assert d["incidents"] == 3
        assert d["finished"] == 3
        assert d["closings"] == {"replaced": 1, "repaired": 0, "recovered": 1, "escalated": 1,
                                 "cancelled": 0, "open": 0}
        assert d["foundNothing"] == {"recovered-before-disruption": 0,
                                     "recovered-after-drain": 1, "repair-found-no-fault": 0}
        assert d["falsePositiveRate"] == 0.3333
        assert [(i["node"], i["nodeGpus"]) for i in d["perIncident"]] == [(b, 2), (a, 4), (a, 4)]
        assert d["gpuHoursLost"] == pytest.approx((609 * 4 + 54 * 4 + 299 * 2) / 3600, abs=1e-3)
        assert d["nodeHoursLost"] == pytest.approx((609 + 54 + 299) / 3600, abs=1e-3)
        assert d["timeToReplacementSeconds"]["count"] == 1
        assert d["timeToReplacementSeconds"]["p50"] == pytest.approx(610.0)
        assert d["timeToDetectSeconds"]["p50"] == pytest.approx(60.0)  # suspected 60 s before
        assert d["stepSeconds"]["drain"]["count"] == 3
        between = d["secondsBetweenIncidentsPerNode"]  # a: 9 → 2 → 1 days ago
        assert between["count"] == 2
        assert between["p50"] == pytest.approx(DAY, abs=1e-3)
        assert between["max"] == pytest.approx(7 * DAY, abs=1e-3)
        assert d["repeatNodes"] == [{"key": a, "incidents": 3, "shortestGapSeconds": DAY}]
        assert [r["key"] for r in d["repeatGpuSerials"]] == ["SER-X"]
        assert "no incident of the window was pruned" in d["window"]["coverage"]

        text = await asyncio.to_thread(run_report, kube_stack.kubeconfig, "--node", a,
                                       "--node", b, "--gpus-per-node", "2")
        assert text.returncode == 0, text.stderr
        assert "incidents 3 (finished 3, open 0)" in text.stdout
        assert "false-positive rate 33.3% (1 of 3 finished found nothing" in text.stdout
        assert f"capacity lost {(609 * 4 + 54 * 4 + 299 * 2) / 3600:.1f} GPU-hours" in \
            text.stdout
        assert f"repeat nodes: {a} (3 incidents, shortest gap 1d)" in text.stdout
        assert other not in text.stdout

        bad = await asyncio.to_thread(run_report, kube_stack.kubeconfig, "--since", "a week")
        assert bad.returncode == 2
        assert bad.stderr.strip().splitlines() == [
            "healer report: error: argument --since: expected a duration such as 90s, 5m, "
            "12h, 7d or 2w, got 'a week' (see healer report --help)"]
    finally:
        for s in saved:
            await store.delete(s.name)
        await core.delete_node(a)
