"""A deterministic discrete-event replay of the real engine (evaluate → step → actions).

Used by ``healer simulate`` (scripted fault traces), ``healer backtest`` (history from
Prometheus) and the property tests. It behaves like the runtime: one record per node, a fresh
:class:`~healer.core.budget.BudgetView` before every step, actions answered by a world (the
:class:`~healer.sim.world.SimWorld` simulator, or a read-only world for backtests), rechecks
scheduled from ``Decision.recheck_after``. Nothing here sleeps or reads a clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from healer.core.actions import Action, EmitEvent
from healer.core.budget import BudgetView
from healer.core.fleet import budget_view, verdict_needs_step
from healer.core.health import Verdict, evaluate_node
from healer.core.machine import Decision, Trigger, TriggerKind, releases, step
from healer.core.model import HealthState, NodeRecord, NodeView, Signal, SignalKind
from healer.core.phases import Phase
from healer.core.policy import PolicySet

#: Signals older than this are dropped from a node's history.
HISTORY_SECONDS = 3 * 86400.0


class World(Protocol):
    def node_views(self, now: float) -> dict[str, NodeView]: ...

    def execute(self, action: Action, now: float) -> list[tuple[float, Trigger]]: ...


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    at: float
    node: str
    kind: str  # transition | action | event | verdict
    text: str
    source: str = ""
    target: str = ""


@dataclass
class Replay:
    policies: PolicySet
    world: World
    start: float
    timeline: list[TimelineEntry] = field(default_factory=list)
    records: dict[str, NodeRecord] = field(default_factory=dict)
    closed: list[NodeRecord] = field(default_factory=list)
    decisions: list[tuple[float, NodeRecord | None, Trigger, Decision]] = field(
        default_factory=list)
    on_decision: Callable[[float, Trigger, Decision], None] | None = None
    #: called with (now, view before the step, record before, trigger, decision)
    on_step: Callable[[float, BudgetView, NodeRecord | None, Trigger, Decision], None] | None = None
    keep_decisions: bool = False

    def __post_init__(self) -> None:
        self.now = self.start
        self._queue: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()
        self._signals: dict[str, list[Signal]] = defaultdict(list)
        self._tick_due: dict[str, float] = {}
        self._eval_due: dict[str, float] = {}
        self._last_state: dict[str, HealthState] = {}

    # -- scheduling --------------------------------------------------------------------------

    def at(self, t: float, kind: str, payload: Any) -> None:
        heapq.heappush(self._queue, (t, next(self._seq), kind, payload))

    def add_signal(self, sig: Signal) -> None:
        self.at(sig.observed_at, "signal", sig)

    def add_callback(self, t: float, fn: Callable[[float], None]) -> None:
        self.at(t, "call", fn)

    def run(self, until: float) -> None:
        while self._queue and self._queue[0][0] <= until:
            t, _, kind, payload = heapq.heappop(self._queue)
            self.now = max(self.now, t)
            match kind:
                case "signal":
                    self._on_signal(payload)
                case "eval":
                    if self._eval_due.get(payload) == t:
                        del self._eval_due[payload]
                        self._evaluate(payload)
                case "tick":
                    if self._tick_due.get(payload) == t:
                        del self._tick_due[payload]
                        self.process(Trigger(TriggerKind.TICK, payload, self.now))
                case "trigger":
                    self.process(payload)
                case "call":
                    payload(self.now)
        self.now = max(self.now, until)

    def _schedule(self, due: dict[str, float], kind: str, node: str, t: float) -> None:
        cur = due.get(node)
        if cur is not None and cur <= t and cur >= self.now:
            return
        due[node] = t
        self.at(t, kind, node)

    # -- signals and verdicts ----------------------------------------------------------------

    def _on_signal(self, sig: Signal) -> None:
        hist = self._signals[sig.node]
        hist.append(sig)
        if len(hist) > 4096 or hist[0].observed_at < self.now - HISTORY_SECONDS:
            cutoff = self.now - HISTORY_SECONDS
            self._signals[sig.node] = [s for s in hist if s.observed_at >= cutoff]
        if sig.kind is not SignalKind.FRESH or sig.node not in self._last_state \
                or self._last_state[sig.node] is HealthState.STALE:
            self._schedule(self._eval_due, "eval", sig.node, self.now)

    def verdict(self, node: str) -> Verdict:
        view = self.world.node_views(self.now).get(node)
        policies = self.policies.policies_for(view) if view is not None else []
        return evaluate_node(node, self._signals.get(node, []), policies, self.now)

    def _evaluate(self, node: str) -> None:
        v = self.verdict(node)
        prev = self._last_state.get(node)
        self._last_state[node] = v.state
        if v.recheck_after is not None:
            self._schedule(self._eval_due, "eval", node, self.now + max(v.recheck_after, 0.001))
        rec = self.records.get(node)
        if prev == v.state and not verdict_needs_step(v, rec):
            return
        if prev != v.state and not (prev is None and v.state is HealthState.HEALTHY):
            self.timeline.append(TimelineEntry(self.now, node, "verdict",
                                               f"{v.state.value}: {v.summary()}"))
        self.process(Trigger(TriggerKind.VERDICT, node, self.now, verdict=v))

    # -- steps --------------------------------------------------------------------------------

    def view(self) -> BudgetView:
        return budget_view(self.policies, self.world.node_views(self.now),
                           self.records.values(), self.all_records())

    def process(self, trigger: Trigger) -> Decision:
        node = trigger.node
        record = self.records.get(node)
        before = self.view()
        decision = step(record, trigger, self.now, before)
        if self.on_step is not None:
            self.on_step(self.now, before, record, trigger, decision)
        if self.keep_decisions:
            self.decisions.append((self.now, record, trigger, decision))
        if self.on_decision is not None:
            self.on_decision(self.now, trigger, decision)
        for src, dst, label in decision.transitions:
            self.timeline.append(TimelineEntry(self.now, node, "transition",
                                               f"{src.value} → {dst.value}  ({label})",
                                               src.value, dst.value))
        new = decision.record
        if new is None:
            self.records.pop(node, None)
        elif releases(new):
            self.records.pop(node, None)
            self.closed.append(new)
        else:
            self.records[node] = new
        for act in decision.actions:
            if isinstance(act, EmitEvent):
                self.timeline.append(TimelineEntry(self.now, node, "event",
                                                   f"{act.reason}: {act.note}"))
            else:
                self.timeline.append(TimelineEntry(self.now, node, "action", act.describe()))
            for t, trig in self.world.execute(act, self.now):
                self.at(t, "trigger", trig)
        if new is not None and decision.recheck_after is not None:
            self._schedule(self._tick_due, "tick", node,
                           self.now + max(decision.recheck_after, 0.001))
        return decision

    def inject(self, trigger: Trigger) -> None:
        self.at(trigger.at, "trigger", trigger)

    # -- results -----------------------------------------------------------------------------

    def all_records(self) -> list[NodeRecord]:
        return [*self.closed, *self.records.values()]

    def final_phase(self, node: str) -> str:
        if node in self.records:
            return self.records[node].phase
        done = [r for r in self.closed if r.node == node]
        return done[-1].phase if done else Phase.HEALTHY.value


def heartbeats(nodes: Iterable[str], start: float, until: float, every: float,
               source: str = "dcgm",
               stopped: Mapping[str, list[tuple[float, float]]] | None = None) -> list[Signal]:
    """FRESH heartbeats for every node, except while its telemetry is stopped."""
    out: list[Signal] = []
    stopped = stopped or {}
    for n in nodes:
        t = start
        while t <= until:
            if not any(a <= t < b for a, b in stopped.get(n, [])):
                out.append(Signal(n, source, SignalKind.FRESH, source, 1.0, t))
            t += every
    return out
