"""Undrain only a node Slurm will really schedule on (issue 21 item 6), on the real Slurm 26.05
and SchedMD's real operator: before the undrain, healer's topology step reads the replacement's
Slurm node and refuses it when Slurm refused its registration (``INVALID_REG``), when it lacks
the NodeSet's GPUs or features, or while its topology string is not set.

The invalid registrations are Slurm's own answers to what a NodeSet really can make the operator
pass in ``slurmd --conf``: an empty ``Topology=`` followed by another item (the
SlinkyProject/slurm-operator#261 bug: Slurm reads ``Weight=5`` as the topology, refuses it and
drains the node, "Failed to set topology 'Weight=5'"), and more GPUs declared than the node has
("gres/gpu count reported lower than configured (8 < 9)"). healer never undrains such a node: its
drain is Slurm's, and the step FAILS saying why (the state machine escalates with that reason in
an Event: tests/integration/flows/test_registration_flow.py).
"""

from __future__ import annotations

import pytest

from healer.adapters.kube.nodes import KubeNodes
from healer.adapters.slinky import OperatorCapabilities, SlinkyPods
from healer.adapters.slurm.scontrol import ScontrolDriver
from healer.adapters.topology_step import KubeTopology
from healer.core.topology import TOPOLOGY_ANNOTATION
from healer.ports import HookResult, StepOutcome, Undrain
from tests.integration.slinky.conftest import Rig, carries_slurms_refusal, host_of
from tests.integration.waiting import wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240)]

TIERS = {"fabric.topograph.run/tier-0": "leaf2", "fabric.topograph.run/tier-1": "spine1"}
SPEC = "default:spine1:leaf2"


def topology(rig: Rig, slurm: ScontrolDriver | None) -> KubeTopology:
    return KubeTopology(KubeNodes(rig.api), pods=SlinkyPods(rig.api, rig.namespace), slurm=slurm,
                        copies_topology=OperatorCapabilities(rig.api).copies_topology)


async def registered_on(rig: Rig, name: str, node: str) -> None:
    await rig.wait_pod(name, lambda p: host_of(p) == node, within=120,
                       description=f"the slurmd pod of {name} on {node}")
    await rig.wait_slurm(name, lambda s: s.registered, within=120,
                         description=f"Slurm node {name} registered")


@pytest.mark.parametrize(("extra_conf", "slurm_says"), [
    ("Topology= Weight=5", "Failed to set topology 'Weight=5'"),
    ("Gres=gpu:h100:9", "gres/gpu count reported lower than configured (8 < 9)"),
], ids=["empty-topology-261", "more-gpus-than-the-node-has"])
async def test_an_invalid_registration_is_refused_and_stays_drained(
        rig: Rig, extra_conf: str, slurm_says: str) -> None:
    a = await rig.node("a", labels=TIERS)
    ns = await rig.nodeset("reg", replicas=1, extra_conf=extra_conf)
    name = f"{ns}-0"

    def refused(text: str) -> bool:
        return carries_slurms_refusal(text, slurm_says, namespace=rig.namespace, pod=name)

    await registered_on(rig, name, a)
    st = await rig.wait_slurm(name, lambda s: s.invalid_registration, within=60,
                              description=f"Slurm node {name} INVALID_REG")
    assert st.drain
    assert refused(st.reason), st
    assert st.reason_user == "slurm"  # Slurm's drain (or the operator's token), not healer's

    scontrol = ScontrolDriver(env=rig.stack.slurm.env())
    r = await topology(rig, scontrol).annotate("inc-1", a, name)
    assert r.outcome is StepOutcome.FAILED, r.detail
    assert r.detail.startswith(f"the replacement Slurm node {name} on {a} did not register "
                               "validly: Slurm refused its registration (INVALID_REG"), r.detail
    assert refused(r.detail), r.detail
    assert r.detail.endswith("healer does not undrain it")
    assert await scontrol.undrain(name, "inc-1") is Undrain.NOT_OURS
    st = await rig.slurm_state(name)
    assert st is not None
    assert st.drain
    assert st.invalid_registration

    # without Slurm's own API (the Slinky driver alone), the pod's mirrored conditions say it
    async def mirrored() -> bool:
        return (await rig.pod_state(name)).invalid_registration

    await wait_for(mirrored, timeout=90, description=f"InvalidReg on the pod of {name}")
    r = await topology(rig, None).annotate("inc-1", a, name)
    assert r.outcome is StepOutcome.FAILED, r.detail
    assert f"INVALID_REG on pod {rig.namespace}/{name}" in r.detail


async def test_a_valid_registration_passes_with_its_topology_string_set(rig: Rig) -> None:
    a = await rig.node("a", labels=TIERS)
    ns = await rig.nodeset("reg", replicas=1)
    name = f"{ns}-0"
    await registered_on(rig, name, a)
    st = await rig.wait_slurm(name, lambda s: not s.drain and s.base == "IDLE", within=60)
    assert not st.invalid_registration
    assert ns in st.features  # the operator's Features=<NodeSet name>
    assert st.gres == "gpu:h100:8"
    topo = topology(rig, ScontrolDriver(env=rig.stack.slurm.env()))
    r = await topo.annotate("inc-1", a, name)  # writes the annotation; Slurm has none yet
    if r.outcome is StepOutcome.PENDING:
        assert "has not propagated" in r.detail or \
            f"Slurm has no topology for {name} yet" in r.detail, r.detail

    async def done() -> HookResult | None:
        got = await topo.annotate("inc-1", a, name)
        return got if got.outcome is StepOutcome.DONE else None

    r = await wait_for(done, timeout=150, interval=0.5,  # the operator's sync pushes it
                       description=f"the topology step of {name} DONE")
    assert r.data["checks"] == "placement,pod,registration,slurm"
    assert (await rig.slurm_state(name)).topology == SPEC  # type: ignore[union-attr]
    node = await rig.read_node(a)
    assert node["metadata"]["annotations"][TOPOLOGY_ANNOTATION] == SPEC
