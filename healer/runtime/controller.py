"""The controller: signals and node events in, one serial worker per node, intent persisted
before every action, outcomes fed back as triggers.

Per node, a trigger is handled like this (in the node's worker, never two at once)::

    [fleet lock]  view = fleet snapshot; decision = step(record, trigger, now, view)
                  store.save(decision.record)          # intent, before any action runs
    [no lock]     for action in decision.actions: outcome triggers → the same node's queue
                  schedule a TICK after decision.recheck_after

The fleet lock makes "check the guardrails, then record the admission" atomic across nodes, so
two nodes can never both take the last slot. On becoming leader the controller re-reads every
NodeRemediation from the API (not a cache) and sends each open one a RESUME, which re-issues
the steps whose outcome was never recorded (actions are idempotent); completed steps are never
repeated. Losing leadership stops all work at once.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import structlog

from healer.core.budget import BudgetView, usage
from healer.core.fleet import budget_view, verdict_needs_step
from healer.core.health import evaluate_node
from healer.core.machine import (
    EXCLUDE_LABEL,
    Decision,
    Trigger,
    TriggerKind,
    recorded_events,
    releases,
    step,
)
from healer.core.model import HealthState, NodeRecord, NodeView, Signal, SignalKind
from healer.core.phases import MAY_BE_CORDONED, Phase
from healer.core.policy import PolicySet
from healer.errors import ConflictError, HealerError
from healer.obs.logging import OnceLogger
from healer.ports import Clock, NodeEvent, StateStore, StoredRecord
from healer.runtime.dispatcher import Dispatcher
from healer.runtime.executor import Executor

log = structlog.get_logger("healer.controller")

PAUSE_ANNOTATION = "healer.io/paused"
#: On taking the lead, the Events of remediations closed this recently are written again.
RECENTLY_CLOSED = 3600.0
REPAIR_RESULT = "healer.io/repair-result"
INCIDENT_ANNOTATION = "healer.io/incident"
CORDONED_BY = "healer.io/cordoned-by"


@dataclass(frozen=True, slots=True)
class Evaluate:
    """Internal work item: re-evaluate the node's health."""

    at: float


Item = Trigger | Evaluate


@dataclass
class RuntimeSettings:
    history_seconds: float = 2 * 86400.0
    """How long signals are kept per node (must exceed every rule's window)."""
    retention_seconds: float = 30 * 86400.0
    """Closed records older than this no longer count for breakers and retry budgets."""
    idle_worker_seconds: float = 60.0
    retry_delay: float = 5.0
    """After a failed persist, how long until the trigger is tried again."""
    warmup_seconds: float = 60.0
    """After (re)gaining leadership, a *healthy* verdict does not recover an open remediation
    until this long has passed: the telemetry that opened it has to be observed again first
    (a new leader starts with no signal history)."""
    paused: bool = False


@dataclass
class Stats:
    steps: int = 0
    persisted: int = 0
    conflicts: int = 0
    actions: int = 0
    dropped: int = 0
    last_transition: dict[str, float] = field(default_factory=dict)


