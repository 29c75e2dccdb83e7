"""NodeSetPorts (healer/app_nodesets.py): a node's actions go through its NodeSet's ports, built
once per NodeSet and again after a reload changed it; the Slurm feed reads every NodeSet's
cluster (issue 14 item 4)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from healer.app_nodesets import NodeSetPorts, NodeSetWiring
from healer.core import rules as cp
from healer.core.model import NodeView
from healer.core.nodesets import NodeSetRules, NodeSets, SlurmEndpoint
from healer.errors import TransientError
from healer.ports import SlurmNodeState
from healer.runtime.executor import Ports
from healer_dev.testing import (
    FakeCheckpoint,
    FakeEvents,
    FakeFencing,
    FakeNodes,
    FakeRepair,
    FakeSlurm,
    FakeSpares,
    FakeTopology,
    FakeValidator,
    FakeWorkload,
)

WEST = NodeSetRules("west", cp.LabelSelector({"pool": "west"}), "west",
                    SlurmEndpoint("scontrol", slurm_conf="/etc/slurm-west/slurm.conf"))
EAST = NodeSetRules("east", cp.LabelSelector({"pool": "east"}), "east",
                    SlurmEndpoint("scontrol", slurm_conf="/etc/slurm-east/slurm.conf"))


def ports(slurm: FakeSlurm) -> Ports:
    nodes = FakeNodes()
    return Ports(nodes=nodes, events=FakeEvents(), slurm=slurm, spares=FakeSpares(nodes),
                 workload=FakeWorkload(slurm), topology=FakeTopology(nodes),
                 validator=FakeValidator(), checkpoint=FakeCheckpoint(slurm),
                 repair=FakeRepair(nodes), fencing=FakeFencing(nodes))


class States:
    def __init__(self, states: Mapping[str, SlurmNodeState], fail: bool = False) -> None:
        self.states = dict(states)
        self.fail = fail

    async def node_states(self) -> Mapping[str, SlurmNodeState]:
        if self.fail:
            raise TransientError("slurmctld is restarting")
        return self.states


class World:
    def __init__(self) -> None:
        self.policies = cp.PolicySet((), nodesets=NodeSets((WEST, EAST)))
        self.labels = {"w1": {"pool": "west"}, "e1": {"pool": "east"}, "x1": {"pool": "none"}}
        self.built: list[str] = []
        self.states = {"west": States({"w1": SlurmNodeState("w1", "IDLE", frozenset())}),
                       "east": States({"e1": SlurmNodeState("e1", "DOWN", frozenset())})}
        self.default = ports(FakeSlurm(["x1"]))

        def build(ns: NodeSetRules) -> NodeSetWiring:
            self.built.append(ns.name)
            slurm = FakeSlurm([n for n, lab in self.labels.items() if lab["pool"] == ns.name])
            return NodeSetWiring(ports(slurm), self.states[ns.name], slurm)

        self.router = NodeSetPorts(build, self.default, lambda: self.policies,
                                   nodes=lambda: {n: NodeView(n, lab)
                                                  for n, lab in self.labels.items()})


def test_each_node_acts_through_its_nodesets_ports_built_once() -> None:
    w = World()
    west, east = w.router.route("w1"), w.router.route("e1")
    assert west is not east
    assert west is not w.default
    assert w.router.route("w1") is west
    assert w.router.route("x1") is w.default  # in no NodeSet: the command line's
    assert w.router.route("unknown") is w.default  # the controller has not seen it
    assert w.built == ["west", "east"]


def test_a_reload_that_changes_a_nodeset_rebuilds_only_its_ports() -> None:
    w = World()
    west, east = w.router.route("w1"), w.router.route("e1")
    changed = replace(WEST, guardrails=cp.Guardrails(max_concurrent=1))
    w.policies = replace(w.policies, nodesets=NodeSets((changed, EAST)))
    assert w.router.route("w1") is not west
    assert w.router.route("e1") is east
    assert w.built == ["west", "east", "west"]
    w.policies = cp.PolicySet(())  # no NodeSets any more: everything is the command line's
    assert w.router.route("w1") is w.default


async def test_the_slurm_feed_reads_every_cluster_and_fails_with_any() -> None:
    w = World()
    got = await w.router.node_states()
    assert {n: s.base for n, s in got.items()} == {"w1": "IDLE", "e1": "DOWN"}
    w.states["east"].fail = True
    with pytest.raises(TransientError):
        await w.router.node_states()  # one cluster unreadable: Slurm's view is unknown
    await w.router.close()


def test_a_nodesets_ports_carry_its_spares_and_the_loops_validator() -> None:
    """The composition root's builder: the NodeSet's spare selector, tolerations and topology
    keys on its spare pool, which validates through the one validator the loop uses."""
    from typing import Any, cast

    from healer.adapters.hooks import Secrets
    from healer.adapters.kube.nodes import KubeNodes
    from healer.adapters.kube.spares import KubeSparePool
    from healer.app import Overrides, _nodeset_wiring
    from healer.core.nodesets import Toleration, TolerationOperator
    from healer.core.topology import TopologyKeys
    from healer.settings import Settings

    api = cast(Any, object())  # the builders only keep it: nothing here calls the API server
    keys = TopologyKeys("nvidia.com/gpu.clique", ("example.com/leaf",))
    ns = replace(EAST, spare_selector=cp.LabelSelector({"pool": "east-spares"}),
                 tolerations=(Toleration("nvidia.com/gpu", TolerationOperator.EXISTS),),
                 topology=keys)
    validator = cast(Any, object())
    w = _nodeset_wiring(Settings(), Overrides(), api, KubeNodes(api), Secrets(api),
                        lambda: cp.PolicySet((), nodesets=NodeSets((ns,))), validator, ns)
    pool = w.ports.spares
    assert isinstance(pool, KubeSparePool)
    assert pool.validation is validator
    assert pool.selector == cp.LabelSelector({"pool": "east-spares"})
    assert pool.tolerations == ns.tolerations
    assert pool.keys == keys
    assert w.ports.topology_keys == keys
