"""/healthz tells the truth about a stalled loop: the reconcile heartbeat (the controller's step
lock) and the policy-reload heartbeat go stale while their loop is stuck."""

from __future__ import annotations

import asyncio

from healer.adapters.clock import SYSTEM_CLOCK
from healer.obs.http import Health
from healer.runtime.loops import RECONCILE_MAX_AGE, reconcile_heartbeat


async def test_a_step_stuck_under_the_lock_makes_healthz_fail() -> None:
    now = [1000.0]
    health = Health(clock=lambda: now[0])
    lock = asyncio.Lock()

    async def probe() -> None:
        async with lock:
            return

    beat = asyncio.Event()
    real_beat = health.beat

    def counting_beat(name: str, max_age: float) -> None:
        real_beat(name, max_age)
        beat.set()

    health.beat = counting_beat  # type: ignore[method-assign]
    task = asyncio.create_task(reconcile_heartbeat(health, probe, SYSTEM_CLOCK, every=0.01))
    try:
        await asyncio.wait_for(beat.wait(), 30)
        assert health.healthy()[0]
        async with lock:  # a step that never finishes
            beat.clear()
            now[0] += RECONCILE_MAX_AGE + 1
            ok, detail = health.healthy()
            assert not ok
            assert detail["reconcile"]["ok"] is False
            assert not beat.is_set()  # it cannot beat while the lock is held
        await asyncio.wait_for(beat.wait(), 30)  # the lock is free again: healthy again
        assert health.healthy()[0]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
