"""Node lifecycle seen at once (issue 20 item 0), on the real stack: a warm spare Node *created*
while a remediation is HeldForCapacity wakes it on that Node's own events (created, then Ready
once kwok sets it), not on the 300 s retry backstop.

Before the fix the created spare was only found by the backstop (284 s after it appeared in
one run); here the wait's deadline is below the backstop, and the claim step shows exactly one
retry in place: the one the new spare's event caused.
"""

from __future__ import annotations

import time

import pytest

from healer.core.intervals import HELD_RETRY
from healer_dev.devstack.kwok import fake_node
from tests.integration.flows.checks import incident_of, print_timeline
from tests.integration.flows.conftest import (
    DOMAIN,
    GPU_CAPACITY,
    SPARE_TAINT,
    TEST_LABEL,
    TIER0,
    TIER1,
    FlowFactory,
)


@pytest.mark.timeout(420)
async def test_a_spare_created_while_a_node_is_held_wakes_it(flows: FlowFactory) -> None:
    f = await flows("StatefulSet", "slinky", spares=False)
    bad = f.lay.gpus[1]  # nvl-a
    d = f.start_daemon()
    await f.ready(d)
    t0 = time.time()
    f.xid(bad)
    held = await f.wait_phase(bad, "HeldForCapacity", within=120)
    claims_before = next(s for s in held["status"]["ledger"] if s["step"] == "claim-spare")

    # a brand-new Node joins as a warm spare (a cloud's autoscaler, a repaired machine)
    name = f"f{f.tid}-new"
    t1 = time.time()
    f.nodes.append(name)
    f.node_history.names.add(name)
    await f.core.create_node(fake_node(name, labels={  # type: ignore[arg-type]
        "nvidia.com/gpu.present": "true", TEST_LABEL: f.tid, DOMAIN: "nvl-a", TIER0: "leaf-1",
        TIER1: "spine-1", "healer.io/role": "spare"}, taints=[SPARE_TAINT],
        capacity=GPU_CAPACITY))
    rec = await f.wait_phase(bad, "Repair", within=HELD_RETRY - 60,
                             also=f.step_done(bad, "mark-repair"))
    print_timeline("spare created while held", rec, t0)
    print(f"spare created -> Repair in {time.time() - t1:.1f}s (backstop {HELD_RETRY:.0f}s)")
    st = rec["status"]
    assert st["spare"] == name
    claim = next(s for s in st["ledger"] if s["step"] == "claim-spare")
    assert claim["attempts"] == claims_before["attempts"] + 1, (claims_before, claim)
    assert await f.claimed_by(incident_of(rec)) == [name]
