"""The controller: the daemon's driver of the engine. Signals and node changes in, one serial
worker per node, intent persisted before every action, outcomes fed back as triggers.

Every decision is :class:`healer.core.engine.Engine`'s (the same engine ``healer simulate`` and
``healer backtest`` drive); this module adds the daemon's I/O: asyncio workers and timers, the
state store and leadership. What a Node change means (its condition signals, the triggers an
admin caused) is decided in :mod:`healer.core.node_events`; the node-events source
(:mod:`healer.runtime.node_events`) hands it here as a ``NodeChange``.

Per node, a trigger is handled like this (in the node's worker, never two at once)::

    [fleet lock]  view = the engine's fleet index; decision = engine.decide(node, trigger)
                  if it opens an incident or takes capacity: engine.commit   # reserved
    [no lock]     store.save(decision.record); engine.commit   # intent, before any action
                  (a reserved decision whose write fails is rolled back; one whose actions
                  only look at Slurm waits for the next decision's write: _deferrable)
                  for action in decision.actions: outcome triggers → the same node's queue
                  schedule a TICK at engine.next_tick(...)

The fleet lock makes "check the guardrails, then reserve the admission" atomic across nodes,
so two nodes can never both take the last slot; the write itself happens outside it, so a
burst of admissions is written in parallel (bounded by the API client's connections and rate
limit) and one slow write does not stall the fleet. Nothing acts before its write succeeded.
On becoming leader the controller re-reads every NodeRemediation from the API (not a cache)
and sends each open one a RESUME, which re-issues the steps whose outcome was never recorded
(actions are idempotent); completed steps are never repeated. Losing leadership stops all work
at once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import structlog

from healer.core.actions import EmitEvent, ObserveSlurm
from healer.core.budget import BudgetView, SlurmView, usage
from healer.core.engine import Engine, takes_capacity
from healer.core.health import Verdict, stale_conditions
from healer.core.machine import (
    Decision,
    Trigger,
    TriggerKind,
    recorded_events,
    releases,
)
from healer.core.model import HealthState, NodeRecord, NodeView, Signal
from healer.core.node_events import AdminState, NodeChange, admin_state, admin_triggers
from healer.core.phases import PENDING_ADMISSION, Phase
from healer.core.rules import PolicySet
from healer.core.topology import DOMAIN_LABEL
from healer.errors import ConflictError, HealerError
from healer.obs.logging import OnceLogger
from healer.ports import Clock, StateStore, StoredRecord
from healer.runtime.dispatcher import Dispatcher
from healer.runtime.executor import ActionRunner
from healer.runtime.timers import Timers

log = structlog.get_logger("healer.controller")

#: On taking the lead, the Events of remediations closed this recently are written again.
RECENTLY_CLOSED = 3600.0

@dataclass(frozen=True, slots=True)
class Evaluate:
    """Internal work item: re-evaluate the node's health."""

    at: float


@dataclass(frozen=True, slots=True)
class TimerTick:
    """Internal work item: the node's tick timer fired (``seq``: which arming of it). A tick
    armed before the node's latest decision re-armed it is stale and dropped: under a slow
    API a poll queued behind the very action it would poll only doubled the work."""

    trigger: Trigger
    seq: int


Item = Trigger | Evaluate | TimerTick


@dataclass
class RuntimeSettings:
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
    deferred: int = 0
    """Writes that waited for the next decision's (its actions only looked at Slurm)."""
    last_transition: dict[str, float] = field(default_factory=dict)


