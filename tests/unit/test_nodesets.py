"""Several NodeSets in one deployment (issue 14, item 4): membership, tolerations, and guardrails
per NodeSet on top of each policy's and the fleet's."""

from __future__ import annotations

from pathlib import Path

import pytest

from healer.core import rules as cp
from healer.core.budget import check_admission, usage
from healer.core.capacity import FleetIndex
from healer.core.model import NodeCondition, NodeView
from healer.core.nodesets import (
    NodeSetRules,
    NodeSets,
    Toleration,
    TolerationOperator,
    untolerated,
)
from healer.core.phases import Phase
from healer.policy.load import load_policy_set
from tests.builders import record

ROOT = Path(__file__).resolve().parents[2]

T0 = 1_800_000_000.0
READY = (NodeCondition("Ready", "True"),)


def node(name: str, pool: str, *, cordoned: bool = False) -> NodeView:
    return NodeView(name, {"gpu": "true", "pool": pool}, {}, cordoned, (), READY)


def policies(limit_a: int = 1, concurrent_b: int | None = None) -> cp.PolicySet:
    gpu = cp.Policy("gpu", cp.LabelSelector({"gpu": "true"}), ())
    a = NodeSetRules("a", cp.LabelSelector({"pool": "a"}), "cluster-1",
                     guardrails=cp.Guardrails(max_unavailable=cp.Quantity(limit_a)))
    b = NodeSetRules("b", cp.LabelSelector({"pool": "b"}), "cluster-2",
                     guardrails=cp.Guardrails(max_concurrent=concurrent_b))
    return cp.PolicySet((gpu,), nodesets=NodeSets((b, a)))


def index(ps: cp.PolicySet, *nodes: NodeView) -> FleetIndex:
    ix = FleetIndex(ps)
    for n in nodes:
        ix.set_node(n)
    return ix


def test_a_node_belongs_to_the_first_nodeset_by_name_that_selects_it() -> None:
    both = cp.LabelSelector({"gpu": "true"})
    sets = NodeSets((NodeSetRules("zeta", both, "c"), NodeSetRules("alpha", both, "c")))
    assert [n.name for n in sets.items] == ["alpha", "zeta"]
    found = sets.of({"gpu": "true"})
    assert found is not None
    assert found.name == "alpha"
    assert sets.of({"cpu": "true"}) is None
    assert not NodeSets()


def test_the_nodeset_limit_holds_where_policy_and_fleet_would_allow() -> None:
    ps = policies(limit_a=1)
    ix = index(ps, node("a1", "a", cordoned=True), node("a2", "a"), node("a3", "a"),
               node("b1", "b", cordoned=True), node("b2", "b"))
    pol = ps.policies[0]
    held = check_admission("a2", (), pol, ix.view(), T0)
    assert not held.allowed
    assert held.block is not None
    assert held.block.guardrail == "max-unavailable"
    assert held.block.message.startswith("NodeSet a: 1 of 3 nodes unavailable (1 cordoned)")
    # another NodeSet's node is not held by a's limit (b has none)
    assert check_admission("b2", (), pol, ix.view(), T0).allowed


def test_max_concurrent_per_nodeset_counts_only_its_own_remediations() -> None:
    ps = policies(limit_a=10, concurrent_b=1)
    ix = index(ps, node("a1", "a"), node("a2", "a"), node("b1", "b"), node("b2", "b"))
    ix.set_record(record(Phase.DRAINING, nodename="a1", at=T0, policy_name="gpu"))
    pol = ps.policies[0]
    assert check_admission("b1", (), pol, ix.view(), T0).allowed  # a1 is a's, not b's
    ix.set_record(record(Phase.DRAINING, nodename="b1", at=T0, policy_name="gpu"))
    got = check_admission("b2", (), pol, ix.view(), T0)
    assert not got.allowed
    assert got.block is not None
    assert got.block.guardrail == "max-concurrent"
    assert got.block.message == "NodeSet b: 1 remediations in flight, limit 1"


