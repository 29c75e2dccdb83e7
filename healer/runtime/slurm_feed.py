"""The Slurm feed: Slurm's node states, read every interval off the event loop's hot path, fed
into the guardrails as changes only (issue 12: guardrails count what Slurm counts).

Each read (:class:`~healer.ports.SlurmStates`, one listing of the fleet) becomes a cause per
Kubernetes node (:func:`healer.core.unavailability.slurm_cause`: DOWN, NOT_RESPONDING, FAIL,
drained or draining by anyone, REBOOT_ISSUED, powering down, MAINT). Only the nodes whose cause
changed since the previous read reach the controller, so the core's work follows change, not
fleet size. The read itself runs as its own task with a timeout; the event loop only awaits it.

Slurm as a detector (issue 14): the same read gives every node's *finding*
(:func:`healer.core.slurm_signals.next_finding`: DOWN, NOT_RESPONDING, FAIL, or drained with
someone else's reason, with that reason, its user and time; healer's own drains never count).
A node whose finding changed gets one SLURM signal (``slurm:`` policy rules match it); a node
whose Slurm state did not change since the previous read costs a tuple comparison. While
Slurm's view is lost the findings last read stand.

Failing safe: when Slurm cannot be read (an error, a timeout, an answer that does not parse)
for longer than ``grace`` (default: three intervals), Slurm's view is *unknown*: the
controller stops admitting disruptive remediations in scopes whose ``maxUnavailable`` or
failure-domain limits would need it (guardrail ``slurm-unknown``), keeps the causes it last
read, and says so in ``healer_slurm_view`` and ``/debug/state``. The first good read makes it
known again. Recovery is never blocked (the guardrails gate only admissions).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

import structlog

from healer.core.model import Signal
from healer.core.slurm_signals import OUT_FLAGS, SlurmFinding, finding_signal, next_finding
from healer.core.unavailability import slurm_cause
from healer.errors import HealerError
from healer.obs.logging import OnceLogger
from healer.ports import Clock, SlurmNodeState, SlurmStates

log = structlog.get_logger("healer.slurm_feed")

#: Default seconds between two reads of Slurm's node states.
DEFAULT_INTERVAL = 10.0


class SlurmSink(Protocol):
    def on_slurm_states(self, changes: Mapping[str, str], *, known: bool) -> None: ...

    async def on_signals(self, signals: Sequence[Signal]) -> None: ...


class SlurmFeed:
    """Polls ``states`` every ``interval`` seconds and tells ``sink`` what changed."""

    def __init__(self, states: SlurmStates, sink: SlurmSink, clock: Clock, *,
                 interval: float = DEFAULT_INTERVAL, timeout: float | None = None,
                 grace: float | None = None,
                 on_view: Callable[[bool, str], Awaitable[None]] | None = None) -> None:
        if not interval > 0:
            raise ValueError(f"the Slurm state interval must be > 0 s, not {interval!r}")
        self.states = states
        self.sink = sink
        self.clock = clock
        self.interval = interval
        self.timeout = timeout if timeout is not None else max(interval, 5.0)
        self.grace = grace if grace is not None else 3 * interval
        self.causes: dict[str, str] = {}  # node -> cause, as last read (only nodes with one)
        self.findings: dict[str, SlurmFinding] = {}  # node -> what Slurm finds (nodes with one)
        self._seen: dict[str, tuple[object, ...]] = {}  # node -> its state behind the finding
        self.known = False
        self.last_success: float | None = None  # the clock's time
        self.reads = 0
        self.failures = 0
        self.last_error = ""
        self._outage = OnceLogger("healer.slurm_feed")
        #: told (known, why not) whenever either changes: the daemon's dependency status
        self.on_view = on_view
        self._told: tuple[bool, str] | None = None

    async def run(self) -> None:
        while True:
            await self.poll()
            await self.clock.sleep(self.interval)

    async def poll(self) -> None:
        """One read; changes (or the loss of Slurm's view) go to the sink."""
        try:
            # a bound on a Slurm call, in real time (not the daemon's clock)
            got = await asyncio.wait_for(self.states.node_states(), self.timeout)
            causes = _causes(got)
            signals = self._findings(got)
        except (HealerError, TimeoutError, ValueError, KeyError, TypeError) as e:
            self._failed(f"{type(e).__name__}: {e}"[:600])
            if not self.known:
                await self._tell(False, self.last_error)
            return
        self._outage.ok("Slurm node states")
        self.reads += 1
        self.last_success = self.clock.now()
        changes = {n: c for n, c in causes.items() if self.causes.get(n) != c}
        changes.update({n: "" for n in self.causes if n not in causes})
        self.causes = causes
        was = self.known
        self.known = True
        if changes or not was:
            self.sink.on_slurm_states(changes, known=True)
        if signals:
            await self.sink.on_signals(signals)
        await self._tell(True, "")

    async def _tell(self, known: bool, why: str) -> None:
        if self.on_view is None or self._told == (known, why):
            return
        self._told = (known, why)
        try:
            await self.on_view(known, why)
        except HealerError as e:  # an Event that cannot be written must not stop the feed
            log.warning("Slurm view change not reported", error=str(e)[:300])

    def _findings(self, states: Mapping[str, SlurmNodeState]) -> list[Signal]:
        """The SLURM signals of the nodes whose finding changed (and remembers them)."""
        now = self.clock.now()
        out: list[Signal] = []
        seen: dict[str, tuple[object, ...]] = {}
        findings: dict[str, SlurmFinding] = {}
        for node, st in states.items():
            prev = self.findings.get(node)
            if prev is None and st.base != "DOWN" and st.flags.isdisjoint(OUT_FLAGS):
                continue  # Slurm finds nothing wrong, and found nothing before: no work
            key = (st.base, st.flags, st.reason, st.reason_user, st.reason_time)
            if prev is not None and self._seen.get(node) == key:
                seen[node], findings[node] = key, prev  # unchanged: nothing to work out
                continue
            found = next_finding(prev, base=st.base, flags=st.flags, reason=st.reason,
                                 user=st.reason_user, reason_time=st.reason_time, now=now)
            if found is not None:
                seen[node], findings[node] = key, found
            if found != prev:
                out.append(finding_signal(node, found, now))
        out.extend(finding_signal(n, None, now) for n in self.findings
                   if n not in findings and n not in states)
        self.findings, self._seen = findings, seen
        return out

    def _failed(self, error: str) -> None:
        self.failures += 1
        self.last_error = error
        self._outage.failed("Slurm node states", error)
        if self.last_success is None or self.clock.now() - self.last_success >= self.grace:
            if self.known or self.reads == 0:  # the loss is news (or nothing was ever read)
                self.sink.on_slurm_states({}, known=False)
            self.known = False

    def metrics(self) -> dict[str, object]:
        """What ``healer_slurm_view_*`` report."""
        return {"known": self.known, "last_success": self.last_success}

    def debug(self) -> dict[str, object]:
        return {"known": self.known, "interval": self.interval, "reads": self.reads,
                "failures": self.failures, "last_error": self.last_error,
                "unavailable": dict(sorted(self.causes.items())),
                "findings": {n: f.describe() for n, f in sorted(self.findings.items())}}


def _causes(states: Mapping[str, SlurmNodeState]) -> dict[str, str]:
    out: dict[str, str] = {}
    for node, st in states.items():
        cause = slurm_cause(st.base, st.flags)
        if cause:
            out[str(node)] = cause
    return out