class Controller:
    def __init__(self, *, policies: PolicySet, executor: Executor, store: StateStore,
                 clock: Clock, settings: RuntimeSettings | None = None,
                 observer: Any = None) -> None:
        self.policies = policies
        self.executor = executor
        self.store = store
        self.clock = clock
        self.settings = settings or RuntimeSettings()
        self.observer = observer  # metrics hooks (healer.obs), optional
        self.records: dict[str, StoredRecord] = {}  # open records, by node
        self.history: dict[str, NodeRecord] = {}  # every known record, by incident id
        self.nodes: dict[str, NodeView] = {}
        self.signals: dict[str, list[Signal]] = defaultdict(list)
        self.last_state: dict[str, HealthState] = {}
        self.stats = Stats()
        self.leading = False
        self._lock = asyncio.Lock()
        self._dispatcher: Dispatcher[Item] | None = None
        self._timers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._seen: dict[str, tuple[Any, ...]] = {}  # node → last derived-trigger state
        self._warm_until = 0.0
        self._outage = OnceLogger("healer.controller")

    # -- leadership ------------------------------------------------------------------------------

    async def start_leading(self) -> None:
        """Load every record from the API, then resume the open ones."""
        self._dispatcher = Dispatcher(self._handle, idle_timeout=self.settings.idle_worker_seconds,
                                      on_error=self._on_error)
        await self.load()
        self._warm_until = self.clock.now() + self.settings.warmup_seconds
        self.leading = True
        log.info("leading", open=len(self.records), known=len(self.history))
        now = self.clock.now()
        self._seen.clear()
        for node in sorted(self.records):
            self._submit(node, Trigger(TriggerKind.RESUME, node, now))
            if node in self.nodes:
                self._derive_triggers(self.nodes[node], now)
        for node in sorted(set(self.nodes) | set(self.signals)):
            self._submit(node, Evaluate(now))
        # a remediation closed just before the previous leader died may not have had its
        # last Events written: write them again (idempotent by key; open ones do it on RESUME)
        for rec in list(self.history.values()):
            if releases(rec) and rec.events and now - rec.phase_since < RECENTLY_CLOSED:
                for act in recorded_events(rec):
                    await self.executor.run(act, rec)

    async def stop_leading(self) -> None:
        """Stop acting at once: no queued item is handled, timers are cancelled."""
        self.leading = False
        for t in self._timers.values():
            t.cancel()
        self._timers.clear()
        if self._dispatcher is not None:
            await self._dispatcher.close()
            self._dispatcher = None
        log.info("stopped leading")

    async def load(self) -> None:
        stored = await self.store.list()
        self.records.clear()
        self.history.clear()
        cutoff = self.clock.now() - self.settings.retention_seconds
        for s in sorted(stored, key=lambda s: s.record.incident.opened_at):
            rec = s.record
            if rec.incident.opened_at >= cutoff or not releases(rec):
                self.history[rec.incident.id] = rec
            if not releases(rec):
                prev = self.records.get(rec.node)
                if prev is not None and prev.record.incident.opened_at > rec.incident.opened_at:
                    continue
                self.records[rec.node] = s
                # re-seed what cannot be observed again: the events that opened the incident
                known = set(self.signals[rec.node])
                self.signals[rec.node].extend(e for e in rec.incident.evidence if e not in known)

    # -- intake ------------------------------------------------------------------------------

    async def on_signals(self, signals: Sequence[Signal]) -> None:
        """The TelemetrySource sink."""
        now = self.clock.now()
        touched: set[str] = set()
        for sig in signals:
            hist = self.signals[sig.node]
            if sig.kind is SignalKind.XID and sig in hist[-256:]:
                continue  # the same occurrence re-reported (a source's restart, re-seeding)
            hist.append(sig)
            if sig.kind is not SignalKind.FRESH or self.last_state.get(sig.node) in (
                    None, HealthState.STALE):
                touched.add(sig.node)
        for node in touched:
            self._prune(node, now)
            self._submit(node, Evaluate(now))

    def _prune(self, node: str, now: float) -> None:
        hist = self.signals[node]
        cutoff = now - self.settings.history_seconds
        if hist and (hist[0].observed_at < cutoff or len(hist) > 20000):
            kept = [s for s in hist if s.observed_at >= cutoff]
            # keep the latest heartbeat of each source even if old, for staleness
            self.signals[node] = kept[-20000:]

    async def on_node_event(self, ev: NodeEvent) -> None:
        """Node watch events: cache, condition signals, and the triggers admins cause."""
        now = self.clock.now()
        if ev.type == "SYNCED":
            return
        if ev.node is None:
            return
        n = ev.node
        if ev.type == "DELETED":
            self.nodes.pop(n.name, None)
            return
        prev = self.nodes.get(n.name)
        self.nodes[n.name] = n
        sigs = [Signal(n.name, "k8s", SignalKind.CONDITION, c.type, c.last_transition or now,
                       now, None, Signal.details(status=c.status, reason=c.reason,
                                                 message=c.message[:200]))
                for c in n.conditions]
        changed = prev is None or prev.conditions != n.conditions
        if changed:
            self.signals[n.name].extend(sigs)
            self._prune(n.name, now)
            self._submit(n.name, Evaluate(now))
        self._derive_triggers(n, now)
        if prev is not None and prev.labels != n.labels:
            spare_sel = self.policies.fleet.spare_selector
            if spare_sel.matches(n.labels) and not spare_sel.matches(prev.labels):
                for node, s in list(self.records.items()):
                    if Phase(s.record.phase) is Phase.HELD_FOR_CAPACITY:
                        self._submit(node, Trigger(TriggerKind.CAPACITY, node, now))

    def _derive_triggers(self, n: NodeView, now: float) -> None:
        s = self.records.get(n.name)
        if s is None:
            return
        rec = s.record
        ann = n.annotations
        phase = Phase(rec.phase)
        state = (n.unschedulable, ann.get(INCIDENT_ANNOTATION), ann.get(CORDONED_BY),
                 n.labels.get(EXCLUDE_LABEL), ann.get(REPAIR_RESULT), rec.incident.id, phase)
        if self._seen.get(n.name) == state:
            return
        self._seen[n.name] = state
        ours = ann.get(INCIDENT_ANNOTATION) == rec.incident.id and ann.get(CORDONED_BY) == "healer"
        if ours and not n.unschedulable and phase in MAY_BE_CORDONED:
            self._submit(n.name, Trigger(TriggerKind.ADMIN_UNCORDON, n.name, now,
                                         incident=rec.incident.id))
        if n.labels.get(EXCLUDE_LABEL, "").lower() == "true":
            self._submit(n.name, Trigger(TriggerKind.OPT_OUT, n.name, now,
                                         incident=rec.incident.id))
        result = ann.get(REPAIR_RESULT, "").lower()  # a repair system's (or human's) verdict
        if phase is Phase.REPAIR and result in ("passed", "failed"):
            self._submit(n.name, Trigger(TriggerKind.REPAIR, n.name, now,
                                         incident=rec.incident.id,
                                         repair_passed=result == "passed"))

    # -- the worker ------------------------------------------------------------------------------

    def _submit(self, node: str, item: Item) -> None:
        if self.leading and self._dispatcher is not None:
            self._dispatcher.submit(node, item)

    def inject(self, trigger: Trigger) -> None:
        """Queue a trigger (tests, admin tooling)."""
        self._submit(trigger.node, trigger)

    def _on_error(self, node: str, item: Item, e: BaseException) -> None:
        log.error("worker error", node=node, item=type(item).__name__, error=repr(e))
        self._schedule(node, "retry", self.settings.retry_delay, item)

    async def _handle(self, node: str, item: Item) -> None:
        if not self.leading:
            return
        s = self.records.get(node)
        with structlog.contextvars.bound_contextvars(
                node=node, incident=s.record.incident.id if s else None,
                phase=s.record.phase if s else "Healthy"):
            if isinstance(item, Evaluate):
                trigger = self._evaluate(node)
                if trigger is None:
                    return
            else:
                trigger = item
            await self._step(node, trigger)

    def _evaluate(self, node: str) -> Trigger | None:
        now = self.clock.now()
        view = self.nodes.get(node)
        if view is None:
            return None
        policies = self.policies.policies_for(view)
        v = evaluate_node(node, self.signals.get(node, []), policies, now)
        prev = self.last_state.get(node)
        self.last_state[node] = v.state
        if v.recheck_after is not None:
            self._schedule(node, "evaluate", max(v.recheck_after, 0.05), Evaluate(now))
        rec = self.records.get(node)
        if prev == v.state and not verdict_needs_step(v, rec.record if rec else None):
            return None
        if rec is not None and v.state is HealthState.HEALTHY and now < self._warm_until:
            # not yet: the signals that opened this incident may simply not be back yet
            self.last_state.pop(node, None)
            self._schedule(node, "evaluate", self._warm_until - now + 0.01, Evaluate(now))
            return None
        if prev != v.state:
            log.info("verdict", node=node, state=v.state.value, summary=v.summary())
        return Trigger(TriggerKind.VERDICT, node, now, verdict=v)

    def view(self) -> BudgetView:
        paused_nodes = frozenset(n for n, v in self.nodes.items()
                                 if v.annotations.get(PAUSE_ANNOTATION, "").lower() == "true")
        return budget_view(self.policies, self.nodes, (s.record for s in self.records.values()),
                           self.history.values(), paused=self.settings.paused,
                           paused_nodes=paused_nodes)

    async def _step(self, node: str, trigger: Trigger) -> None:
        async with self._lock:
            if not self.leading:
                return
            stored = self.records.get(node)
            record = stored.record if stored is not None else None
            now = self.clock.now()
            decision = step(record, trigger, now, self.view())
            self.stats.steps += 1
            new = decision.record
            if new is not None and new != record and Phase(new.phase) is not Phase.SUSPECT:
                try:
                    stored = await self.store.save(new, stored)
                except ConflictError:
                    # someone else wrote this record: take the API's version and try again
                    self.stats.conflicts += 1
                    await self._reload(node, record)
                    self._schedule(node, "retry", 0.05, trigger)
                    return
                except HealerError as e:
                    self._outage.failed("state store", str(e))
                    self._schedule(node, "retry", self.settings.retry_delay, trigger)
                    return
                self._outage.ok("state store")
                self.stats.persisted += 1
            self._commit(node, decision, stored)
        self._observe(node, trigger, decision, record)
        if decision.transitions and node in self.nodes:
            self._derive_triggers(self.nodes[node], now)  # e.g. a repair result already there
        for act in decision.actions:
            self.stats.actions += 1
            for t in await self.executor.run(act, decision.record):
                self._submit(node, t)
        if decision.record is not None and decision.recheck_after is not None:
            pending = self._timers.get((node, "tick"))
            idle = decision.record == record and not decision.actions
            if not (idle and pending is not None and not pending.done()):
                # a decision that changed nothing keeps the pending tick: a stream of such
                # triggers (telemetry every second) must not postpone a poll forever
                self._schedule(node, "tick", max(decision.recheck_after, 0.05),
                               Trigger(TriggerKind.TICK, node, now + decision.recheck_after))

    def _commit(self, node: str, decision: Decision, stored: StoredRecord | None) -> None:
        new = decision.record
        if new is None:
            self.records.pop(node, None)
            return
        if Phase(new.phase) is Phase.SUSPECT:
            self.records[node] = StoredRecord(new, new.incident.id)
            return
        assert stored is not None
        stored = replace(stored, record=new)
        self.history[new.incident.id] = new
        if releases(new):
            self.records.pop(node, None)
        else:
            self.records[node] = stored

    async def _reload(self, node: str, record: NodeRecord | None) -> None:
        fresh = {s.record.node: s for s in await self.store.list() if not releases(s.record)}
        if node in fresh:
            self.records[node] = fresh[node]
            self.history[fresh[node].record.incident.id] = fresh[node].record
        elif record is not None:
            self.records.pop(node, None)

    def _observe(self, node: str, trigger: Trigger, decision: Decision,
                 before: NodeRecord | None) -> None:
        for src, dst, label in decision.transitions:
            self.stats.last_transition[node] = trigger.at
            log.info("transition", node=node, incident=decision.record.incident.id
                     if decision.record else None, source=src.value, target=dst.value,
                     trigger=label)
        if self.observer is not None:
            self.observer.on_decision(node, trigger, decision, before)

    def _schedule(self, node: str, kind: str, delay: float, item: Item) -> None:
        key = (node, kind)
        old = self._timers.get(key)
        if old is not None and not old.done():
            old.cancel()

        async def fire() -> None:
            await self.clock.sleep(delay)
            self._timers.pop(key, None)
            if isinstance(item, Trigger):
                self._submit(node, replace(item, at=self.clock.now()))
            else:
                self._submit(node, Evaluate(self.clock.now()))

        if self.leading:
            self._timers[key] = asyncio.create_task(fire(), name=f"timer:{node}:{kind}")

    async def collect_garbage(self) -> int:
        """Delete closed records older than the retention period (they no longer count for the
        breaker or the retry budgets). Returns how many were deleted."""
        if not self.leading:
            return 0
        cutoff = self.clock.now() - self.settings.retention_seconds
        gone = 0
        for s in await self.store.list():
            rec = s.record
            if releases(rec) and rec.phase_since < cutoff and rec.incident.opened_at < cutoff:
                await self.store.delete(s.name)
                self.history.pop(rec.incident.id, None)
                gone += 1
        if gone:
            log.info("deleted closed remediations past retention", count=gone)
        return gone

    # -- introspection ----------------------------------------------------------------------------

    def debug_state(self) -> dict[str, Any]:
        return {
            "leading": self.leading,
            "workers": self._dispatcher.workers if self._dispatcher else {},
            "open": {n: {"phase": s.record.phase, "incident": s.record.incident.id,
                         "blocked": s.record.blocked.to_dict() if s.record.blocked else None,
                         "spare": s.record.spare} for n, s in self.records.items()},
            "timers": len(self._timers),
            "guardrails": [asdict(u) for u in usage(self.view(), self.clock.now())],
            "stats": {"steps": self.stats.steps, "persisted": self.stats.persisted,
                      "conflicts": self.stats.conflicts, "actions": self.stats.actions},
        }

    async def drain(self, grace: float) -> None:
        if self._dispatcher is not None:
            await self._dispatcher.drain(grace)

    def open_phase(self, node: str) -> Phase:
        s = self.records.get(node)
        return Phase(s.record.phase) if s is not None else Phase.HEALTHY
