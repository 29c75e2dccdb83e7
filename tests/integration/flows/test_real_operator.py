"""The two fleet-safety failures that only SchedMD's real operator showed, as flows on it.

* ``test_four_swaps_in_one_nodeset_each_land_on_their_own_spare``: four XIDs in one NodeSet,
  four remediations at once. The real operator adds no affinity: a recreated slurmd pod can
  land on any uncordoned Node that fits. healer claims spares closed and opens one per NodeSet
  at a time, at the moment it evicts; so every moved Slurm node ends on the spare claimed for
  it, in its NVLink domain, and no remediation escalates because of another's move.
* ``test_an_admins_drain_survives_an_xid_on_its_node``: an admin drained a Slurm node
  (``maint: bios update``), then its Node reported XID 79. Moving the pod would run its preStop,
  which deletes the Slurm node record and with it the admin's drain. healer holds the move
  (ADR 0006): the reason stays, no pod is deleted, until the admin clears the drain; then the
  swap completes.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.integration.flows.checks import incident_of, ledger, print_timeline
from tests.integration.flows.conftest import DOMAIN, Flow, FlowFactory
from tests.integration.waiting import wait_for


@pytest.mark.timeout(480)
async def test_four_swaps_in_one_nodeset_each_land_on_their_own_spare(
        flows: FlowFactory) -> None:
    f = await flows("StatefulSet", "slinky")
    lay = f.lay
    spare_a2, spare_b2 = f"f{f.tid}-sa2", f"f{f.tid}-sb2"
    await f.create_node(spare_a2, "nvl-a", "leaf-1", spare=True)
    await f.create_node(spare_b2, "nvl-b", "leaf-2", spare=True)
    names = {g: await f.slurm_name_on(g) for g in lay.gpus}
    job = await f.submit(names[lay.gpus[0]], exit_on_usr1=False)
    d = f.start_daemon()
    await f.ready(d)
    t0 = time.time()
    for g in lay.gpus:  # four fatal XIDs at once
        f.xid(g)
    await f.wait_slurm(names[lay.gpus[0]], lambda s: s.drain and s.busy, within=120,
                       remediated=lay.gpus[0], what="drained while its job runs")
    f.release(job)
    recs = {}
    for g in lay.gpus:
        recs[g] = await f.wait_phase(g, "Repair", within=300, also=f.step_done(g, "mark-repair"))
    for g, rec in recs.items():
        print_timeline(f"concurrent swap of {g}", rec, t0)
    domain = {n: ("nvl-a" if i < 2 else "nvl-b") for i, n in enumerate(lay.gpus)}
    spare_domain = {lay.spare_a: "nvl-a", spare_a2: "nvl-a", lay.spare_b: "nvl-b",
                    spare_b2: "nvl-b"}
    spares = {g: rec["status"]["spare"] for g, rec in recs.items()}
    assert len(set(spares.values())) == 4, spares  # no spare claimed twice
    for g, spare in spares.items():
        assert spare_domain.get(spare) == domain[g], (g, spare, spares)
        inc = incident_of(recs[g])
        assert await f.claimed_by(inc) == [spare]
        assert "Escalated" not in [h["to"] for h in recs[g]["status"]["history"]]
        # the Slurm node moved to the spare claimed for it, and serves there
        sn = names[g]
        pod = await f.pod_of(sn)
        assert pod is not None
        assert pod["spec"]["nodeName"] == spare, (sn, pod["spec"]["nodeName"], spares)
        assert [p.host for p in f.pods.of(sn)] == [g, spare], f.pods.of(sn)
        await f.wait_slurm(sn, lambda s: s.base == "IDLE" and s.registered and not s.drain,
                           what="idle and undrained on its spare")
        node = await f.core.read_node(spare)
        assert node.metadata.labels.get(DOMAIN) == domain[g]
    await f.job_completed(job)
    assert f.job_end(job) is not None, "the job was killed"
    # the decoy (another domain) was never claimed
    assert not any(s.annotations.get("healer.io/claimed-by")
                   for s in f.node_history.of(lay.decoy))
    for g in lay.gpus:
        await f.finish_repair(g)
    assert d.terminate() == 0


@pytest.mark.timeout(420)
async def test_an_admins_drain_survives_an_xid_on_its_node(flows: FlowFactory) -> None:
    f = await flows("StatefulSet", "slinky")
    lay = f.lay
    bad = lay.gpus[1]
    sn = await f.slurm_name_on(bad)
    admin = "maint: bios update"
    await asyncio.to_thread(f.slurm.run, ["scontrol", "update", f"nodename={sn}",
                                          "state=drain", f"reason={admin}"])
    await f.wait_pod(sn, lambda st: st.drain and st.reason == admin, within=90)
    d = f.start_daemon()
    await f.ready(d)
    t0 = time.time()
    f.xid(bad)
    await f.wait_phase(bad, "Swapping", within=120)

    # healer holds: it says so, and the operator re-lists Slurm (every 30 s) at least twice
    # more while it holds; nothing changes the admin's drain meanwhile
    async def holding() -> bool:
        return "drained or down by someone else" in d.tail(200)

    await wait_for(holding, timeout=120, description="healer's hold on the foreign drain")
    t_hold = time.time()

    def relists() -> int:  # the operator's (no X-SLURM-USER-NAME), as slurmrestd logged them
        return sum(1 for r in f.slurm.restd_requests() if not r.user_name
                   and (r.method, r.path) == ("GET", "/slurm/v0.0.44/nodes/"))

    seen = relists()

    async def two_relists() -> bool:
        return relists() >= seen + 2

    await wait_for(two_relists, timeout=120, description="two operator re-lists of Slurm")
    assert await f.phase(bad) == "Swapping", await f.diagnose(bad)
    st = await f.slurm_state(sn)
    assert st is not None
    assert st.drain, st
    assert st.reason == admin, st
    assert f.pods.deleted() == []  # the pod (and its Slurm record) never moved
    # and at every moment the recorder saw (it samples scontrol as often as the machine lets
    # it; the state read above is the direct check)
    samples = [s for at, s in f.slurm_history.of(sn) if at >= t_hold]
    assert all(s.drain and s.reason == admin for s in samples), samples
    rec = await f.record(bad)
    assert "move-workload" not in {s["step"] for s in rec["status"].get("ledger") or []
                          if s.get("finishedAt")}

    # the admin is done: the swap goes on, and the node ends on the spare
    await asyncio.to_thread(f.slurm.run, ["scontrol", "update", f"nodename={sn}",
                                          "state=undrain"])
    rec = await f.wait_phase(bad, "Repair", within=180, also=f.step_done(bad, "mark-repair"))
    print_timeline("admin drain then XID", rec, t0)
    assert rec["status"]["spare"] == lay.spare_a
    assert "move-workload" in ledger(rec)
    pod = await f.pod_of(sn)
    assert pod is not None
    assert pod["spec"]["nodeName"] == lay.spare_a
    await f.finish_repair(bad)
    assert d.terminate() == 0


# --------------------------------------------------------------- NodeSet shapes users run


@pytest.mark.timeout(420)
async def test_host_network_nodeset_swaps_to_a_slurm_node_named_after_the_spare(
        flows: FlowFactory) -> None:
    """hostNetwork: the Slurm node name is the Kubernetes Node's name, so the swap brings up a
    new Slurm node named after the spare; the old record went with the pod's preStop."""
    f = await flows("StatefulSet", "slinky", nodeset={"host_network": True})
    lay = f.lay
    bad = lay.gpus[1]
    sn = await f.slurm_name_on(bad)
    assert sn == bad
    job = await f.submit(sn, exit_on_usr1=False)
    d = f.start_daemon()
    await f.ready(d)
    t0 = time.time()
    f.xid(bad)
    await f.wait_slurm(sn, lambda s: s.drain and s.busy, within=120, remediated=bad,
                       what="drained while its job runs")
    f.release(job)
    rec = await f.wait_phase(bad, "Repair", within=240, also=f.step_done(bad, "mark-repair"))
    print_timeline("hostNetwork swap", rec, t0)
    assert rec["status"]["spare"] == lay.spare_a
    await f.wait_slurm(lay.spare_a, lambda s: s.base == "IDLE" and s.registered and not s.drain,
                       what="the new Slurm node idle and undrained")
    assert await f.slurm_state(sn) is None  # deleted by the preStop, never re-registered
    await f.job_completed(job)
    assert f.job_end(job) is not None, "the job was killed"
    await f.finish_repair(bad)
    assert d.terminate() == 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", [
    pytest.param({"type": "OnDelete"}, id="OnDelete"),
])
async def test_a_strategy_that_would_leave_the_node_drained_is_refused_up_front(
        flows: FlowFactory, strategy: dict[str, object]) -> None:
    """With OnDelete the real operator never undrains an uncordoned node: healer refuses
    before it changes anything — Escalated with the reason, an Event, nothing cordoned."""
    f = await flows("StatefulSet", "slinky", nodeset={"update_strategy": strategy})
    await _refused(f, "OnDelete")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("operator_version", ["v1.0.0"], indirect=True)
