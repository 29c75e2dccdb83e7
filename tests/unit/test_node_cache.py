"""The node watch's cache: newest version wins, label indexes follow every change, a re-list
drops the nodes it no longer has."""

from __future__ import annotations

from healer.adapters.kube.node_cache import NodeCache
from healer.core.model import NodeView


def view(name: str, **labels: str) -> NodeView:
    return NodeView(name, dict(labels))


def test_the_newest_version_wins_and_indexes_follow() -> None:
    c = NodeCache()
    c.index("role")
    c.put(view("a", role="spare"), "5", [])
    c.put(view("b", role="spare"), "6", [{"key": "t", "effect": "NoSchedule"}])
    assert c.with_label("role", "spare") == {"a", "b"}
    c.put(view("a"), "4", [])  # older than what is held: ignored
    assert c.with_label("role", "spare") == {"a", "b"}
    c.put(view("a", role="claimed"), "7", [])
    assert c.with_label("role", "spare") == {"b"}
    assert c.with_label("role", "claimed") == {"a"}
    assert c.with_label("zone", "x") is None  # not indexed
    c.index("zone")  # indexed late: built from what is held
    c.put(view("b", role="spare", zone="x"), "8", [{"key": "t", "effect": "NoSchedule"}])
    assert c.with_label("zone", "x") == {"b"}
    raw = c.get("b").raw()  # type: ignore[union-attr]
    assert raw["metadata"]["resourceVersion"] == "8"
    assert raw["spec"]["taints"] == [{"key": "t", "effect": "NoSchedule"}]


def test_a_relist_drops_what_went_and_marks_it_synced() -> None:
    c = NodeCache()
    c.index("role")
    for n in "abc":
        c.put(view(n, role="spare"), "1", [])
    assert not c.synced
    c.keep_only({"a", "c"})
    assert c.synced
    assert len(c) == 2
    assert c.with_label("role", "spare") == {"a", "c"}
    c.remove("a")
    assert c.with_label("role", "spare") == {"c"}
