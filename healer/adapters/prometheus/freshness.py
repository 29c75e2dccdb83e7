"""Freshness and staleness: which nodes (and GPUs) have fresh telemetry in this poll."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from healer.adapters.prometheus.promql import SOURCE
from healer.core.model import GpuRef, Signal, SignalKind


@dataclass(frozen=True, slots=True)
class FreshRow:
    """The newest heartbeat sample of one GPU (``gpu=None``: a node-level series)."""

    node: str
    instance: str
    gpu: GpuRef | None
    ts: float
    jobs: tuple[str, ...] = ()


@dataclass(slots=True)
class _NodeInventory:
    instance: str = ""
    last_seen: float = 0.0
    gpus: dict[GpuRef, float] = field(default_factory=dict)  # GPU → poll time last seen
    first: dict[GpuRef, float] = field(default_factory=dict)  # GPU → poll time first seen
    stale: bool | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Transition:
    node: str
    stale: bool
    reason: str


#: node → [instance of its first row, {GPU (None: node-level) → newest heartbeat}]
NodeRows = dict[str, tuple[str, dict[GpuRef | None, float]]]


def group_rows(rows: Iterable[FreshRow]) -> NodeRows:
    by_node: NodeRows = {}
    for r in rows:
        entry = by_node.get(r.node)
        if entry is None:
            entry = by_node[r.node] = (r.instance, {})
        newest = entry[1]
        old = newest.get(r.gpu)
        if old is None or r.ts > old:
            newest[r.gpu] = r.ts
    return by_node


class FreshnessTracker:
    """Knows every node and GPU seen so far and says, per poll, which are fresh or stale.

    A node is fresh when its newest heartbeat is at most ``stale_after`` old and none of its
    known GPUs is missing; otherwise it is stale with a reason: ``exporter-down`` (its target's
    ``up`` is 0), ``series-missing`` (absent though the target is up, or unknown), ``series-old``
    (Prometheus holds only old samples: a scrape gap, Prometheus restarted), ``gpu-missing``
    (one GPU's series vanished) or ``prometheus-unreachable``. Nodes and GPUs not seen for
    ``forget_after`` seconds are forgotten (a GPU replaced at the same index at once);
    ``forgotten`` lists the nodes the last :meth:`observe` forgot.
    """

    def __init__(self, source: str = SOURCE, *, stale_after: float = 90.0,
                 forget_after: float = 3600.0) -> None:
        self.source = source
        self.stale_after = stale_after
        self.forget_after = forget_after
        self.inventory: dict[str, _NodeInventory] = {}
        self.forgotten: list[str] = []

    @property
    def nodes(self) -> list[str]:
        return sorted(self.inventory)

    def _stale(self, node: str, now: float, reason: str, gpu: GpuRef | None = None,
               **detail: str) -> Signal:
        return Signal(node, self.source, SignalKind.STALE, self.source, 0.0, now, gpu,
                      Signal.details(reason=reason, **detail))

    def observe(self, now: float, rows: Sequence[FreshRow],
                down_instances: Iterable[str] = ()) -> tuple[list[Signal], list[Transition]]:
        return self.observe_nodes(now, group_rows(rows), down_instances)

    def observe_nodes(self, now: float, by_node: NodeRows, down_instances: Iterable[str] = ()
                      ) -> tuple[list[Signal], list[Transition]]:
        """:meth:`observe` with the rows already grouped per node (the poll's tight path)."""
        down = set(down_instances)
        signals: list[Signal] = []
        append = signals.append
        states: dict[str, tuple[bool, str]] = {}
        inventory = self.inventory
        stale_after = self.stale_after
        source = self.source
        fresh_state = (False, "")
        fresh_kind = SignalKind.FRESH
        for node in sorted(by_node):
            instance, newest = by_node[node]
            inv = inventory.get(node)
            if inv is None:
                inv = inventory[node] = _NodeInventory()
            if instance:
                inv.instance = instance
            inv.last_seen = now
            gpus = inv.gpus
            added = False
            for g in newest:
                if g is not None:
                    if g not in gpus:
                        added = True
                        inv.first[g] = now
                    gpus[g] = now
            if added:
                indices = {g.index for g in newest if g is not None and g.index >= 0}
                for g in [g for g in gpus if g not in newest and g.index in indices]:
                    del gpus[g]  # replaced: another UUID now answers at that index
                    inv.first.pop(g, None)
            age = now - max(newest.values())
            if age > stale_after:
                append(self._stale(node, now, "series-old", age=f"{age:.1f}",
                                   instance=inv.instance))
                states[node] = (True, "series-old")
                continue
            present = len(newest) - (1 if None in newest else 0)
            if present == len(gpus) and (not gpus or now - min(
                    ts for g, ts in newest.items() if g is not None) <= stale_after):
                append(Signal(node, source, fresh_kind, source, 1.0, now))
                states[node] = fresh_state
                continue
            missing: list[tuple[GpuRef, str]] = []
            for g in sorted(gpus):
                ts = newest.get(g)
                if ts is None:
                    missing.append((g, "gpu-missing"))
                elif now - ts > stale_after:
                    missing.append((g, "series-old"))
            for g, why in missing:
                append(self._stale(node, now, why, g, instance=inv.instance))
            if missing:
                states[node] = (True, missing[0][1])
            else:
                append(Signal(node, source, fresh_kind, source, 1.0, now))
                states[node] = fresh_state
        self._forget(now)
        for node, inv in sorted(inventory.items()):
            if node in by_node:
                continue
            reason = "exporter-down" if inv.instance and inv.instance in down \
                else "series-missing"
            append(self._stale(node, now, reason, instance=inv.instance))
            states[node] = (True, reason)
        return signals, self._transitions(states)

    def known_since(self, node: str, gpu: GpuRef) -> float | None:
        """The poll time this GPU was first seen (continuously known since), or None."""
        inv = self.inventory.get(node)
        return inv.first.get(gpu) if inv is not None else None

    def unreachable(self, now: float, error: str) -> list[Signal]:
        """Prometheus could not be queried: every known node is stale (unknown).

        The per-node state is left as it was, so that the recovery reports only the nodes
        whose state really changed (the outage itself is logged once, by the source).
        """
        return [self._stale(n, now, "prometheus-unreachable", error=error[:200])
                for n in sorted(self.inventory)]

    def _transitions(self, states: Mapping[str, tuple[bool, str]]) -> list[Transition]:
        out: list[Transition] = []
        inventory = self.inventory
        for node, (stale, reason) in states.items():
            inv = inventory.get(node)
            if inv is None:
                continue
            if inv.stale is not stale:
                if stale or inv.stale is not None:
                    out.append(Transition(node, stale, reason))
                inv.stale = stale
            inv.reason = reason
        return out

    def _forget(self, now: float) -> None:
        self.forgotten = []
        forget_after = self.forget_after
        for node, inv in list(self.inventory.items()):
            if now - inv.last_seen > forget_after:
                del self.inventory[node]
                self.forgotten.append(node)
                continue
            gpus = inv.gpus
            if gpus and now - min(gpus.values()) > forget_after:
                for g, seen in list(gpus.items()):
                    if now - seen > forget_after:
                        del gpus[g]
                        inv.first.pop(g, None)
