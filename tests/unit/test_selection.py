"""core/selection: what a policy set selects on a given fleet (healer validate --kubeconfig)."""

from __future__ import annotations

from healer.core import rules as cp
from healer.core.nodesets import NodeSetRules, NodeSets
from healer.core.selection import census

SPARE = {"healer.io/role": "spare"}


def _ps(*nodesets: NodeSetRules, policies: tuple[cp.Policy, ...] = ()) -> cp.PolicySet:
    return cp.PolicySet(policies, nodesets=NodeSets(nodesets))


A = NodeSetRules("a", cp.LabelSelector({"pool": "a"}), "c1", source="f.yaml:1")
B = NodeSetRules("b", cp.LabelSelector({"pool": "b"}), "c2", source="f.yaml:9",
                 spare_selector=cp.LabelSelector({"healer.io/role": "spare", "for": "b"}))
C = NodeSetRules("c", cp.LabelSelector({"tier": "x"}), "c1", source="f.yaml:20")


def test_nodes_and_spares_per_nodeset() -> None:
    nodes = [("a1", {"pool": "a"}), ("a2", {"pool": "a"}), ("b1", {"pool": "b"}),
             ("s1", SPARE), ("s2", {**SPARE, "for": "b"}), ("x", {})]
    c = census(_ps(A, B), nodes)
    counts = {n.nodeset.name: (n.selected, n.serving, n.spares) for n in c.nodesets}
    assert counts == {"a": (2, 2, 2), "b": (1, 1, 1)}
    assert (c.nodes, c.fleet_spares) == (6, 2)
    assert c.problems() == []


def test_a_node_that_is_both_is_a_problem_naming_the_nodeset_and_the_node() -> None:
    nodes = [("a1", {"pool": "a"}), ("both", {"pool": "a", **SPARE})]
    [(ns, what)] = census(_ps(A), nodes).problems()
    assert ns is A
    assert "1 node(s) of SlurmNodeSet 'a' also match a spare selector (both)" in what


def test_a_nodeset_whose_nodes_all_belong_to_an_earlier_one_serves_nothing() -> None:
    nodes = [("a1", {"pool": "a", "tier": "x"}), ("a2", {"pool": "a", "tier": "x"})]
    c = census(_ps(A, C), nodes)
    [(ns, what)] = c.problems()
    assert ns is C
    assert "serves no node: the 2 node(s) its nodeSelector matches" in what


def test_many_nodes_that_are_both_are_counted_and_a_few_named() -> None:
    nodes = [(f"n{i}", {"pool": "a", **SPARE}) for i in range(40)]
    [(_, what)] = census(_ps(A), nodes).problems()
    assert "40 node(s)" in what
    assert "n0, n1, n2, n3, n4 and 35 more" in what


def test_policies_count_serving_nodes_only() -> None:
    p = cp.Policy("gpu", cp.LabelSelector({"gpu": "true"}), rules=())
    nodes = [("g1", {"gpu": "true"}), ("g2", {"gpu": "true", **SPARE}), ("c", {})]
    assert census(_ps(policies=(p,)), nodes).policies == {"gpu": 1}
