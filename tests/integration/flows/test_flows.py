"""End to end on the real stack (issue 5): kube-apiserver + kwok, a real Slurm 26.05 and its real
slurmrestd, SchedMD's real slurm-operator and the real daemon process with the real Slurm driver
(slinky, scontrol, or slurmrestd, each against that Slurm), for both NodeSet modes.

* ``test_full_flow`` (mode x driver, a job running on the bad node): the job is signalled and
  checkpoints (degrading rule, checkpoint policy) or runs to its end while healer waits in
  Draining (fatal XID); no busy slurmd pod is ever deleted or evicted; the replacement is the
  free spare in the bad node's NVLink domain (not the other domain's, not the decoy on the
  same leaf switch); the topology annotation is on it before the undrain (ledger order); Slurm
  shows the node idle at the end (DaemonSet: the new Slurm node idle, the old one still
  drained with healer's reason; StatefulSet: the same Slurm name now on the spare); one drain,
  one eviction, one claim, one Event per action, every step once; repaired → Done.
* ``test_replacement_never_serves_before_its_topology_is_set``: the same promise in Slurm's
  terms: the claim itself writes the spare's topology annotation, before any slurmd there.
* ``test_no_spare_holds_for_capacity_...``: HeldForCapacity, ``healer_held_for_capacity``
  and the HealerNodesHeldForCapacity expression true in a real Prometheus; a spare labelled
  later resumes the flow to the end, and both go quiet again.
* ``test_admin_drain_is_never_undone`` / ``test_admin_cordon_is_never_undone``.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
import yaml

from healer_dev.devstack.prometheus import LocalPrometheus
from tests.integration.daemon_process import ROOT
from tests.integration.flows.checks import (
    FLOW_STEPS,
    assert_ledger_once,
    assert_no_busy_pod_deleted,
    incident_of,
    ledger,
    print_timeline,
    spare_untouched,
)
from tests.integration.flows.conftest import SPARE_TAINT, TEST_LABEL, TOPOLOGY, FlowFactory
from tests.integration.waiting import wait_for

PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"  # degrading: checkpoint first
FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"  # failed, and clears when the sample goes back to 0

CASES = [
    pytest.param("StatefulSet", "slinky", "fatal", id="StatefulSet-slinky-xid79"),
    pytest.param("StatefulSet", "scontrol", "checkpoint", id="StatefulSet-scontrol-ckpt"),
    pytest.param("StatefulSet", "slurmrestd", "fatal", id="StatefulSet-slurmrestd-xid79"),
    pytest.param("DaemonSet", "slinky", "checkpoint", id="DaemonSet-slinky-ckpt"),
    pytest.param("DaemonSet", "scontrol", "fatal", id="DaemonSet-scontrol-xid79"),
    pytest.param("DaemonSet", "slurmrestd", "checkpoint", id="DaemonSet-slurmrestd-ckpt"),
]


@pytest.mark.timeout(420)
@pytest.mark.parametrize(("mode", "driver", "fault"), CASES)
async def test_full_flow(flows: FlowFactory, mode: str, driver: str, fault: str) -> None:
    f = await flows(mode, driver)
    lay = f.lay
    bad = lay.gpus[1]  # nvl-a, leaf-1
    sn = await f.slurm_name_on(bad)
    d = f.start_daemon()
    print(f"daemon ready after {await f.ready(d):.1f}s")
    checkpoint = fault == "checkpoint"
    job = await f.submit(sn, exit_on_usr1=checkpoint)
    t0 = time.time()

    if checkpoint:
        f.metric(bad, PENDING, 1)  # degrading: ask the job to checkpoint before the drain
        ended = await f.wait_job_end(job, bad)
        print(f"job checkpointed and exited {ended - t0:.1f}s after the fault")
    else:
        f.xid(bad)  # fatal: no checkpoint, drain and wait for the job
        await f.wait_slurm(sn, lambda s: s.drain and s.busy, within=120, remediated=bad,
                           what="drained by healer while the job still runs")
        assert await f.phase(bad) == "Draining", await f.diagnose(bad)
        print(f"Slurm node {sn} draining with the job running {time.time() - t0:.1f}s "
              "after the fault; letting the job finish")
        f.release(job)

    rec = await f.wait_phase(bad, "Repair", within=240, also=f.step_done(bad, "mark-repair"))
    t_repair = time.time()
    inc = incident_of(rec)
    st = rec["status"]
    print_timeline(f"{mode}/{driver}/{fault}", rec, t0)

    # the job: signalled once and checkpointed, or ran to its end; never killed
    await f.job_completed(job)
    end = f.job_end(job)
    assert end is not None, "the job never wrote its end marker: it was killed"
    usr1 = f.job_file("usr1", job).splitlines()
    if checkpoint:
        assert len(usr1) == 1, usr1
        assert "checkpoint written" in f.job_file("ckpt", job)
        assert ledger(rec)["checkpoint"]["finishedAt"] <= ledger(rec)["drain"]["startedAt"]
    else:
        assert usr1 == []
        assert "released" in f.job_file("end", job)
    if f.bridge is not None:  # one signal (the job's trap saw it once, above), no other
        assert len(f.bridge.job_deletes(job)) == (1 if checkpoint else 0), f.bridge.requests()
        assert f.bridge.job_deletes() == f.bridge.job_deletes(job)

    # every step once, in order
    assert_ledger_once(rec, (["checkpoint"] if checkpoint else []) + FLOW_STEPS)

    # the spare: the free one in the bad node's NVLink domain, and only that one
    assert st["spare"] == lay.spare_a
    assert await f.claimed_by(inc) == [lay.spare_a]
    for other in (lay.spare_b, lay.decoy):
        spare_untouched(f, other, f.node_history.of(other))

    # topology on the replacement before the undrain
    spare = await f.core.read_node(lay.spare_a)
    assert spare.metadata.annotations.get(TOPOLOGY) == "default:nvl-a"
    steps = ledger(rec)
    assert steps["annotate-topology"]["finishedAt"] <= steps["undrain"]["startedAt"]
    new_sn = sn if mode == "StatefulSet" else lay.spare_a
    if f.version.startswith("v1.0."):  # v1.0 never copies or pushes topology
        detail = ledger(rec)["annotate-topology"].get("detail", "")
        assert "operatorCopiesTopology=true" not in detail, detail
    else:  # the operator pushed it (topology_str) before healer's topology step passed
        st_new = await f.slurm_state(new_sn)
        assert st_new is not None
        assert st_new.topology == "default:nvl-a", st_new
        detail = ledger(rec)["annotate-topology"].get("detail", "")
        assert re.search(r"checks=[a-z,]*\bregistration,slurm\b", detail), detail

    # the Slurm node serves from the spare, idle and not drained
    pod = await f.pod_of(new_sn)
    assert pod is not None
    assert pod["spec"]["nodeName"] == lay.spare_a
    await f.wait_slurm(new_sn, lambda s: s.base == "IDLE" and s.registered and not s.drain,
                       what="idle and undrained")
    print(f"{new_sn} idle {time.time() - t_repair:+.1f}s after Repair")
    assert await f.sinfo(new_sn) == f"{new_sn} idle"
    if mode == "StatefulSet":  # the same Slurm name moved: one eviction, after the job
        uids = f.pods.of(sn)
        assert [p.host for p in uids] == [bad, lay.spare_a], uids
        assert [p.uid for p in f.pods.deleted()] == [uids[0].uid], f.pods.deleted()
    else:  # a new Slurm node; the bad one keeps healer's drain, its pod untouched
        old = await f.slurm_state(sn)
        assert old is not None
        assert old.drain
        assert old.reason_is_ours or old.reason.startswith("slurm-operator: healer: ")
        assert inc in old.reason
        assert f.pods.deleted() == []
    await assert_no_busy_pod_deleted(f, end)

    # healer drained Slurm once (whoever carried it out: healer, the operator, the bridge),
    # and it went back to service at most once
    assert len(f.healer_drains(sn)) == 1, f.ctld_reasons(sn)
    assert len(f.ctld_returns_to_service(sn)) <= 1, f.ctld_returns_to_service(sn)
    print(f"slurmctld: drains with healer's reason {f.healer_drains(sn)}, back in service "
          f"{f.ctld_returns_to_service(sn)}")
    if f.bridge is not None:  # healer's own POSTs: its one drain, at most one undrain
        posts = f.bridge.updates_of(sn) + (f.bridge.updates_of(new_sn) if new_sn != sn else [])
        assert 1 <= len(posts) <= 2, f.bridge.requests()
    reasons = await f.event_reasons(bad)
    assert all(n == 1 for n in reasons.values()), reasons
    assert reasons["IncidentOpened"] == 1

    done = await f.finish_repair(bad)
    print(f"Repair -> Done in {time.time() - t_repair:.1f}s; total {time.time() - t0:.1f}s")
    assert done["status"]["phase"] == "Done"
    assert await f.sinfo(new_sn) == f"{new_sn} idle"
    back = await f.core.read_node(bad)
    assert back.metadata.labels.get("healer.io/role") == "spare"  # repaired: a spare now
    assert d.terminate() == 0


@pytest.mark.timeout(420)
@pytest.mark.parametrize("operator_version", ["v1.0.0"], indirect=True)
async def test_full_flow_on_operator_v1_0(flows: FlowFactory, operator_version: str) -> None:
    """The same whole flow on slurm-operator v1.0.0 (StatefulSet mode only; v1.0 has no
    DaemonSet mode and never copies topology to pods, which healer must not wait for)."""
    await test_full_flow(flows, "StatefulSet", "slinky", "fatal")


# ------------------------------------------------------------------------------ topology


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["StatefulSet", "DaemonSet"])
async def test_replacement_never_serves_before_its_topology_is_set(
        flows: FlowFactory, mode: str) -> None:
    """The design's promise (DESIGN.md, warm-spare swap): the replacement Node carries its
    topology before Slurm can schedule on it. "Serving" is taken from slurmctld's log (the
    moment the moved Slurm node was undrained or set IDLE) and from the pod runtime (the moment
    the new slurmd registered), the annotation from a watch of the spare Node."""
    f = await flows(mode, "slinky")
    lay = f.lay
    bad = lay.gpus[0]
    sn = await f.slurm_name_on(bad)
    d = f.start_daemon()
    await f.ready(d)
    f.xid(bad)
    rec = await f.wait_phase(bad, "Repair", within=180, also=f.step_done(bad, "mark-repair"))
    assert rec["status"]["spare"] == lay.spare_a
    new_sn = sn if mode == "StatefulSet" else lay.spare_a
    changes = f.ctld_state_changes(sn)
    drained = min(at for at, what in changes if "DRAIN" in what or "healer: " in what)
    # the replacement serves once its slurmd registered and nothing keeps it drained
    # (StatefulSet: the operator undrains / sets IDLE the re-registered node; DaemonSet: a new
    # node registers idle): the later of those records bounds the moment from above
    started = [at for node, up, at in f.slurmd_calls if node == new_sn and up and at > drained]
    cleared = [at for at, what in f.ctld_state_changes(new_sn)
               if re.match(r"state set to (IDLE|ALLOCATED|MIXED)\b", what) and at > drained]
    serving = [max([started[0], *cleared[:1]])] if started else []
    annotated = f.node_history.first(lay.spare_a,
                                     lambda s: s.annotations.get(TOPOLOGY) == "default:nvl-a")
    assert serving, f"no record of {new_sn} returning to service"
    assert annotated is not None
    print(f"{mode}: Slurm node {new_sn} served from {lay.spare_a} "
          f"{annotated.at - serving[0]:+.2f}s before its topology annotation appeared")
    assert annotated.at <= serving[0], (
        f"{new_sn} served from {lay.spare_a} {annotated.at - serving[0]:.2f}s before the "
        "topology annotation was on the Node")


# ------------------------------------------------------------------------ no spare: held


def _alert_expr(name: str) -> str:
    doc = yaml.safe_load((ROOT / "deploy" / "prometheus" / "healer-rules.yaml").read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == name:
                return str(rule["expr"]).strip()
    raise AssertionError(f"no alert {name} in deploy/prometheus/healer-rules.yaml")


@pytest.mark.timeout(300)
async def test_no_spare_holds_for_capacity_alerts_and_resumes_when_a_spare_appears(
        flows: FlowFactory, tmp_path: Path) -> None:
    f = await flows("StatefulSet", "slinky", spares=False)
    lay = f.lay
    late = f"f{f.tid}-late"  # a GPU node that is no spare (yet)
    await f.create_node(late, "nvl-a", "leaf-1", spare=False, pool=False)
    bad = lay.gpus[1]
    sn = await f.slurm_name_on(bad)
    d = f.start_daemon()
    await f.ready(d)
    t0 = time.time()
    f.xid(bad)
    held = await f.wait_phase(bad, "HeldForCapacity", within=120)
    print(f"HeldForCapacity {time.time() - t0:.1f}s after the fault: "
          f"{held['status'].get('blocked')}")

    async def gauge() -> float | None:
        v = await d.metric("healer_held_for_capacity")
        return v if v is not None and v >= 1 else None

    assert await wait_for(gauge, timeout=30, description="healer_held_for_capacity >= 1") == 1
    # held: drained in Slurm with healer's reason, cordoned by healer, nothing moved
    st = await f.slurm_state(sn)
    assert st is not None
    assert st.drain
    assert "healer: " in st.reason
    node = await f.core.read_node(bad)
    assert node.spec.unschedulable
    assert node.metadata.annotations.get("healer.io/cordoned-by") == "healer"
    assert f.pods.deleted() == []

    # the alert's expression, evaluated by a real Prometheus scraping the daemon
    expr = _alert_expr("HealerNodesHeldForCapacity")
    prom = LocalPrometheus(tmp_path / "prometheus", [f"127.0.0.1:{d.port}"],
                           scrape_interval="1s", job="healer")
    t = time.monotonic()
    await asyncio.to_thread(prom.start)
    try:
        firing = await asyncio.to_thread(prom.wait_for_series, expr, 60.0, 0.25)
        print(f"alert expression true in Prometheus after {time.monotonic() - t:.1f}s: "
              f"{[(r['metric'], r['value'][1]) for r in firing]}")
        assert float(firing[0]["value"][1]) >= 1

        # a spare appears (a repaired or new node labelled into the pool): the flow resumes
        t1 = time.time()
        await f.core.patch_node(late, {"metadata": {"labels": {"healer.io/role": "spare"}},
                                       "spec": {"taints": [SPARE_TAINT]}})
        rec = await f.wait_phase(bad, "Repair", within=180,
                                 also=f.step_done(bad, "mark-repair"))
        print(f"spare labelled -> Repair in {time.time() - t1:.1f}s")
        print_timeline("held-for-capacity", rec, t0)
        assert rec["status"]["spare"] == late
        hist = [h["to"] for h in rec["status"]["history"]]
        assert hist[hist.index("HeldForCapacity") + 1] == "Swapping", hist
        names = [s["step"] for s in rec["status"]["ledger"]]
        assert names == FLOW_STEPS, names  # the claim was retried in place, not repeated
        assert await f.claimed_by(incident_of(rec)) == [late]

        async def quiet() -> bool:
            return (await d.metric("healer_held_for_capacity")) == 0 and \
                await asyncio.to_thread(prom.query, expr) == []

        await wait_for(quiet, timeout=60, description="held gauge 0 and the alert quiet")
    finally:
        await asyncio.to_thread(prom.stop)
    pod = await f.pod_of(sn)
    assert pod is not None
    assert pod["spec"]["nodeName"] == late
    assert await f.sinfo(sn) == f"{sn} idle"
    await f.finish_repair(bad)


# ----------------------------------------------------------------------- admin's changes

ADMIN_CASES = [pytest.param("StatefulSet", "slinky", id="StatefulSet-slinky"),
               pytest.param("DaemonSet", "scontrol", id="DaemonSet-scontrol")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("mode", "driver"), ADMIN_CASES)
async def test_admin_drain_is_never_undone(flows: FlowFactory, mode: str, driver: str) -> None:
    """An admin drained the Slurm node (their own reason) while a job runs; a fault opens an
    incident, then clears: healer recovers and undoes only its own changes. The admin's
    drain, its reason and the running job are left exactly as they were."""
    f = await flows(mode, driver)
    bad = f.lay.gpus[1]
    sn = await f.slurm_name_on(bad)
    job = await f.submit(sn, exit_on_usr1=True)
    admin = "admin: bad DIMM, ticket 42"
    await asyncio.to_thread(f.slurm.run, ["scontrol", "update", f"nodename={sn}",
                                          "state=drain", f"reason={admin}"])
    # the operator mirrors Slurm into the pod's conditions: healer reads the drain there
    await f.wait_pod(sn, lambda st: st.drain and st.reason == admin)
    d = f.start_daemon()
    await f.ready(d)
    t0 = time.time()
    f.metric(bad, FAILURE, 1)
    rec = await f.wait_phase(bad, "Draining", within=60, also=f.step_done(bad, "drain"))
    assert "owner=other" in ledger(rec)["drain"].get("detail", ""), ledger(rec)["drain"]
    f.metric(bad, FAILURE, 0)  # the signal clears: Recovered, undo own changes only
    rec = await f.wait_phase(bad, "Done", within=90)
    print_timeline(f"admin drain {mode}/{driver}", rec, t0)
    assert "Recovered" in [h["to"] for h in rec["status"]["history"]]
    st = await f.slurm_state(sn)
    assert st is not None
    assert st.drain
    assert st.reason == admin
    assert st.busy  # the job still runs: never signalled, never killed
    assert await f.job_state(job) == "RUNNING"
    assert f.job_file("usr1", job) == ""
    assert f.ctld_reasons(sn) == [admin]  # nobody else set a reason on it
    samples = [s for at, s in f.slurm_history.of(sn) if at > t0]
    assert samples
    assert all(s.drain and s.reason == admin for s in samples)  # at every moment
    assert not any(s.unschedulable for s in f.node_history.of(bad))  # never cordoned
    # nobody (healer, the operator) changed its state or reason either (slurmctld's log)
    assert [w for at, w in f.ctld_state_changes(sn) if at >= t0] == [], f.ctld_state_changes(sn)
    f.release(job)
    await f.wait_job_end(job, bad, ok=("Done",))
    st = await f.wait_slurm(sn, lambda s: not s.busy, what="idle after the job")
    assert st.drain
    assert st.reason == admin


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("mode", "driver"), ADMIN_CASES)
async def test_admin_cordon_is_never_undone(flows: FlowFactory, mode: str, driver: str) -> None:
    """An admin cordoned the Node (no healer provenance) before a fault: healer still replaces
    the node from a spare and hands it to repair, but never uncordons it, never takes the
    cordon over (no healer taint, no cordoned-by), not even when the repaired node goes back
    to the spare pool."""
    f = await flows(mode, driver)
    lay = f.lay
    bad = lay.gpus[1]
    sn = await f.slurm_name_on(bad)
    await f.core.patch_node(bad, {"spec": {"unschedulable": True}})  # kubectl cordon
    t_cordon = time.time()
    # the operator drains the Slurm node of a cordoned Node with its own reason
    await f.wait_slurm(sn, lambda s: s.drain, what="drained by the operator")
    d = f.start_daemon()
    await f.ready(d)
    t0 = time.time()
    f.xid(bad)
    rec = await f.wait_phase(bad, "Repair", within=180, also=f.step_done(bad, "mark-repair"))
    print_timeline(f"admin cordon {mode}/{driver}", rec, t0)
    steps = ledger(rec)
    assert "owner=other" in steps["cordon"].get("detail", ""), steps["cordon"]
    assert rec["status"]["spare"] == lay.spare_a
    new_sn = sn if mode == "StatefulSet" else lay.spare_a
    assert await f.sinfo(new_sn) == f"{new_sn} idle"
    await f.finish_repair(bad)
    node = await f.core.read_node(bad)
    assert node.spec.unschedulable
    after = [s for s in f.node_history.of(bad) if s.at >= t_cordon]
    assert after
    assert all(s.unschedulable for s in after), [(s.at, s.unschedulable) for s in after]
    assert not any(s.annotations.get("healer.io/cordoned-by") for s in after)
    assert not any(t.startswith("healer.io/remediation=") for s in after for t in s.taints)
    # back in the pool as a spare, but still cordoned: the pool never hands it out
    assert node.metadata.labels.get("healer.io/role") == "spare"
    assert node.metadata.labels.get(TEST_LABEL) == f.tid
