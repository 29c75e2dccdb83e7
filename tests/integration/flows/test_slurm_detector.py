"""Slurm as a detector on the real stack (issue 14 item 1): real Slurm 26.05, SchedMD's real
slurm-operator, the real daemon (its Slurm feed, policies, state machine and drivers).

``test_a_health_check_drain_becomes_an_incident_and_stays_theirs``: the HealthCheckProgram (here:
a test acting as it, with ``scontrol update state=drain reason="NHC: ..."``) drains a node; the
policy's ``slurm:`` rule turns it into an incident whose NodeRemediation (summary, evidence,
status.reason) and Events carry that reason and who set it when. A node healer-drained with
healer's own reason (``healer: ...``) under a rule that matches *any* drain never becomes one.
healer finds the drain is not its own, cordons, hands the node to repair (swap disabled: repair
in place) and, repaired, gives back only its own cordon: at the end the health check's drain is
still there, never touched (slurmctld's log shows no other reason ever set on the node).

``test_on_slinky_the_swap_holds_and_says_why``: with the swap on, the move to the spare holds
(docs/adr/0006: evicting the slurmd pod would delete their drain); the NodeRemediation's
status.reason and one ``StepHeld`` Warning Event say why, naming their reason; the pod stays,
the drain stays. When the owner undrains, the swap goes on to the spare, and the finding
does not follow the Slurm node there.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.integration.flows.checks import print_timeline
from tests.integration.flows.conftest import FlowFactory, flow_policy
from tests.integration.waiting import wait_for

NHC = "NHC: GPU 3 ECC double bit errors (check_nv_healthmon)"
OURS = "healer: drained by an earlier incident [f-old-20260101-000000]"
#: Slurm's own view as a detector: NHC's drains fail a node, any other drain degrades it
RULES = [{"name": "nhc", "severity": "failed",
          "slurm": {"states": ["DRAIN", "FAIL"], "reason": "^NHC:"}},
         {"name": "any-drain", "severity": "degrading", "slurm": {"states": ["DRAIN"]}}]

CASES = [pytest.param("StatefulSet", "slinky", id="StatefulSet-slinky"),
         pytest.param("DaemonSet", "scontrol", id="DaemonSet-scontrol")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("mode", "driver"), CASES)
async def test_a_health_check_drain_becomes_an_incident_and_stays_theirs(
        flows: FlowFactory, mode: str, driver: str) -> None:
    f = await flows(mode, driver, spares=False)
    bad, ours = f.lay.gpus[1], f.lay.gpus[2]
    (f.policies / "policy.yaml").write_text(
        flow_policy(f.tid, first_rules=RULES, swap={"enabled": False}))
    sn, sn_ours = await f.slurm_name_on(bad), await f.slurm_name_on(ours)
    # a drain with healer's own reason (left by an earlier incident): never a signal
    await asyncio.to_thread(f.slurm.run, ["scontrol", "update", f"nodename={sn_ours}",
                                          "state=drain", f"reason={OURS}"])
    d = f.start_daemon()
    await f.ready(d)
    t0 = time.time()
    await asyncio.to_thread(f.slurm.run, ["scontrol", "update", f"nodename={sn}",
                                          "state=drain", f"reason={NHC}"])
    theirs = await f.wait_slurm(sn, lambda s: s.drain and s.reason == NHC, what="drained")
    seen = time.time()  # Slurm showed their drain by now
    assert theirs.reason_user
    assert theirs.reason_time

    rec = await f.wait_phase(bad, "Repair", within=120, also=f.step_done(bad, "mark-repair"))
    print_timeline(f"slurm detector {mode}/{driver}", rec, t0)
    incident = rec["spec"]["incident"]
    assert set(incident["rules"]) == {"nhc", "any-drain"}, incident
    who = f"(by {theirs.reason_user} at {theirs.reason_time})"
    assert incident["summary"].startswith(f'Slurm DRAIN: "{NHC}" {who}'), incident
    slurm_evidence = [e for e in incident["evidence"] if e["kind"] == "slurm"]
    assert slurm_evidence, incident
    detail = slurm_evidence[-1]["detail"]
    assert (detail["reason"], detail["user"], detail["reasonTime"]) == (
        NHC, theirs.reason_user, theirs.reason_time)
    events = {e["reason"]: e["note"] for e in await f.events(bad)}
    assert NHC in events["IncidentOpened"], events
    assert who in events["IncidentOpened"], events
    drain = next(s for s in rec["status"]["ledger"] if s["step"] == "drain")
    assert "owner=other" in drain.get("detail", ""), drain

    # healer's own drain: read by the same listings, never an incident
    assert await f.remediations(ours) == []

    done = await f.finish_repair(bad)
    assert done["status"]["phase"] == "Done"
    undrain = next(s for s in done["status"]["ledger"] if s["step"] == "undrain")
    assert "undrain=not-ours" in undrain.get("detail", ""), undrain
    st = await f.slurm_state(sn)
    assert st is not None
    assert st.drain
    assert st.reason == NHC
    assert f.ctld_reasons(sn) == [NHC]  # nobody else ever set a reason on it
    samples = [s for at, s in f.slurm_history.of(sn) if at > seen]
    assert samples
    assert all(s.drain and s.reason == NHC for s in samples)  # at every moment since
    assert not (await f.core.read_node(bad)).spec.unschedulable  # healer's cordon given back
    assert await f.remediations(ours) == []
    assert len(await f.remediations(bad)) == 1
    assert d.terminate() == 0



@pytest.mark.timeout(300)
async def test_on_slinky_the_swap_holds_and_says_why(flows: FlowFactory) -> None:
    f = await flows("StatefulSet", "slinky")
    bad = f.lay.gpus[1]
    (f.policies / "policy.yaml").write_text(flow_policy(f.tid, first_rules=RULES))
    sn = await f.slurm_name_on(bad)
    d = f.start_daemon()
    await f.ready(d)
    t0 = time.time()
    await asyncio.to_thread(f.slurm.run, ["scontrol", "update", f"nodename={sn}",
                                          "state=drain", f"reason={NHC}"])

    async def held() -> dict[str, Any] | None:
        items = await f.remediations(bad)
        st = (items[-1].get("status") or {}) if items else {}
        return items[-1] if st.get("phase") == "Swapping" and str(st.get("reason", "")) \
            .startswith("move-workload: ") else None

    rec: dict[str, Any] | None = await wait_for(held, timeout=120,
                                                description="the swap held, saying why")
    assert rec is not None
    assert "drained or down by someone else (reason 'NHC: " in rec["status"]["reason"]
    move = next(s for s in rec["status"]["ledger"] if s["step"] == "move-workload")
    assert "finishedAt" not in move
    assert NHC in move["error"]  # status.reason is cut at 200 characters; the step keeps it
    assert "healer holds until the owner clears it" in move["error"]

    async def event() -> str | None:
        notes = [e["note"] for e in await f.events(bad) if e["reason"] == "StepHeld"]
        return notes[0] if notes else None

    note: str | None = await wait_for(event, timeout=30, description="the StepHeld Event")
    assert note is not None
    assert NHC in note
    assert (await f.event_reasons(bad))["StepHeld"] == 1
    pod = await f.pod_of(sn)
    assert pod is not None
    assert pod["spec"]["nodeName"] == bad  # not moved
    st = await f.slurm_state(sn)
    assert st is not None
    assert st.drain
    assert st.reason == NHC

    # the owner is done with it: the swap goes on, and nothing follows the name to the spare
    await asyncio.to_thread(f.slurm.run, ["scontrol", "update", f"nodename={sn}",
                                          "state=undrain"])
    rec = await f.wait_phase(bad, "Repair", within=180, also=f.step_done(bad, "mark-repair"))
    print_timeline("slurm detector hold", rec, t0)
    spare = rec["status"]["spare"]
    await f.wait_slurm(sn, lambda s: s.base == "IDLE" and s.registered and not s.drain,
                       what="idle and undrained on the replacement")
    assert await f.remediations(spare) == []
    assert f.ctld_reasons(sn)[0] == NHC
    assert len(await f.remediations(bad)) == 1
    await f.finish_repair(bad)
    assert d.terminate() == 0
