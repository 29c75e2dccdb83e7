"""One serial worker per key (node), many keys in parallel; idle workers are reaped.

Items for one key are handled strictly in order, never two at once; different keys run
concurrently. A worker that finds its queue empty for ``idle_timeout`` seconds exits and is
recreated on the next item (kopf's queueing, in a few lines).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Dispatcher(Generic[T]):
    def __init__(self, handler: Callable[[str, T], Awaitable[None]], *,
                 idle_timeout: float = 60.0,
                 on_error: Callable[[str, T, BaseException], None] | None = None) -> None:
        self._handler = handler
        self._idle = idle_timeout
        self._on_error = on_error
        self._queues: dict[str, asyncio.Queue[T]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    def submit(self, key: str, item: T) -> None:
        if self._closed:
            return
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = asyncio.Queue()
        q.put_nowait(item)
        w = self._workers.get(key)
        if w is None or w.done():
            self._workers[key] = asyncio.create_task(self._work(key, q), name=f"worker:{key}")

    async def _work(self, key: str, q: asyncio.Queue[T]) -> None:
        while True:
            try:
                # idle in real time: reaping frees memory, it decides nothing
                item = await asyncio.wait_for(q.get(), self._idle)
            except TimeoutError:
                if q.empty():
                    # reap: nothing arrived while idle; the next submit starts a new worker
                    if self._queues.get(key) is q:
                        del self._queues[key]
                    self._workers.pop(key, None)
                    return
                continue
            try:
                await self._handler(key, item)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # one bad item must not kill the node's worker
                if self._on_error is not None:
                    self._on_error(key, item, e)
            finally:
                q.task_done()

    @property
    def workers(self) -> dict[str, int]:
        """Live workers and their queue depth."""
        return {k: self._queues[k].qsize() for k in self._workers if k in self._queues}

    async def drain(self, grace: float) -> None:
        """Wait until every queue is empty (or ``grace`` seconds pass)."""
        async def all_done() -> None:
            for q in list(self._queues.values()):
                await q.join()
        with contextlib.suppress(TimeoutError):  # the shutdown grace is real time (SIGTERM)
            await asyncio.wait_for(all_done(), grace)

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._workers.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._workers.clear()
        self._queues.clear()
