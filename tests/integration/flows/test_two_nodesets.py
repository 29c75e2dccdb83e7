"""Two Slinky NodeSets, one daemon (issue 14 item 4), on SchedMD's real slurm-operator.

NodeSet A (the flow's ``fs<tid>``: 4 GPU Nodes, its warm spares) and NodeSet B (``fb<tid>``: 2
GPU Nodes in NVLink domain nvl-a, one warm spare of its own, also in nvl-a) run in one Slurm
cluster. Two ``kind: SlurmNodeSet`` documents give each its spare selector. A fatal XID on a B
node must swap its slurmd pod onto *B's* spare — though A's spare in the same NVLink domain
sorts first by name and would fit as well — through B's NodeSet (the pod of B's NodeSet moves,
A's pods stay where they are); a fault on an A node then takes A's spare.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client

from healer_dev.devstack.operator import nodeset as nodeset_body
from tests.builders import policy_steps, policy_yaml, slurm_nodeset
from tests.integration.flows.conftest import CLUSTER, POOL, TEST_LABEL, Flow, FlowFactory

SPARE_FOR = "healer-flow/spare-for"



def two_nodesets_policy(f: Flow, *, a: str, b: str) -> str:
    """NodeSets ``a`` (Nodes labelled POOL=tid) and ``b`` (POOL=tid+"b") on the one Slinky
    Slurm cluster, each with its own spares (SPARE_FOR), and the flows' policy over both."""
    tid = f.tid

    def nodeset(name: str, which: str, pool: str) -> dict[str, Any]:
        return slurm_nodeset(
            f"{which}-{tid}", cluster=CLUSTER,
            slurm={"driver": "slinky", "slurmConf": str(f.slurm.conf)},
            node_selector={POOL: pool},
            nodeSet={"namespace": f.namespace, "name": name},
            spareSelector={"matchLabels": {"healer.io/role": "spare", TEST_LABEL: tid,
                                           SPARE_FOR: which}})

    return policy_yaml(tid, name=f"flow-{tid}", label=TEST_LABEL,
                       nodesets=[nodeset(a, "a", tid), nodeset(b, "b", f"{tid}b")],
                       steps=policy_steps(swap=True, repair_hook="none"))


@pytest.mark.timeout(600)
async def test_each_nodeset_swaps_onto_its_own_spares(flows: FlowFactory) -> None:
    f = await flows("StatefulSet", "slinky")
    core = f.core
    tid, lay = f.tid, f.lay
    b_nodes = [f"f{tid}-m0", f"f{tid}-m1"]
    b_spare = f"f{tid}-sc"
    for n in b_nodes:  # B's workers: nvl-a, leaf-1, B's pool
        await f.create_node(n, "nvl-a", "leaf-1", spare=False, pool=False)
        await core.patch_node(n, {"metadata": {"labels": {POOL: f"{tid}b"}}})
    await f.create_node(b_spare, "nvl-a", "leaf-1", spare=True)
    for s in lay.spares:  # A's spares
        await core.patch_node(s, {"metadata": {"labels": {SPARE_FOR: "a"}}})
    await core.patch_node(b_spare, {"metadata": {"labels": {SPARE_FOR: "b"}}})
    await f._wait_nodes_ready([*b_nodes, b_spare])
    b_name = f"fb{tid}"
    await client.CustomObjectsApi(f.api).create_namespaced_custom_object(
        "slinky.slurm.net", "v1beta1", f.namespace, "nodesets", nodeset_body(
            f.namespace, b_name, CLUSTER, replicas=2, node_selector={POOL: f"{tid}b"}, gpus=8,
            scaling_mode="StatefulSet"))
    await f.wait_pods_idle(b_nodes)
    (f.policies / "policy.yaml").write_text(two_nodesets_policy(
        f, a=f.nodeset, b=b_name))
    a_pods = {n: await f.slurm_name_on(n) for n in lay.gpus}
    b_bad = b_nodes[0]
    b_slurm = await f.slurm_name_on(b_bad)
    assert b_slurm.startswith(b_name), b_slurm

    d = f.start_daemon()
    await f.ready(d)
    f.xid(b_bad)
    rec = await f.wait_phase(b_bad, "Repair", within=240)
    assert rec["status"]["spare"] == b_spare, rec["status"]
    # B's slurmd pod serves from B's spare under its own Slurm name; A's pods never moved
    await f.wait_pod(b_slurm, lambda s: s.base == "IDLE" and not s.drain)
    pod = await f.pod_of(b_slurm)
    assert pod is not None
    assert pod["spec"]["nodeName"] == b_spare
    assert {n: await f.slurm_name_on(n) for n in lay.gpus} == a_pods

    a_bad = lay.gpus[0]  # nvl-a too: A's own spare in nvl-a, never B's (taken) one
    f.xid(a_bad)
    rec = await f.wait_phase(a_bad, "Repair", within=240)
    assert rec["status"]["spare"] == lay.spare_a, rec["status"]