async def test_rolling_update_without_a_block_is_refused_on_operator_v1_0(
        flows: FlowFactory, operator_version: str) -> None:
    """v1.0 panics on every reconcile of a RollingUpdate NodeSet without a rollingUpdate
    block (nothing would ever drain): healer refuses up front."""
    f = await flows("StatefulSet", "slinky")
    await f.co.patch_namespaced_custom_object(  # drop the block (JSON merge patch)
        "slinky.slurm.net", "v1beta1", f.namespace, "nodesets", f.nodeset,
        {"spec": {"updateStrategy": {"rollingUpdate": None}}},
        _content_type="application/merge-patch+json")
    await _refused(f, "rollingUpdate")


async def _refused(f: Flow, why: str) -> None:
    bad = f.lay.gpus[1]
    sn = await f.slurm_name_on(bad)
    d = f.start_daemon()
    await f.ready(d)
    f.xid(bad)
    rec = await f.wait_phase(bad, "Escalated", within=120)
    text = " ".join(f"{s.get('error', '')} {s.get('detail', '')}"
                    for s in rec["status"].get("ledger") or [])
    assert why in text, rec["status"]
    node = await f.core.read_node(bad)
    assert not node.spec.unschedulable
    assert "nodeset.slinky.slurm.net/node-cordon-reason" not in (node.metadata.annotations or {})
    st = await f.slurm_state(sn)
    assert st is not None
    assert not st.drain
    assert (await f.event_reasons(bad))["Escalated"] == 1
    assert d.terminate() == 0


