"""The controller's timers: one heap served by one task, however many nodes wait.

Every node may have a few pending wake-ups (the next evaluation, the next tick, a retry). At
fleet scale an asyncio task per timer costs memory and a task switch per re-arm; here a timer
is a heap entry, re-arming one replaces its entry (the old one is dropped lazily, and the heap
is compacted when dropped entries outnumber live ones, so it never grows with uptime), and a
single task sleeps until the earliest one is due.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from healer.ports import Clock

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Timers(Generic[K, V]):
    """Keyed one-shot timers: ``fire(key, value)`` runs once ``delay`` seconds have passed."""

    def __init__(self, clock: Clock, fire: Callable[[K, V], None], *, name: str = "timers"
                 ) -> None:
        self._clock = clock
        self._fire = fire
        self._name = name
        self._heap: list[tuple[float, int, K]] = []
        self._due: dict[K, tuple[float, int, V]] = {}
        self._seq = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._armed_for: float | None = None  # when the serving task wakes next

    def __len__(self) -> int:
        return len(self._due)

    def pending(self, key: K) -> bool:
        return key in self._due

    def schedule(self, key: K, delay: float, value: V) -> None:
        """Arm (or re-arm) ``key``: it fires once, ``delay`` seconds from now."""
        at = self._clock.now() + max(delay, 0.0)
        seq = next(self._seq)
        self._due[key] = (at, seq, value)
        heapq.heappush(self._heap, (at, seq, key))
        if len(self._heap) > 2 * len(self._due) + 64:
            self._heap = [(a, s, k) for k, (a, s, _) in self._due.items()]
            heapq.heapify(self._heap)
        if self._armed_for is None or at < self._armed_for:
            self._rearm()

    def cancel(self, key: K) -> None:
        self._due.pop(key, None)

    def clear(self) -> None:
        self._due.clear()
        self._heap.clear()
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._armed_for = None

    async def close(self) -> None:
        task = self._task
        self.clear()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _rearm(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._armed_for = None
        self._task = asyncio.create_task(self._serve(), name=self._name)

    def _live_head(self) -> tuple[float, int, K] | None:
        heap = self._heap
        while heap:
            _, seq, key = heap[0]
            due = self._due.get(key)
            if due is not None and due[1] == seq:
                return heap[0]
            heapq.heappop(heap)
        return None

    async def _serve(self) -> None:
        while True:
            head = self._live_head()
            if head is None:
                self._armed_for = None
                self._task = None
                return
            at, _, key = head
            delay = at - self._clock.now()
            if delay > 0:
                self._armed_for = at
                await self._clock.sleep(delay)
                continue
            self._armed_for = at  # serving: a timer due later is picked up by this loop
            heapq.heappop(self._heap)
            _, _, value = self._due.pop(key)
            self._fire(key, value)
