"""A replacement Slurm refused is never undrained (issue 21 item 6), as a whole flow on the real
stack: Slurm 26.05 and its slurmrestd, SchedMD's real operator, the real daemon.

The spares carry no topology labels, so the claim writes no topology annotation on the spare;
the slurmd pods pass ``Topology=<the pod's annotation>`` in their ``--conf`` as slurm-operator
1.2's do (the pod runtime's ``conf_topology``): the replacement's is empty, Slurm reads the next
item as the topology, refuses the registration and drains the node (``INVALID_REG``,
SlinkyProject/slurm-operator#261). healer moves the slurmd (the bad node was drained and its job
done), then its topology step reads Slurm's view of the replacement: the step fails with Slurm's
reason, the remediation escalates with that reason in an Event, and healer never undrains the
replacement: it stays drained by Slurm.
"""

from __future__ import annotations

import pytest

from tests.integration.flows.checks import ledger
from tests.integration.flows.conftest import DOMAIN, TIER0, TIER1, FlowFactory
from tests.integration.slinky.conftest import carries_slurms_refusal


@pytest.mark.timeout(360)
async def test_a_replacement_slurm_refused_stays_drained_and_escalates_with_the_reason(
        flows: FlowFactory) -> None:
    f = await flows("StatefulSet", "slinky")
    lay = f.lay
    for spare in lay.spares:  # no topology labels: nothing to annotate the spare with
        await f.core.patch_node(spare, {"metadata": {"labels": {  # type: ignore[arg-type]
            DOMAIN: None, TIER0: None, TIER1: None}}})
    runtime = f.sstack.runtime
    assert runtime is not None
    runtime.conf_topology = True
    try:
        bad = lay.gpus[1]
        sn = await f.slurm_name_on(bad)
        d = f.start_daemon()
        await f.ready(d)
        f.xid(bad)
        rec = await f.wait_phase(bad, "Escalated", within=240)
    finally:
        runtime.conf_topology = False

    steps = ledger(rec)
    assert "move-workload" in steps
    topo = steps["annotate-topology"]
    assert topo.get("outcome") == "failed", topo
    assert f"the replacement Slurm node {sn} on " in topo.get("error", ""), topo
    assert "undrain" not in steps  # healer never asked Slurm to undrain it

    pod = await f.pod_of(sn)
    assert pod is not None

    def refused(text: str) -> bool:
        return carries_slurms_refusal(text, "Failed to set topology 'CPUs=",
                                      namespace=pod["metadata"]["namespace"],
                                      pod=pod["metadata"]["name"])

    assert refused(topo["error"]), topo
    assert pod["spec"]["nodeName"] in lay.spares  # the slurmd did move
    st = await f.slurm_state(sn)
    assert st is not None
    assert st.invalid_registration, st
    assert st.drain, st  # drained by Slurm, and left so
    assert refused(st.reason), st
    assert f.ctld_returns_to_service(sn) == []

    notes = [str(e.get("note")) for e in await f.events(bad) if e.get("reason") == "Escalated"]
    assert len(notes) == 1, notes
    assert "did not register validly" in notes[0]
    assert refused(notes[0]), notes