@pytest.mark.timeout(420)
async def test_rolling_update_without_a_block_works_on_operator_v1_1(flows: FlowFactory) -> None:
    f = await flows("StatefulSet", "slinky", nodeset={"update_strategy": {"type": "RollingUpdate"}})
    bad = f.lay.gpus[1]
    sn = await f.slurm_name_on(bad)
    d = f.start_daemon()
    await f.ready(d)
    f.xid(bad)
    rec = await f.wait_phase(bad, "Repair", within=240, also=f.step_done(bad, "mark-repair"))
    assert rec["status"]["spare"] == f.lay.spare_a
    await f.wait_slurm(sn, lambda s: s.base == "IDLE" and s.registered and not s.drain,
                       what="idle and undrained on the spare")
    await f.finish_repair(bad)
    assert d.terminate() == 0


# ------------------------------------------------------ the NodeSet changes under healer


@pytest.mark.timeout(420)
async def test_scale_in_while_a_remediation_waits_for_its_job(flows: FlowFactory) -> None:
    """The NodeSet is scaled in while healer waits in Draining for a job. The operator picks
    the cordoned pod first, waits for the drain, deletes it. No job is killed, no spare is
    claimed twice, and the remediation ends in a defined phase with the reason."""
    f = await flows("StatefulSet", "slinky")
    lay = f.lay
    bad = lay.gpus[1]
    sn = await f.slurm_name_on(bad)
    job = await f.submit(sn, exit_on_usr1=False)
    d = f.start_daemon()
    await f.ready(d)
    t0 = time.time()
    f.xid(bad)
    await f.wait_slurm(sn, lambda s: s.drain and s.busy, within=120, remediated=bad,
                       what="drained while its job runs")
    await f.co.patch_namespaced_custom_object(
        "slinky.slurm.net", "v1beta1", f.namespace, "nodesets", f.nodeset,
        {"spec": {"replicas": len(lay.gpus) - 1}},
        _content_type="application/merge-patch+json")
    f.release(job)
    end = await f.wait_job_end(job, bad, ok=("Escalated", "Done", "Cancelled"))
    await f.job_completed(job)
    assert "released" in f.job_file("end", job)

    async def settled() -> str | None:
        phase = await f.phase(bad)
        return phase if phase in ("Escalated", "Done", "Cancelled", "Repair") else None

    phase = await wait_for(settled, timeout=240, description=f"{bad}'s remediation settled")
    rec = await f.record(bad)
    print_timeline(f"scale-in ({phase})", rec, t0)
    inc = incident_of(rec)
    assert len(await f.claimed_by(inc)) <= 1
    for p in f.pods.deleted():  # deleted only once idle: after the job ended
        assert p.deleted_at is not None
        assert p.deleted_at >= end - 1.0, (p, end)
    if phase == "Escalated":  # with the reason, wherever the flow noticed it
        text = json.dumps(rec["status"])
        assert "scaled in" in text or "recreated it elsewhere" in text, \
            rec["status"].get("conditions")
    # no claimed spare is left open for the NodeSet's next pod to land on
    spare = rec["status"].get("spare")
    if spare and phase == "Escalated":
        node = await f.core.read_node(spare)
        pod_there = [p for p in await f.live_pods() if p["spec"].get("nodeName") == spare]
        assert pod_there or any(t.key == "healer.io/spare" for t in node.spec.taints or [])


