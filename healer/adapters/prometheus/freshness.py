"""Freshness and staleness: which nodes (and GPUs) have fresh telemetry in this poll."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
    fetched: float | None = None  # poll time of its last per-GPU rows (None: never)
    nodelevel: bool = False  # its last per-GPU rows held a series without GPU labels

    @property
    def expected(self) -> int:
        """How many distinct GPU groups its heartbeat should show (the ``gpus`` row)."""
        return len(self.gpus) + (1 if self.nodelevel else 0)


@dataclass(frozen=True, slots=True)
class Transition:
    node: str
    stale: bool
    reason: str


#: node → [instance of its first row, {GPU (None: node-level) → newest heartbeat}]
NodeRows = dict[str, tuple[str, dict[GpuRef | None, float]]]
#: node → [instance, newest heartbeat of the node, GPUs with a heartbeat ≤ stale_after old]
NodeSummary = dict[str, list[Any]]
State = tuple[bool, str]


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
        signals, transitions, _, _ = self.observe_summary(now, by_node, {}, down_instances)
        return signals, transitions

    def observe_summary(self, now: float, rows: NodeRows, nodes: NodeSummary,
                        down_instances: Iterable[str] = (),
                        due: Callable[[str], bool] | None = None
                        ) -> tuple[list[Signal], list[Transition], set[str], set[str]]:
        """A poll's first round: ``rows`` (per-GPU rows, judged exactly) and ``nodes`` (per
        node summaries of the others) → (signals, transitions, fetch, held).

        A summarised node is judged at once when its newest heartbeat is old (``series-old``)
        or when it is known, was fresh, and as many GPUs are fresh as it has known GPUs
        (FRESH); its per-GPU rows are wanted (``fetch``) when ``due(node)`` (the inventory
        refresh). Otherwise (new, GPU count changed, was stale) its per-GPU rows are wanted
        and its FRESH/STALE is *held* until :meth:`observe_rows` gets them. Known nodes in
        neither are stale (``exporter-down`` or ``series-missing``); forgetting happens here.
        """
        down = set(down_instances)
        signals: list[Signal] = []
        append = signals.append
        states: dict[str, State] = {}
        inventory = self.inventory
        for node in sorted(rows):
            instance, newest = rows[node]
            states[node] = self._judge(now, node, instance, newest, append)
        fetch: set[str] = set()
        held: set[str] = set()
        stale_after = self.stale_after
        source = self.source
        fresh_state: State = (False, "")
        fresh_kind = SignalKind.FRESH
        for node, (instance, ts, gpus) in nodes.items():
            if node in rows:
                continue
            inv = inventory.get(node)
            if inv is None:
                inv = inventory[node] = _NodeInventory()
            if instance:
                inv.instance = instance
            inv.last_seen = now
            age = now - ts
            if age > stale_after:
                append(self._stale(node, now, "series-old", age=f"{age:.1f}",
                                   instance=inv.instance))
                states[node] = (True, "series-old")
            elif inv.fetched is None or inv.stale is not False or gpus != inv.expected:
                fetch.add(node)
                held.add(node)
            else:
                append(Signal(node, source, fresh_kind, source, 1.0, now))
                states[node] = fresh_state
                if due is not None and due(node):
                    fetch.add(node)
        self._forget(now)
        for node in sorted(n for n in inventory if n not in nodes and n not in rows):
            inv = inventory[node]
            reason = "exporter-down" if inv.instance and inv.instance in down \
                else "series-missing"
            append(self._stale(node, now, reason, instance=inv.instance))
            states[node] = (True, reason)
        return signals, self._transitions(states), fetch, held

    def observe_rows(self, now: float, rows: NodeRows, held: Iterable[str],
                     nodes: NodeSummary) -> tuple[list[Signal], list[Transition]]:
        """A poll's second round: the per-GPU rows of the nodes :meth:`observe_summary` asked
        for. The ``held`` nodes are judged now (exactly, as :meth:`observe_nodes`; from their
        summary when their rows did not come: FRESH, or ``gpu-missing`` naming no GPU); the
        others only refresh their inventory (GPUs seen, a GPU replaced at the same index)."""
        signals: list[Signal] = []
        append = signals.append
        states: dict[str, State] = {}
        held = set(held)
        for node in sorted(rows):
            instance, newest = rows[node]
            if node in held:
                states[node] = self._judge(now, node, instance, newest, append)
            else:
                inv = self.inventory.get(node)
                if inv is not None:
                    self._absorb(inv, now, newest)
        source = self.source
        for node in sorted(held - rows.keys()):
            inv = self.inventory.get(node)
            summary = nodes.get(node)
            if inv is None or summary is None:
                continue
            if summary[2] >= inv.expected:
                append(Signal(node, source, SignalKind.FRESH, source, 1.0, now))
                states[node] = (False, "")
            else:
                append(self._stale(node, now, "gpu-missing", instance=inv.instance))
                states[node] = (True, "gpu-missing")
        return signals, self._transitions(states)

    @staticmethod
    def _absorb(inv: _NodeInventory, now: float, newest: dict[GpuRef | None, float]) -> None:
        """Per-GPU rows of a node → its inventory (GPUs seen now, replaced ones dropped)."""
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
        inv.fetched = now
        inv.nodelevel = None in newest

    def _judge(self, now: float, node: str, instance: str,
               newest: dict[GpuRef | None, float], append: Callable[[Signal], None]
               ) -> State:
        """One node with its per-GPU rows → its FRESH/STALE signals (appended), its state."""
        inv = self.inventory.get(node)
        if inv is None:
            inv = self.inventory[node] = _NodeInventory()
        if instance:
            inv.instance = instance
        inv.last_seen = now
        self._absorb(inv, now, newest)
        gpus = inv.gpus
        stale_after = self.stale_after
        age = now - max(newest.values())
        if age > stale_after:
            append(self._stale(node, now, "series-old", age=f"{age:.1f}",
                               instance=inv.instance))
            return (True, "series-old")
        present = len(newest) - (1 if None in newest else 0)
        if present == len(gpus) and (not gpus or now - min(
                ts for g, ts in newest.items() if g is not None) <= stale_after):
            append(Signal(node, self.source, SignalKind.FRESH, self.source, 1.0, now))
            return (False, "")
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
            return (True, missing[0][1])
        append(Signal(node, self.source, SignalKind.FRESH, self.source, 1.0, now))
        return (False, "")

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