def test_records_seen_before_their_node_count_in_its_nodeset_once_it_appears() -> None:
    ps = policies(limit_a=10, concurrent_b=1)
    ix = FleetIndex(ps)
    ix.set_record(record(Phase.DRAINING, nodename="b1", at=T0, policy_name="gpu"))
    b = ps.nodesets.get("b")
    assert b is not None
    assert ix.active(b) == 0  # no node yet: in no NodeSet
    ix.set_node(node("b1", "b"))
    assert ix.active(b) == 1
    ix.set_node(node("b1", "a"))  # relabelled into a
    assert ix.active(b) == 0
    ix.remove_node("b1")
    assert ix.active(ps.nodesets.get("a")) == 0


def test_usage_names_every_nodeset_scope() -> None:
    ps = policies()
    ix = index(ps, node("a1", "a", cordoned=True), node("b1", "b"))
    scopes = {u.scope: (u.population, u.unavailable) for u in usage(ix.view(), T0)}
    assert scopes == {"fleet": (2, 1), "gpu": (2, 1), "nodeset:a": (1, 1),
                      "nodeset:b": (1, 0)}


@pytest.mark.parametrize(("taints", "tolerations", "left"), [
    ([], (), []),
    ([("nvidia.com/gpu", "present", "NoSchedule")], (), ["nvidia.com/gpu:NoSchedule"]),
    ([("nvidia.com/gpu", "present", "NoSchedule")],
     (Toleration("nvidia.com/gpu", TolerationOperator.EXISTS),), []),
    ([("nvidia.com/gpu", "present", "NoSchedule")],
     (Toleration("nvidia.com/gpu", TolerationOperator.EQUAL, "absent"),),
     ["nvidia.com/gpu:NoSchedule"]),
    ([("nvidia.com/gpu", "present", "NoExecute")],
     (Toleration("nvidia.com/gpu", TolerationOperator.EQUAL, "present", "NoSchedule"),),
     ["nvidia.com/gpu:NoExecute"]),
    ([("x", "", "PreferNoSchedule")], (), []),  # only a preference: keeps no pod off
    ([("anything", "v", "NoSchedule")], (Toleration("", TolerationOperator.EXISTS),), []),
    ([("healer.io/spare", "true", "NoSchedule")], (), []),  # healer's own: it opens the spare
])
def test_untolerated_taints(taints: list[tuple[str, str, str]],
                            tolerations: tuple[Toleration, ...], left: list[str]) -> None:
    assert untolerated(taints, tolerations, frozenset({"healer.io/spare"})) == left


def test_the_two_cluster_example_compiles_to_what_it_says() -> None:
    ps = load_policy_set([ROOT / "policies" / "examples" / "two-clusters.yaml"])
    west, east = ps.nodesets.get("h100-west"), ps.nodesets.get("h200-east")
    assert west is not None
    assert east is not None
    assert set(ps.nodesets.clusters()) == {"west", "east"}
    assert (west.namespace, west.nodeset, west.slurm.driver) == ("slurm-west", "h100", "slinky")
    assert west.slurm.token_secret == "slurm-west/slurm-token-healer:auth-token"
    assert west.spare_selector == cp.LabelSelector({"healer.io/role": "spare",
                                                    "example.com/pool": "west"})
    assert west.tolerations == (Toleration("nvidia.com/gpu", TolerationOperator.EXISTS, "",
                                           "NoSchedule"),)
    assert west.guardrails.max_concurrent == 4
    assert east.topology.domain == "nvidia.com/gpu.clique"
    assert east.topology.tiers == ("network.example.com/leaf", "network.example.com/spine")
    assert west.topology.domain == "accelerator.topograph.run/domain"  # topograph's default
    assert ps.nodesets.of({"example.com/nodeset": "h200-east"}) is east
    assert ps.nodesets.of({"example.com/nodeset": "a100"}) is None


def test_validate_lists_the_nodesets(capsys: pytest.CaptureFixture[str]) -> None:
    from healer.cli import main

    assert main(["validate", str(ROOT / "policies" / "examples" / "two-clusters.yaml")]) == 0
    out = capsys.readouterr().out
    assert "ok  nodeset h100-west" in out
    assert "cluster=west driver=slinky nodeSet=slurm-west/h100" in out
    assert "1 policies valid, 2 NodeSets" in out
