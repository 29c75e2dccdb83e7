"""The daemon's long-running loops around the controller, and the task set that runs them.

Each loop beats its own ``/healthz`` heartbeat (:class:`~healer.obs.http.Health`), so a loop
that stops coming round makes the daemon unhealthy instead of silently blind:

* a telemetry source's sink (:func:`source_sink`): every delivery, even an empty poll;
* ``spare-depth`` (:func:`spare_depth`): free warm spares per NVLink domain, for the metrics;
* ``retention`` (:func:`retention`): closed NodeRemediations past retention are deleted;
* ``reconcile`` (:func:`reconcile_heartbeat`): the controller's step lock comes free;
* ``leadership`` (:func:`lead`): the Lease, or leading at once without leader election.

:func:`run_until_stopped` runs them all until SIGTERM/SIGINT or until one fails, then stops
the controller within the shutdown grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Coroutine, Mapping, MutableMapping, Sequence
from typing import Any, Protocol

import structlog

from healer.core.model import Signal
from healer.core.topology import DOMAIN_LABEL
from healer.errors import HealerError
from healer.obs.http import Health
from healer.ports import Clock, SignalSink
from healer.runtime.controller import Controller

log = structlog.get_logger("healer.app")

#: A telemetry source that has not delivered a poll for this long (or three poll intervals,
#: when longer) makes /healthz fail.
SOURCE_MAX_AGE = 300.0
#: The other loops' heartbeats: a loop that has not come round for this long (beyond its own
#: period) makes /healthz fail.
LOOP_SLACK = 120.0
#: The reconcile heartbeat: the controller's step lock must come free this often.
RECONCILE_MAX_AGE = 300.0
#: How often the free spares are counted, and closed records past retention collected.
SPARE_DEPTH_EVERY, RETENTION_EVERY = 10.0, 3600.0


class SpareDepth(Protocol):
    async def depth(self) -> Mapping[str, int]:
        """Free warm spares by NVLink domain."""
        ...


class Election(Protocol):
    async def run(self) -> None:
        """Hold the lease (leading while held) until cancelled."""
        ...


def source_sink(health: Health, name: str, ctl: Controller,
                max_age: float = SOURCE_MAX_AGE) -> SignalSink:
    """The sink a source feeds: each delivery is that source's heartbeat for ``/healthz``
    (a source delivers every poll, even when Prometheus is down), so a stuck poll loop makes
    the controller unhealthy instead of silently blind."""
    health.beat(f"source:{name}", max_age)

    async def sink(signals: Sequence[Signal]) -> None:
        health.beat(f"source:{name}", max_age)
        await ctl.on_signals(signals)

    return sink


async def spare_depth(health: Health, spares: SpareDepth, ctl: Controller,
                      depth: MutableMapping[str, int], clock: Clock) -> None:
    """Keep ``depth`` (NVLink domain → free spares) current: every domain that has nodes gets
    an entry, 0 when none is free, so "this domain has no spare left" can be alerted on."""
    while True:
        health.beat("spare-depth", SPARE_DEPTH_EVERY + LOOP_SLACK)
        with contextlib.suppress(HealerError):
            free = await spares.depth()
            domains = {v.labels[DOMAIN_LABEL] for v in ctl.nodes.values()
                       if DOMAIN_LABEL in v.labels}
            depth.clear()
            depth.update({d: free.get(d, 0) for d in domains | set(free)})
        await clock.sleep(SPARE_DEPTH_EVERY)


async def retention(health: Health, ctl: Controller, clock: Clock) -> None:
    """Delete closed NodeRemediations past retention, hourly."""
    while True:
        health.beat("retention", RETENTION_EVERY + LOOP_SLACK)
        await clock.sleep(RETENTION_EVERY)
        with contextlib.suppress(HealerError):
            await ctl.collect_garbage()


async def reconcile_heartbeat(health: Health, probe: Callable[[], Awaitable[None]],
                              clock: Clock, every: float = 5.0) -> None:
    """Beat ``reconcile`` each time ``probe`` (the controller's step lock) comes back: a step
    stuck under the lock makes /healthz fail after :data:`RECONCILE_MAX_AGE`."""
    while True:
        await probe()
        health.beat("reconcile", RECONCILE_MAX_AGE)
        await clock.sleep(every)


async def lead(ctl: Controller, election: Election | None) -> None:
    """Lead while ``election`` holds the lease (it starts and stops the controller); without
    leader election (None), lead at once and for ever."""
    if election is None:
        await ctl.start_leading()
        await asyncio.Event().wait()
    else:
        await election.run()


async def run_until_stopped(ctl: Controller, loops: Mapping[str, Coroutine[Any, Any, Any]], *,
                            grace: float,
                            started: Callable[[], Awaitable[None]] | None = None) -> int:
    """Run ``loops`` (task name → coroutine) until SIGTERM/SIGINT or until one ends; then let
    the controller's workers finish within ``grace`` and stop leading. Returns the exit code:
    1 when a loop failed, else 0. Cancelled (an embedding caller), it stops them all too."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(coro, name=name) for name, coro in loops.items()]
    stopper = asyncio.create_task(stop.wait(), name="stop")
    try:
        if started is not None:
            await started()
        done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        code = 0
        for t in done:
            if t is not stopper and t.exception() is not None:
                log.error("task failed", task=t.get_name(), error=repr(t.exception()))
                code = 1
        log.info("shutting down", grace=grace)
        await ctl.drain(grace)
        await ctl.stop_leading()
        return code
    finally:  # also when this coroutine is cancelled (embedded, as in the demo and tests)
        for t in [stopper, *tasks]:
            t.cancel()
        await asyncio.gather(stopper, *tasks, return_exceptions=True)
        if ctl.leading:  # cancelled: stop the workers before the API client closes
            await ctl.stop_leading()