class Controller:
    def __init__(self, *, policies: PolicySet, executor: ActionRunner, store: StateStore,
                 clock: Clock, settings: RuntimeSettings | None = None,
                 observer: Any = None, engine: Engine | None = None) -> None:
        self.executor = executor
        self.store = store
        self.clock = clock
        self.settings = settings or RuntimeSettings()
        self.observer = observer  # metrics hooks (healer.obs), optional
        #: the engine (``engine``, when the composition root built it first: readers built
        #: before the controller, such as the NodeSet route, read its node cache)
        self.engine = engine if engine is not None else Engine(policies,
                                                               paused=self.settings.paused)
        self._stored: dict[str, StoredRecord] = {}  # the store's handle of each open record
        self.stats = Stats()
        self.leading = False
        self._lock = asyncio.Lock()
        self._dispatcher: Dispatcher[Item] | None = None
        self._timers: Timers[tuple[str, str], Item] = Timers(clock, self._fire,
                                                             name="controller-timers")
        self._seen: dict[str, tuple[Any, ...]] = {}  # node → last derived-trigger state
        self._warm_until = 0.0
        self._outage = OnceLogger("healer.controller")
        self._stale_conditions: dict[str, tuple[str, ...]] = {}  # node → stale condition/<type>
        #: nodes whose latest record waits for the next decision's write (:meth:`_deferrable`)
        self._dirty: set[str] = set()
        #: per node, how often its tick was armed (a fired tick of an older arming is stale)
        self._tick_seq: dict[str, int] = {}

    # -- state (the engine's) -------------------------------------------------------------------

    @property
    def policies(self) -> PolicySet:
        return self.engine.policies

    def set_policies(self, policies: PolicySet) -> None:
        """A policy reload: held incidents are looked at again under the new policies."""
        for node in self.engine.set_policies(policies):
            self._submit(node, Trigger(TriggerKind.TICK, node, self.clock.now()))

    @property
    def nodes(self) -> Mapping[str, NodeView]:
        return self.engine.nodes

    @property
    def history(self) -> Mapping[str, NodeRecord]:
        """Every known record, by incident id."""
        return self.engine.history

    @property
    def records(self) -> dict[str, StoredRecord]:
        """The open records by node, with their store handles (suspicions have none)."""
        return {n: self._stored.get(n) or StoredRecord(r, r.incident.id)
                for n, r in self.engine.records.items()}

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
        for node in sorted(self.engine.records):
            self._submit(node, Trigger(TriggerKind.RESUME, node, now))
            if node in self.nodes:
                self._derive_triggers(self.nodes[node], now)
        for node in sorted(set(self.nodes) | set(self.engine.signals)):
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
        self._timers.clear()
        if self._dispatcher is not None:
            await self._dispatcher.close()
            self._dispatcher = None
        log.info("stopped leading")

    async def load(self) -> None:
        stored = await self.store.list()
        self._dirty.clear()
        cutoff = self.clock.now() - self.settings.retention_seconds
        self.engine.load((s.record for s in stored), keep_closed_since=cutoff)
        self._stored = {}
        for s in stored:
            if self.engine.records.get(s.record.node) is s.record:
                self._stored[s.record.node] = s

    # -- intake ------------------------------------------------------------------------------

    async def on_signals(self, signals: Sequence[Signal]) -> None:
        """The TelemetrySource sink."""
        now = self.clock.now()
        for node in sorted(self.engine.ingest(signals)):
            self._submit(node, Evaluate(now))

    async def on_node_change(self, change: NodeChange) -> None:
        """A Node changed (:mod:`healer.runtime.node_events`): cache it, ingest its condition
        signals, evaluate it when its inputs changed, queue the triggers an admin caused."""
        now = self.clock.now()
        n = change.view
        if n is None:
            self.engine.remove_node(change.node)
            self._seen.pop(change.node, None)
            for t in change.triggers:  # e.g. a dead node's fencing: the Node was deleted
                self._submit(change.node, t)
            return
        relabelled = self.engine.set_node(n)
        refreshed = change.conditions_refreshed
        if refreshed:  # a heartbeat alone only refreshes the signal: no evaluation (cost: none)
            self.engine.ingest(change.signals)
        if change.conditions_changed or relabelled or (
                refreshed and self.engine.last_state.get(n.name) is HealthState.STALE):
            self._submit(n.name, Evaluate(now))
        self._queue_admin(n.name, change.admin_state, change.triggers)
        if change.new_spare:
            for node in self._held_for(n):
                self._submit(node, Trigger(TriggerKind.CAPACITY, node, now))

    # -- Slurm's view (healer.runtime.slurm_feed) ---------------------------------------------

    def expect_slurm(self) -> None:
        """A Slurm feed runs: until its first read, Slurm's view is unknown (fail safe)."""
        self.engine.fleet.set_slurm_view(SlurmView.UNKNOWN)

    def on_slurm_states(self, changes: Mapping[str, str], *, known: bool) -> None:
        """The Slurm feed's news: ``changes`` (node → Slurm cause, "" = none any more), and
        whether Slurm's view is known. Capacity given back wakes the held admissions."""
        fleet = self.engine.fleet
        was = fleet.slurm_view
        freed = False
        for node, cause in changes.items():
            freed = freed or (not cause and node in fleet.slurm)
            fleet.set_slurm(node, cause)
        fleet.set_slurm_view(SlurmView.OK if known else SlurmView.UNKNOWN)
        if was != fleet.slurm_view:
            log.info("Slurm view", state=fleet.slurm_view, was=was)
        if freed or (known and was is SlurmView.UNKNOWN):
            now = self.clock.now()
            for node, rec in self.engine.records.items():
                if rec.phase in PENDING_ADMISSION and rec.blocked is not None and \
                        rec.blocked.guardrail.counts_capacity:
                    self._submit(node, Trigger(TriggerKind.TICK, node, now))

    def _held_for(self, spare: NodeView) -> list[str]:
        """The nodes held for capacity that a new spare should wake: those of its NVLink
        domain, else the one held longest that may take a spare from another domain (not
        every held node: one spare serves one, and the others' backstop tick tries again)."""
        held = [r for r in self.engine.records.values()
                if r.phase is Phase.HELD_FOR_CAPACITY]
        dom = spare.labels.get(DOMAIN_LABEL)
        near = [r.node for r in held if dom and (v := self.nodes.get(r.node)) is not None
                and v.labels.get(DOMAIN_LABEL) == dom]
        if near:
            return near
        anywhere = [r for r in held if not self._same_domain_only(r)]  # it may serve them
        oldest = min(anywhere, key=lambda r: (r.phase_since, r.node), default=None)
        return [oldest.node] if oldest is not None else []

    def _same_domain_only(self, rec: NodeRecord) -> bool:
        p = self.policies.get(rec.policy)
        return p is not None and p.steps.swap.require_same_domain

    def _derive_triggers(self, n: NodeView, now: float) -> None:
        """Queue what an admin caused on ``n``'s open remediation (a record that just changed
        phase may find it already there, e.g. a repair result)."""
        rec = self.engine.records.get(n.name)
        self._queue_admin(n.name, admin_state(n, rec), admin_triggers(n, rec, now))

    def _queue_admin(self, node: str, state: AdminState | None,
                     triggers: Sequence[Trigger]) -> None:
        """Queue ``triggers`` unless they were derived from this very ``state`` before."""
        if state is None or self._seen.get(node) == state:
            return
        self._seen[node] = state
        for t in triggers:
            self._submit(node, t)

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
        rec = self.engine.records.get(node)
        with structlog.contextvars.bound_contextvars(
                node=node, incident=rec.incident.id if rec else None,
                phase=rec.phase.value if rec else Phase.HEALTHY.value):
            if isinstance(item, Evaluate):
                trigger = self._evaluate(node)
                if trigger is None:
                    return
            elif isinstance(item, TimerTick):
                if item.seq != self._tick_seq.get(node):
                    return  # re-armed since: the newer arming fires instead
                trigger = item.trigger
            else:
                trigger = item
            await self._step(node, trigger)

    def _evaluate(self, node: str) -> Trigger | None:
        now = self.clock.now()
        warming = now < self._warm_until
        ev = self.engine.evaluate(node, now, hold_healthy=warming)
        v = ev.verdict
        if v is None:
            return None
        self._note_stale_conditions(node, v)
        if ev.recheck_at is not None:
            self._schedule(node, "evaluate", ev.recheck_at - now, Evaluate(now))
        if ev.trigger is None:
            if warming and v.state is HealthState.HEALTHY and node in self.engine.records:
                # not yet: the signals that opened this incident may simply not be back yet
                self._schedule(node, "evaluate", self._warm_until - now + 0.01, Evaluate(now))
            return None
        if ev.changed:
            log.info("verdict", node=node, state=v.state.value, summary=v.summary())
        return ev.trigger

    def _note_stale_conditions(self, node: str, v: Verdict) -> None:
        stale, before = stale_conditions(v), self._stale_conditions.pop(node, ())
        if stale:
            self._stale_conditions[node] = stale
        if stale and stale != before:
            log.warning("node condition stale: unknown, never disruptive", node=node,
                        sources=list(stale), summary=v.summary())
        elif before and not stale:
            log.info("node condition fresh again", node=node, sources=list(before))

    def stale_conditions(self) -> dict[str, int]:
        """Nodes with a stale node condition, by ``condition/<type>`` (for
        ``healer_telemetry_stale_nodes``)."""
        return dict(Counter(s for n, srcs in self._stale_conditions.items() if n in self.nodes
                            for s in srcs))

    def view(self) -> BudgetView:
        """What the guardrails see now (O(1): the engine's incremental fleet index)."""
        self.engine.paused = self.settings.paused
        return self.engine.view()

    async def probe(self) -> None:
        """Return once the fleet-wide step lock is free: the daemon's ``reconcile`` heartbeat
        (a step stuck under the lock, e.g. on an API call that never answers, stalls it)."""
        async with self._lock:
            return

    async def _step(self, node: str, trigger: Trigger) -> None:
        async with self._lock:
            if not self.leading:
                return
            record = self.engine.records.get(node)
            stored = self._stored.get(node)
            now = self.clock.now()
            decision = self.engine.decide(node, trigger, now, self.view())
            self.stats.steps += 1
            atomic = takes_capacity(record, decision)
            if atomic:
                # checked and *reserved* under one lock: the next node's decision already
                # counts this one, so no two nodes take one slot; the write happens outside
                # the lock (a burst's admissions are written in parallel, not one by one)
                # and nothing acts before it succeeded; if it fails, the reservation is
                # rolled back
                self.engine.commit(node, decision)
        if not self.leading:
            return
        ok, stored = await self._persist(node, trigger, record, stored, decision,
                                         reserved=atomic)
        if not ok:
            return
        self._commit(node, decision, stored)
        self._observe(node, trigger, decision, record)
        if decision.transitions and node in self.nodes:
            self._derive_triggers(self.nodes[node], now)  # e.g. a repair result already there
        for act in decision.actions:
            self.stats.actions += 1
            for t in await self.executor.run(act, decision.record):
                self._submit(node, t)
        tick = self.engine.next_tick(node, decision, now)
        if tick is not None:
            idle = decision.record == record and not decision.actions
            if not (idle and self._timers.pending((node, "tick"))):
                # a decision that changed nothing keeps the pending tick: a stream of such
                # triggers (telemetry every second) must not postpone a poll forever
                self._schedule(node, "tick", tick - now, Trigger(TriggerKind.TICK, node, tick))

    def _deferrable(self, node: str, record: NodeRecord | None, decision: Decision) -> bool:
        """May this decision's write wait for the next one? Only when it changes nothing in
        the world: its actions only read (look at Slurm) or report (Events), so a decision
        follows at once and writes both. Intent before action is kept: every action that
        changes something runs after a write that names it. Lost in a crash, the outcome it
        recorded is found again (the look at Slurm is repeated on resume)."""
        new = decision.record
        if new is None or record is None or node not in self._stored or releases(new):
            return False
        acts = decision.actions
        return bool(acts) and all(isinstance(a, (ObserveSlurm, EmitEvent)) for a in acts) \
            and any(isinstance(a, ObserveSlurm) for a in acts)

    async def _persist(self, node: str, trigger: Trigger, record: NodeRecord | None,
                       stored: StoredRecord | None, decision: Decision, *,
                       reserved: bool = False) -> tuple[bool, StoredRecord | None]:
        """Write the decision's record (intent) if it changed; False when it could not be
        (a ``reserved`` decision, committed ahead of its write, is then rolled back)."""
        new = decision.record
        if new is None or new.phase is Phase.SUSPECT or (
                new == record and node not in self._dirty):
            return True, stored
        if self._deferrable(node, record, decision):
            self._dirty.add(node)
            self.stats.deferred += 1
            return True, stored
        try:
            stored = await self.store.save(new, stored)
        except ConflictError:
            # someone else wrote this record: take the API's version and try again
            self.stats.conflicts += 1
            if reserved:
                self._rollback(node, record, new)
            await self._reload(node, record)
            self._schedule(node, "retry", 0.05, trigger)
            return False, stored
        except HealerError as e:
            if reserved:
                self._rollback(node, record, new)
            self._outage.failed("state store", str(e))
            self._schedule(node, "retry", self.settings.retry_delay, trigger)
            return False, stored
        self._outage.ok("state store")
        self._dirty.discard(node)
        self.stats.persisted += 1
        return True, stored

    def _rollback(self, node: str, before: NodeRecord | None, new: NodeRecord) -> None:
        """Undo a reservation whose write failed: the engine is back where it was."""
        if before is None or before.phase is Phase.SUSPECT or \
                before.incident.id != new.incident.id:
            self.engine.commit(node, Decision(None))
            self.engine.forget(new.incident.id)
        if before is not None:
            self.engine.commit(node, Decision(before))

    def _commit(self, node: str, decision: Decision, stored: StoredRecord | None) -> None:
        self.engine.commit(node, decision)
        new = decision.record
        if new is None or new.phase is Phase.SUSPECT or releases(new):
            self._stored.pop(node, None)
            return
        assert stored is not None
        self._stored[node] = replace(stored, record=new)

    async def _reload(self, node: str, record: NodeRecord | None) -> None:
        fresh = {s.record.node: s for s in await self.store.list() if not releases(s.record)}
        if node in fresh:
            self._commit(node, Decision(fresh[node].record), fresh[node])
        elif record is not None:
            self._commit(node, Decision(None), None)

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
        if self.leading:
            if kind == "tick" and isinstance(item, Trigger):
                seq = self._tick_seq[node] = self._tick_seq.get(node, 0) + 1
                item = TimerTick(item, seq)
            self._timers.schedule((node, kind), delay, item)

    def _fire(self, key: tuple[str, str], item: Item) -> None:
        now = self.clock.now()
        if isinstance(item, TimerTick):
            self._submit(key[0], replace(item, trigger=replace(item.trigger, at=now)))
        elif isinstance(item, Trigger):
            self._submit(key[0], replace(item, at=now))
        else:
            self._submit(key[0], Evaluate(now))

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
                self.engine.forget(rec.incident.id)
                gone += 1
        if gone:
            log.info("deleted closed remediations past retention", count=gone)
        return gone

    # -- introspection ----------------------------------------------------------------------------

    def debug_state(self) -> dict[str, Any]:
        return {
            "leading": self.leading,
            "workers": self._dispatcher.workers if self._dispatcher else {},
            "open": {n: {"phase": s.record.phase.value, "incident": s.record.incident.id,
                         "blocked": s.record.blocked.to_dict() if s.record.blocked else None,
                         "spare": s.record.spare} for n, s in self.records.items()},
            "timers": len(self._timers),
            "staleConditions": {n: list(s) for n, s in sorted(self._stale_conditions.items())},
            "guardrails": [asdict(u) for u in usage(self.view(), self.clock.now())],
            "slurm": {"view": self.engine.fleet.slurm_view,
                      "unavailable": dict(sorted(self.engine.fleet.slurm.items()))},
            "stats": {"steps": self.stats.steps, "persisted": self.stats.persisted,
                      "deferred": self.stats.deferred,
                      "conflicts": self.stats.conflicts, "actions": self.stats.actions},
        }

    async def drain(self, grace: float) -> None:
        if self._dispatcher is not None:
            await self._dispatcher.drain(grace)
