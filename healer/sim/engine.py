"""The simulator's driver of the engine: a simulated clock, an event queue and a world.

Used by ``healer simulate`` (scripted fault traces), ``healer backtest`` (history from
Prometheus) and the property tests. All the deciding is :class:`healer.core.engine.Engine`'s,
the same object the daemon drives; this module adds only what a simulation needs: a discrete
event queue (signals, triggers, timers and callbacks in time order), a world that answers the
actions (the :class:`~healer.sim.world.SimWorld` simulator, or the backtest's optimistic world)
and a timeline of what happened. Nothing here sleeps or reads a clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from healer.core.actions import Action, EmitEvent
from healer.core.budget import BudgetView
from healer.core.engine import Engine
from healer.core.health import Verdict
from healer.core.machine import Decision, Trigger, TriggerKind, releases
from healer.core.model import HealthState, NodeRecord, NodeView, Signal
from healer.core.phases import Phase
from healer.core.rules import PolicySet


class World(Protocol):
    def node_views(self, now: float) -> dict[str, NodeView]: ...

    def touched(self) -> set[str]:
        """The nodes whose view may have changed since the last call (and forget them)."""
        ...

    def view_of(self, node: str, now: float) -> NodeView | None: ...

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
    closed: list[NodeRecord] = field(default_factory=list)
    decisions: list[tuple[float, NodeRecord | None, Trigger, Decision]] = field(
        default_factory=list)
    on_decision: Callable[[float, Trigger, Decision], None] | None = None
    #: called with (now, view before the step, record before, trigger, decision)
    on_step: Callable[[float, BudgetView, NodeRecord | None, Trigger, Decision], None] | None = None
    keep_decisions: bool = False
    keep_timeline: bool = True

    def __post_init__(self) -> None:
        self.now = self.start
        self.engine = Engine(self.policies)
        for view in self.world.node_views(self.start).values():
            self.engine.set_node(view)
        self.world.touched()
        self._queue: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()
        self._tick_due: dict[str, float] = {}
        self._eval_due: dict[str, float] = {}

    @property
    def records(self) -> dict[str, NodeRecord]:
        """The open records, by node."""
        return self.engine.records

    @property
    def evaluations(self) -> int:
        return self.engine.evaluations

    # -- scheduling --------------------------------------------------------------------------

    def at(self, t: float, kind: str, payload: Any) -> None:
        heapq.heappush(self._queue, (t, next(self._seq), kind, payload))

    def add_signal(self, sig: Signal) -> None:
        self.at(sig.observed_at, "signal", sig)

    def add_signals(self, t: float, batch: list[Signal]) -> None:
        """Signals of one instant, delivered together (one poll)."""
        self.at(t, "signals", batch)

    def add_callback(self, t: float, fn: Callable[[float], None]) -> None:
        self.at(t, "call", fn)

    def run(self, until: float) -> None:
        while self._queue and self._queue[0][0] <= until:
            t, _, kind, payload = heapq.heappop(self._queue)
            self.now = max(self.now, t)
            match kind:
                case "signal":
                    self.ingest((payload,))
                case "signals":
                    self.ingest(payload)
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
                    self._sync_world()
        self.now = max(self.now, until)

    def _schedule(self, due: dict[str, float], kind: str, node: str, t: float) -> None:
        cur = due.get(node)
        if cur is not None and cur <= t and cur >= self.now:
            return
        due[node] = t
        self.at(t, kind, node)

    def _sync_world(self) -> None:
        """Tell the engine about the nodes the world changed (never the whole fleet)."""
        for name in sorted(self.world.touched()):
            view = self.world.view_of(name, self.now)
            if view is None:
                self.engine.remove_node(name)
                continue
            if self.engine.set_node(view):
                self._schedule(self._eval_due, "eval", name, self.now)

    # -- signals and verdicts ----------------------------------------------------------------

    def ingest(self, signals: Iterable[Signal]) -> None:
        for node in sorted(self.engine.ingest(signals)):
            self._schedule(self._eval_due, "eval", node, self.now)

    def verdict(self, node: str) -> Verdict:
        return self.engine.verdict(node, self.now)

    def _evaluate(self, node: str) -> None:
        ev = self.engine.evaluate(node, self.now)
        if ev.verdict is None:
            return
        if ev.recheck_at is not None:
            self._schedule(self._eval_due, "eval", node, ev.recheck_at)
        v = ev.verdict
        if ev.changed and self.keep_timeline and not (
                v.state is HealthState.HEALTHY and ev.previous is None):
            self.timeline.append(TimelineEntry(self.now, node, "verdict",
                                               f"{v.state.value}: {v.summary()}"))
        self.on_verdict(node, v)
        if ev.trigger is not None:
            self.process(ev.trigger)

    def on_verdict(self, node: str, verdict: Verdict) -> None:
        """Every evaluation's verdict (a hook for drivers that log them)."""

    # -- steps --------------------------------------------------------------------------------

    def view(self) -> BudgetView:
        return self.engine.view()

    def process(self, trigger: Trigger) -> Decision:
        node = trigger.node
        engine = self.engine
        record = engine.records.get(node)
        before = engine.view()
        decision = engine.decide(node, trigger, self.now, before)
        if self.on_step is not None:
            self.on_step(self.now, before, record, trigger, decision)
        if self.keep_decisions:
            self.decisions.append((self.now, record, trigger, decision))
        if self.on_decision is not None:
            self.on_decision(self.now, trigger, decision)
        if self.keep_timeline:
            for src, dst, label in decision.transitions:
                self.timeline.append(TimelineEntry(self.now, node, "transition",
                                                   f"{src.value} → {dst.value}  ({label})",
                                                   src.value, dst.value))
        engine.commit(node, decision)
        new = decision.record
        if new is not None and new.phase is not Phase.SUSPECT and releases(new):
            self.closed.append(new)
        for act in decision.actions:
            if self.keep_timeline:
                if isinstance(act, EmitEvent):
                    self.timeline.append(TimelineEntry(self.now, node, "event",
                                                       f"{act.reason}: {act.note}"))
                else:
                    self.timeline.append(TimelineEntry(self.now, node, "action",
                                                       act.describe()))
            for t, trig in self.world.execute(act, self.now):
                self.at(t, "trigger", trig)
        self._sync_world()
        tick = engine.next_tick(node, decision, self.now)
        if tick is not None:
            self._schedule(self._tick_due, "tick", node, tick)
        return decision

    def inject(self, trigger: Trigger) -> None:
        self.at(trigger.at, "trigger", trigger)

    # -- results -----------------------------------------------------------------------------

    def all_records(self) -> list[NodeRecord]:
        return [*self.closed, *self.records.values()]

    def final_phase(self, node: str) -> str:
        if node in self.records:
            return self.records[node].phase.value
        done = [r for r in self.closed if r.node == node]
        return done[-1].phase.value if done else Phase.HEALTHY.value
