"""What the node watch last saw of every Node, informer-style: the writes' starting point
instead of a read per write, and the spare pool's queries instead of a list per claim.

Per node it keeps the resourceVersion, the :class:`~healer.core.model.NodeView` (the same object
the controller holds, so nothing is stored twice) and the raw taints (a write must send them
back whole). Label keys registered with :meth:`NodeCache.index` are indexed (value → names), so
"the free spares" and "the spare this incident claimed" are set lookups, not a scan of the
fleet. Fed by :meth:`KubeNodes.watch <healer.adapters.kube.nodes.KubeNodes.watch>` (every event,
and after a re-list the nodes that went), and by the answers of healer's own writes, so a write
is never computed from a state older than healer's previous one. It is only ever a starting
point: every write computed from it carries its resourceVersion, so the API server refuses one
computed from a stale entry (409) and the writer starts again from a fresh read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from healer.core.model import NodeView


@dataclass(frozen=True, slots=True)
class CachedNode:
    version: str
    view: NodeView
    taints: tuple[Mapping[str, Any], ...]

    def raw(self) -> dict[str, Any]:
        """The parts of the Node a write is computed from, shaped as the API serves them."""
        v = self.view
        return {"metadata": {"name": v.name, "resourceVersion": self.version,
                             "labels": dict(v.labels), "annotations": dict(v.annotations)},
                "spec": {"unschedulable": v.unschedulable,
                         "taints": [dict(t) for t in self.taints]}}


def _newer(new: str, old: str) -> bool:
    """Is resourceVersion ``new`` at least ``old``? (etcd's are integers; anything else: yes)"""
    try:
        return int(new) >= int(old)
    except ValueError:
        return True


class NodeCache:
    def __init__(self) -> None:
        self._nodes: dict[str, CachedNode] = {}
        self._index: dict[str, dict[str, set[str]]] = {}
        self.synced = False
        """True once a complete list has been seen (until then, callers read the API)."""

    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, name: str) -> CachedNode | None:
        return self._nodes.get(name)

    def index(self, key: str) -> None:
        """Index the label ``key`` (value → node names)."""
        if key in self._index:
            return
        idx: dict[str, set[str]] = {}
        for name, c in self._nodes.items():
            if key in c.view.labels:
                idx.setdefault(c.view.labels[key], set()).add(name)
        self._index[key] = idx

    def with_label(self, key: str, value: str) -> set[str] | None:
        """Names of the nodes labelled ``key=value`` (None: ``key`` is not indexed)."""
        idx = self._index.get(key)
        if idx is None:
            return None
        return set(idx.get(value, ()))

    def views(self) -> Iterable[NodeView]:
        return (c.view for c in self._nodes.values())

    def put(self, view: NodeView, version: str, taints: Iterable[Mapping[str, Any]]) -> None:
        """What the API said of ``view.name`` at ``version`` (an older version is ignored)."""
        old = self._nodes.get(view.name)
        if old is not None and not _newer(version, old.version):
            return
        self._nodes[view.name] = CachedNode(version, view, tuple(taints))
        self._reindex(view.name, old.view if old is not None else None, view)

    def remove(self, name: str) -> None:
        old = self._nodes.pop(name, None)
        if old is not None:
            self._reindex(name, old.view, None)

    def keep_only(self, names: set[str]) -> None:
        """After a re-list: the nodes not in it are gone."""
        for name in [n for n in self._nodes if n not in names]:
            self.remove(name)
        self.synced = True

    def _reindex(self, name: str, old: NodeView | None, new: NodeView | None) -> None:
        for key, idx in self._index.items():
            before = old.labels.get(key) if old is not None else None
            after = new.labels.get(key) if new is not None else None
            if before == after:
                continue
            if before is not None:
                names = idx.get(before)
                if names is not None:
                    names.discard(name)
                    if not names:
                        del idx[before]
            if after is not None:
                idx.setdefault(after, set()).add(name)
