"""The controller's Events, written off the critical path: an EventRecorder that queues.

A remediation's Events tell humans what happened; none of them is intent (the NodeRemediation
is, and it re-emits its latest decision's Events after a restart). Writing them in the node's
worker put one API round trip per Event between the intent record and the action it
announces, and in a burst of faults Events were most of healer's writes. Here :meth:`emit`
queues and returns; one task writes the queue in order with at most ``concurrency`` requests
in flight (so a storm of Events never takes the rate limit's tokens ahead of a cordon for
long), and writes the series updates the recorder has due (:mod:`healer.adapters.kube.events`
folds repeats). The queue is bounded: past ``max_pending`` the oldest waiting Event is dropped,
counted and logged once. :meth:`close` writes what is left within a grace period.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from dataclasses import dataclass
from typing import Protocol

import structlog

from healer.errors import HealerError
from healer.obs.logging import OnceLogger
from healer.ports import EventRecorder

log = structlog.get_logger("healer.events")


class SeriesRecorder(EventRecorder, Protocol):
    """An EventRecorder that folds repeats and writes due series updates on request."""

    def next_series_due(self) -> float | None:
        """Seconds until a series update is due (None: none pending)."""
        ...

    async def flush_series(self) -> int:
        """Write the due series updates; how many."""
        ...


@dataclass(frozen=True, slots=True)
class _Event:
    key: str
    node: str
    reason: str
    note: str
    type: str
    action: str
    remediation: str


class EventQueue:
    """EventRecorder: queue now, write in the background (see the module doc)."""

    def __init__(self, recorder: EventRecorder, *, max_pending: int = 10_000,
                 concurrency: int = 2) -> None:
        self.recorder = recorder
        self.max_pending = max_pending
        self.concurrency = max(1, concurrency)
        self._pending: collections.deque[_Event] = collections.deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._once = OnceLogger("healer.events")
        self.dropped = 0
        self.failed = 0

    def __len__(self) -> int:
        return len(self._pending)

    async def emit(self, *, key: str, node: str, reason: str, note: str, type: str = "Normal",
                   action: str = "", remediation: str = "") -> None:
        if len(self._pending) >= self.max_pending:
            self._pending.popleft()
            self.dropped += 1
            self._once.failed("event-queue", f"more than {self.max_pending} Events waiting; "
                              "the oldest are dropped")
        self._pending.append(_Event(key, node, reason, note, type, action, remediation))
        self._wake.set()
        self._idle.clear()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="events")

    async def _write(self, ev: _Event) -> None:
        try:
            await self.recorder.emit(key=ev.key, node=ev.node, reason=ev.reason, note=ev.note,
                                     type=ev.type, action=ev.action, remediation=ev.remediation)
        except HealerError as e:  # an Event is never a reason to stop: logged, counted
            self.failed += 1
            log.warning("event not written", reason=ev.reason, key=ev.key, error=str(e))

    def _series(self) -> SeriesRecorder | None:
        rec = self.recorder
        if hasattr(rec, "flush_series") and hasattr(rec, "next_series_due"):
            return rec  # type: ignore[return-value]
        return None

    async def _flush_series(self) -> None:
        rec = self._series()
        if rec is None:
            return
        try:
            await rec.flush_series()
        except HealerError as e:
            log.warning("event series not updated", error=str(e))

    def _series_wait(self) -> float | None:
        rec = self._series()
        return None if rec is None else rec.next_series_due()

    async def _run(self) -> None:
        while True:
            while self._pending:
                batch = [self._pending.popleft()
                         for _ in range(min(self.concurrency, len(self._pending)))]
                if len({e.node for e in batch}) < len(batch):  # one node's Events in order
                    for ev in batch:
                        await self._write(ev)
                else:
                    await asyncio.gather(*(self._write(ev) for ev in batch))
            self._once.ok("event-queue")
            self._idle.set()
            await self._flush_series()
            self._wake.clear()
            wait = self._series_wait()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    async def close(self, grace: float = 5.0) -> None:
        """Write what is queued (at most ``grace`` seconds), then stop."""
        task, self._task = self._task, None
        if task is None:
            return
        if self._pending:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._idle.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
