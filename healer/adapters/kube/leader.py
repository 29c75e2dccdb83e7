"""Leader election on a ``coordination.k8s.io/v1`` Lease (kubernetes_asyncio.leaderelection).

Only the leader acts. A follower keeps its caches warm and takes over once the lease expires;
a leader that fails to renew within the renew deadline stops acting at once (its work is
cancelled before ``on_stop`` returns).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

log = structlog.get_logger("healer.leader")


class Leadership:
    def __init__(self, api: client.ApiClient, *, namespace: str, name: str, identity: str,
                 on_start: Callable[[], Awaitable[None]], on_stop: Callable[[], Awaitable[None]],
                 lease_duration: float = 15.0, renew_deadline: float = 10.0,
                 retry_period: float = 2.0) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self._on_start = on_start
        self._on_stop = on_stop
        self.durations = (lease_duration, renew_deadline, retry_period)
        self.leading = False
        self.transitions = 0
        # the library logs every renewal at INFO through stdlib logging
        logging.getLogger("kubernetes_asyncio.leaderelection").setLevel(logging.WARNING)

    async def _started(self) -> None:
        self.leading = True
        self.transitions += 1
        log.info("acquired lease", lease=f"{self.namespace}/{self.name}", identity=self.identity)
        try:
            await self._on_start()
            await asyncio.Event().wait()  # hold until the library cancels us (lease lost)
        finally:
            self.leading = False

    async def _stopped(self) -> None:
        self.leading = False
        log.warning("lost lease", lease=f"{self.namespace}/{self.name}", identity=self.identity)
        await self._on_stop()

    async def run(self) -> None:
        """Campaign forever: after losing the lease, become a candidate again."""
        duration, deadline, retry = self.durations
        while True:
            lock = LeaseLock(self.name, self.namespace, self.identity, self.api)
            # the library stores the duration as an integer string in the Lease
            cfg = electionconfig.Config(lock, lease_duration=math.ceil(duration),
                                        renew_deadline=deadline,
                                        retry_period=retry, onstarted_leading=self._started,
                                        onstopped_leading=self._stopped)
            try:
                await leaderelection.LeaderElection(cfg).run()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # API trouble while campaigning: keep trying
                log.warning("leader election error", error=repr(e))
                if self.leading:
                    self.leading = False
                    await self._on_stop()
                await asyncio.sleep(retry)  # Lease time is real time, as in the library