@pytest.mark.timeout(480)
async def test_rolling_update_while_a_remediation_waits_for_its_job(flows: FlowFactory) -> None:
    """The NodeSet's template changes while healer waits in Draining: the operator replaces
    its pods, the cordoned one first, each only once drained, and a recreated pod may land on
    any Node that fits at that moment. Either it waits unscheduled and lands on the spare
    healer opens for it (Repair), or it landed elsewhere (Escalated, saying so, the spare
    closed again). No job is killed, no spare is claimed twice, nothing is left open."""
    f = await flows("StatefulSet", "slinky")
    lay = f.lay
    bad = lay.gpus[1]
    sn = await f.slurm_name_on(bad)
    job = await f.submit(sn, exit_on_usr1=False)
    d = f.start_daemon()
    await f.ready(d)
    t0 = time.time()
    f.xid(bad)
    await f.wait_slurm(sn, lambda s: s.drain and s.busy, within=120, remediated=bad,
                       what="drained while its job runs")
    await f.co.patch_namespaced_custom_object(  # a new revision: a rolling update
        "slinky.slurm.net", "v1beta1", f.namespace, "nodesets", f.nodeset,
        {"spec": {"template": {"metadata": {"labels": {"healer-test/revision": "2"}}}}},
        _content_type="application/merge-patch+json")
    f.release(job)
    end = await f.wait_job_end(job, bad, ok=("Escalated",))
    await f.job_completed(job)
    assert "released" in f.job_file("end", job)

    async def settled() -> str | None:
        phase = await f.phase(bad)
        if phase == "Repair" and await f.step_done(bad, "mark-repair")():
            return phase
        return phase if phase in ("Escalated", "Done", "Cancelled") else None

    phase = await wait_for(settled, timeout=300, description=f"{bad}'s remediation settled")
    rec = await f.record(bad)
    print_timeline(f"rolling update during a remediation ({phase})", rec, t0)
    assert await f.claimed_by(incident_of(rec)) == [lay.spare_a]
    for p in f.pods.deleted():  # the operator deleted pods only once idle
        if p.slurm == sn:
            assert p.deleted_at is not None
            assert p.deleted_at >= end - 1.0, (p, end)
    if phase == "Repair":
        pod = await f.pod_of(sn)
        assert pod is not None
        assert pod["spec"]["nodeName"] == lay.spare_a
        await f.wait_slurm(sn, lambda s: s.base == "IDLE" and s.registered and not s.drain,
                           what="idle and undrained on the spare")
        await f.finish_repair(bad)
    else:
        assert phase == "Escalated", phase
        assert "recreated it elsewhere" in json.dumps(rec["status"])
        node = await f.core.read_node(lay.spare_a)
        pod_there = [p for p in await f.live_pods() if p["spec"].get("nodeName") == lay.spare_a]
        assert pod_there or any(t.key == "healer.io/spare" for t in node.spec.taints or [])
    assert d.terminate() == 0
