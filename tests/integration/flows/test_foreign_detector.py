"""A foreign detector end to end on the real stack (issue 12): a node condition that healer's
agent never writes (``GPUProblem``, reason ``NVLinkDown``, published NPD-style by another field
manager with a heartbeat) drives a whole remediation on SchedMD's real operator; the same
condition with a dead detector's heartbeat is stale and takes nothing.

* ``test_a_foreign_condition_drives_a_full_remediation``: the policy's condition rule matches
  it; drain, cordon, claim, move, topology, undrain, repair, Done; the bad node's own domain
  has no free spare, so the nearest one (another NVLink domain on the same leaf switch) is
  taken and reported: ``status.sparePlacement``, one ``SpareFromOtherDomain`` Event,
  ``healer status``. The condition stays the detector's: healer never writes it.
* ``test_the_same_condition_stale_takes_nothing``: its lastHeartbeatTime is 10 minutes old
  (window 60 s): ``healer_telemetry_stale_nodes{source="condition/GPUProblem"}`` says so, no
  NodeRemediation, no cordon, no drain. Then the detector comes back (a fresh heartbeat) and the
  very same condition opens the remediation: the stale one held only because it was stale.
* ``test_require_same_domain_holds_for_capacity_until_the_domain_has_a_spare``: with
  ``swap.requireSameDomain`` and no free spare in the node's domain (other domains have some),
  HeldForCapacity with the reason in ``status.reason`` and ``healer status``; the other
  domains' spares are never claimed; a spare joining the domain resumes the swap onto it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from healer.status import status as healer_status
from tests.integration.flows.checks import (
    FLOW_STEPS,
    assert_ledger_once,
    incident_of,
    print_timeline,
    spare_untouched,
)
from tests.integration.flows.conftest import Flow, FlowFactory, flow_policy
from tests.integration.waiting import wait_for

DETECTOR = "node-problem-detector"  # the field manager: not healer, not healer's agent
RULE = {"name": "npd-gpu-problem", "severity": "failed",
        "condition": {"type": "GPUProblem", "status": ["True"], "reason": "^NVLinkDown$",
                      "staleAfter": "60s"}}


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _with_rule(f: Flow) -> None:
    """The flow's policy plus a rule for the foreign detector's condition."""
    (f.policies / "policy.yaml").write_text(flow_policy(f.tid, first_rules=[RULE]))


async def publish(f: Flow, node: str, *, since: float, heartbeat: float) -> None:
    """What NPD's k8s exporter does: set the condition on the Node's status, as itself."""
    cond = {"type": "GPUProblem", "status": "True", "reason": "NVLinkDown",
            "message": "NVLink 3 down on GPU 5 (custom plugin check_nvlink.sh)",
            "lastTransitionTime": _rfc3339(since), "lastHeartbeatTime": _rfc3339(heartbeat)}
    await f.core.patch_node_status(  # type: ignore[call-arg]
        node, {"status": {"conditions": [cond]}},
        _content_type="application/strategic-merge-patch+json", field_manager=DETECTOR)


@contextlib.asynccontextmanager
async def heartbeating(f: Flow, node: str, since: float, every: float = 5.0
                       ) -> AsyncIterator[None]:
    """A live detector: re-publishes the unchanged condition every ``every`` seconds."""
    async def beat() -> None:
        while True:
            await publish(f, node, since=since, heartbeat=time.time())
            await asyncio.sleep(every)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _condition_managers(f: Flow, node: str) -> set[str]:
    """The field managers that own the GPUProblem condition on ``node``."""
    raw = await f.core.read_node(node)
    out = set()
    for mf in raw.metadata.managed_fields or []:
        fields: dict[str, Any] = mf.fields_v1 or {}
        conds = (fields.get("f:status") or {}).get("f:conditions") or {}
        if any('"GPUProblem"' in k for k in conds):
            out.add(mf.manager)
    return out


@pytest.mark.timeout(420)
async def test_a_foreign_condition_drives_a_full_remediation(
        flows: FlowFactory, capsys: pytest.CaptureFixture[str]) -> None:
    f = await flows("StatefulSet", "slinky")
    lay = f.lay
    bad = lay.gpus[1]  # nvl-a, leaf-1
    _with_rule(f)
    # the bad node's own domain has no free spare: spare-a leaves the pool before healer runs
    await f.core.patch_node(lay.spare_a, {"metadata": {"labels": {"healer.io/role": None}}})
    sn = await f.slurm_name_on(bad)
    d = f.start_daemon()
    print(f"daemon ready after {await f.ready(d):.1f}s")
    t0 = time.time()
    async with heartbeating(f, bad, since=t0):
        rec = await f.wait_phase(bad, "Repair", within=240,
                                 also=f.step_done(bad, "mark-repair"))
    print_timeline("foreign-detector", rec, t0)
    st, inc = rec["status"], incident_of(rec)

    # the foreign condition opened it, through the policy's condition rule
    incident = rec["spec"]["incident"]
    assert incident["rules"] == ["npd-gpu-problem"], incident
    assert "condition GPUProblem=True (NVLinkDown)" in incident["summary"], incident
    assert await _condition_managers(f, bad) == {DETECTOR}  # healer never wrote it
    assert_ledger_once(rec, FLOW_STEPS)

    # the nearest spare, in another NVLink domain (same leaf switch), taken and reported
    assert st["spare"] == lay.decoy
    assert st["sparePlacement"] == {"level": "tier-0", "sameDomain": False,
                                    "nodeDomain": "nvl-a", "spareDomain": "nvl-c",
                                    "switch": "leaf-1"}
    assert await f.claimed_by(inc) == [lay.decoy]
    spare_untouched(f, lay.spare_b, f.node_history.of(lay.spare_b))
    reasons = await f.event_reasons(bad)
    assert reasons["SpareFromOtherDomain"] == 1, reasons
    far = [e for e in await f.events(bad) if e.get("reason") == "SpareFromOtherDomain"]
    assert far[0]["type"] == "Warning"
    assert "NVLink domain nvl-c" in far[0]["note"]
    assert f"{bad} in nvl-a" in far[0]["note"]
    await f.wait_slurm(sn, lambda s: s.base == "IDLE" and s.registered and not s.drain,
                       what="idle and undrained on the replacement")

    capsys.readouterr()
    assert await healer_status(str(f.stack.kubeconfig)) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if inc[:38] in x)
    assert f"{lay.decoy} (tier-0, nvl-c)" in line, line

    done = await f.finish_repair(bad)
    assert done["status"]["phase"] == "Done"
    assert d.terminate() == 0


@pytest.mark.timeout(300)
async def test_the_same_condition_stale_takes_nothing(flows: FlowFactory) -> None:
    f = await flows("StatefulSet", "slinky")
    bad = f.lay.gpus[1]
    _with_rule(f)
    sn = await f.slurm_name_on(bad)
    now = time.time()
    # the detector died 10 minutes ago; its last word (GPUProblem=True) is still on the Node
    await publish(f, bad, since=now - 1200, heartbeat=now - 600)
    d = f.start_daemon()
    await f.ready(d)

    async def stale() -> float | None:
        v = await d.metric("healer_telemetry_stale_nodes", source="condition/GPUProblem")
        return v if v is not None and v >= 1 else None

    assert await wait_for(stale, timeout=60, description="the condition reported stale") >= 1
    assert "node condition stale" in d.tail(400)
    # evaluated and found stale: nothing opened, nothing taken
    assert await f.remediations(bad) == []
    node = await f.core.read_node(bad)
    assert not node.spec.unschedulable
    state = await f.slurm_state(sn)
    assert state is not None
    assert not state.drain

    # the detector comes back: the same condition, fresh, does open the remediation
    t1 = time.time()
    await publish(f, bad, since=now - 1200, heartbeat=t1)
    rec = await f.wait_phase(bad, "Draining", "Cordoned", "Swapping", "Annotating",
                             "Undraining", "Repair", within=60)
    print(f"fresh heartbeat -> {rec['status']['phase']} in {time.time() - t1:.1f}s")
    assert rec["spec"]["incident"]["rules"] == ["npd-gpu-problem"]

    async def fresh() -> bool:
        return (await d.metric("healer_telemetry_stale_nodes",
                               source="condition/GPUProblem")) in (None, 0.0)

    await wait_for(fresh, timeout=30, description="the stale gauge back to 0")


@pytest.mark.timeout(300)
async def test_require_same_domain_holds_for_capacity_until_the_domain_has_a_spare(
        flows: FlowFactory, capsys: pytest.CaptureFixture[str]) -> None:
    f = await flows("StatefulSet", "slinky")
    lay = f.lay
    bad = lay.gpus[1]  # nvl-a
    (f.policies / "policy.yaml").write_text(
        flow_policy(f.tid, swap={"enabled": True, "requireSameDomain": True}))
    # nvl-a has no free spare; nvl-b's and nvl-c's (the latter on the bad node's leaf) are free
    await f.core.patch_node(lay.spare_a, {"metadata": {"labels": {"healer.io/role": None}}})
    d = f.start_daemon()
    await f.ready(d)
    f.xid(bad)
    held = await f.wait_phase(bad, "HeldForCapacity", within=120)
    why = ("held for capacity: no free warm spare in NVLink domain nvl-a "
           "(swap.requireSameDomain: spares in other domains are not taken)")
    assert held["status"]["reason"] == why
    capsys.readouterr()
    assert await healer_status(str(f.stack.kubeconfig)) == 0
    line = next(x for x in capsys.readouterr().out.splitlines()
                if incident_of(held)[:38] in x)
    assert why in line, line
    for other in (lay.spare_b, lay.decoy):  # never claimed, never opened
        spare_untouched(f, other, f.node_history.of(other))

    # a spare joins nvl-a: the held node takes it, and only it
    await f.core.patch_node(lay.spare_a, {"metadata": {"labels": {"healer.io/role": "spare"}}})
    rec = await f.wait_phase(bad, "Repair", within=180, also=f.step_done(bad, "mark-repair"))
    assert rec["status"]["spare"] == lay.spare_a
    assert rec["status"]["sparePlacement"]["level"] == "domain"
    assert await f.claimed_by(incident_of(rec)) == [lay.spare_a]
    assert (await f.event_reasons(bad))["SpareFromOtherDomain"] == 0
    assert d.terminate() == 0
