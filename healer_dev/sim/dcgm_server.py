"""The DCGM-exporter simulator's HTTP side: serves :class:`~healer_dev.sim.dcgm.DcgmSim`'s
``/metrics`` the way dcgm-exporter does, one exporter per node.

:class:`DcgmFleet` runs one aiohttp exporter per node on free loopback ports (so Prometheus sees
each node as its own target) plus a fleet-wide control endpoint that stays up while exporters
are down; :class:`ThreadedDcgmFleet` runs it in a background thread for synchronous tests.

Faults over HTTP: ``POST /control/fault`` with a JSON :class:`~healer_dev.sim.dcgm.Fault`
(``{"kind": "xid", "gpu": 3, "code": 79, "count": 2}``; ``node`` defaults to the exporter's own
node, ``after`` schedules it relative to now), ``GET /control/faults``, ``DELETE
/control/fault/{id}`` and ``POST /control/clear``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from aiohttp import web

from healer_dev.sim.dcgm import CONTENT_TYPE, DcgmSim, Fault, after_of

__all__ = ["DcgmFleet", "ThreadedDcgmFleet", "control_app", "exporter_app"]

_SIM_KEY = web.AppKey("sim", DcgmSim)
_NODE_KEY = web.AppKey("node", str)


def _control_routes(app: web.Application) -> None:
    app.router.add_post("/control/fault", _post_fault)
    app.router.add_get("/control/faults", _get_faults)
    app.router.add_delete("/control/fault/{id}", _delete_fault)
    app.router.add_post("/control/clear", _post_clear)


async def _post_fault(request: web.Request) -> web.Response:
    sim = request.app[_SIM_KEY]
    default_node = request.app.get(_NODE_KEY) or None
    try:
        data = await request.json()
        fault = Fault.from_json(data, node=default_node)
        stored = sim.inject(fault, after=after_of(data))
    except (ValueError, KeyError) as e:
        return web.json_response({"error": str(e).strip("'\"")}, status=400)
    return web.json_response({"id": stored.id, "fault": stored.to_json()}, status=201)


async def _get_faults(request: web.Request) -> web.Response:
    sim = request.app[_SIM_KEY]
    node = request.app.get(_NODE_KEY) or request.query.get("node")
    faults = [f.to_json() for f in sim.faults if node is None or f.node == node]
    return web.json_response({"faults": faults})


async def _delete_fault(request: web.Request) -> web.Response:
    sim = request.app[_SIM_KEY]
    try:
        ended = sim.clear(request.match_info["id"])
    except KeyError:
        return web.json_response({"error": "no such fault"}, status=404)
    return web.json_response({"ended": [f.id for f in ended]})


async def _post_clear(request: web.Request) -> web.Response:
    sim = request.app[_SIM_KEY]
    node = request.app.get(_NODE_KEY) or None
    if request.can_read_body:
        try:
            data = await request.json()
        except ValueError:
            return web.json_response({"error": "invalid JSON"}, status=400)
        if isinstance(data, Mapping):
            node = data.get("node", node)
            if "id" in data:
                try:
                    ended = sim.clear(str(data["id"]))
                except KeyError:
                    return web.json_response({"error": "no such fault"}, status=404)
                return web.json_response({"ended": [f.id for f in ended]})
    ended = sim.clear(node=node)
    return web.json_response({"ended": [f.id for f in ended]})


async def _metrics(request: web.Request) -> web.Response:
    sim = request.app[_SIM_KEY]
    node = request.app[_NODE_KEY]
    t = sim.clock()
    if sim.exporter_state(node, t) != "up":
        return web.Response(status=503, text="simulated exporter outage\n")
    return web.Response(body=sim.render(node, t).encode(),
                        headers={"Content-Type": CONTENT_TYPE})


def exporter_app(sim: DcgmSim, node: str) -> web.Application:
    """The aiohttp application of ``node``'s simulated exporter."""
    if node not in sim.nodes:
        raise ValueError(f"unknown node {node!r}")
    app = web.Application()
    app[_SIM_KEY] = sim
    app[_NODE_KEY] = node
    app.router.add_get("/metrics", _metrics)
    _control_routes(app)
    return app


def control_app(sim: DcgmSim) -> web.Application:
    """The fleet-wide control endpoint (faults name their ``node``)."""
    app = web.Application()
    app[_SIM_KEY] = sim
    _control_routes(app)
    return app


class _Server:
    """One aiohttp app on one loopback port that can close and reopen on the same port."""

    def __init__(self, factory: Callable[[], web.Application], host: str) -> None:
        self._factory = factory
        self.host = host
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(self) -> None:
        if self._runner is not None:
            return
        runner = web.AppRunner(self._factory(), access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        if self.port == 0:
            self.port = int(runner.addresses[0][1])
        self._runner = runner

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()  # closes the listener and every open connection


class DcgmFleet:
    """One simulated exporter per node on free loopback ports, plus a control endpoint.

    Use inside a running event loop (``async with DcgmFleet(sim) as fleet``). A supervisor task
    opens and closes exporters whose ``refused`` outages start or end on the sim's clock.
    """

    def __init__(self, sim: DcgmSim, *, host: str = "127.0.0.1", control: bool = True,
                 supervise_every: float = 0.05) -> None:
        self.sim = sim
        self.host = host
        self._servers = {n: _Server(functools.partial(exporter_app, sim, n), host)
                         for n in sim.nodes}
        self._control = _Server(functools.partial(control_app, sim), host) if control else None
        self._every = supervise_every
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def addresses(self) -> dict[str, str]:
        """node → ``host:port`` of its exporter (stable across outages)."""
        return {n: f"{s.host}:{s.port}" for n, s in self._servers.items()}

    @property
    def targets(self) -> list[str]:
        return list(self.addresses.values())

    @property
    def control_url(self) -> str:
        if self._control is None:
            raise RuntimeError("the fleet was started without a control endpoint")
        return f"http://{self._control.host}:{self._control.port}"

    def url(self, node: str) -> str:
        return f"http://{self.addresses[node]}"

    def running(self, node: str) -> bool:
        """Whether ``node``'s exporter is accepting connections."""
        return self._servers[node].running

    async def start(self) -> dict[str, str]:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        for node, server in self._servers.items():
            if self.sim.exporter_state(node) != "refused":
                await server.start()
            else:  # reserve the port, then close it
                await server.start()
                await server.stop()
        if self._control is not None:
            await self._control.start()
        self.sim.subscribe(self._changed)
        self._task = asyncio.create_task(self._supervise(), name="dcgm-sim-supervisor")
        return self.addresses

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for server in self._servers.values():
            await server.stop()
        if self._control is not None:
            await self._control.stop()

    async def __aenter__(self) -> DcgmFleet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def reconcile(self) -> None:
        """Open or close each exporter to match the sim's ``refused`` outages now."""
        async with self._lock:
            t = self.sim.clock()
            for node, server in self._servers.items():
                want = self.sim.exporter_state(node, t) != "refused"
                if want and not server.running:
                    await server.start()
                elif not want and server.running:
                    await server.stop()

    async def inject(self, fault: Fault, *, after: float | None = None) -> Fault:
        stored = self.sim.inject(fault, after=after)
        await self.reconcile()
        return stored

    async def clear(self, fault_id: str | None = None, *, node: str | None = None) -> list[Fault]:
        ended = self.sim.clear(fault_id, node=node)
        await self.reconcile()
        return ended

    def _changed(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            wake.set()
        else:
            loop.call_soon_threadsafe(wake.set)

    async def _supervise(self) -> None:
        assert self._wake is not None
        while True:
            await self.reconcile()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._every)
            self._wake.clear()


class ThreadedDcgmFleet:
    """A :class:`DcgmFleet` served from its own thread and event loop.

    For synchronous callers and for tests whose event loop does not run all the time (a fleet
    in the test's own loop would stop answering between tests). ``inject``/``clear`` return once
    the exporters match the new faults.
    """

    def __init__(self, sim: DcgmSim, *, host: str = "127.0.0.1", control: bool = True) -> None:
        self.sim = sim
        self.fleet = DcgmFleet(sim, host=host, control=control)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 10.0) -> dict[str, str]:
        if self._thread is not None:
            return self.addresses
        loop = asyncio.new_event_loop()
        ready: Future[None] = Future()

        def main() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.fleet.start())
            except BaseException as e:  # surfaced through ready
                ready.set_exception(e)
                loop.close()
                return
            ready.set_result(None)
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self.fleet.stop())
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=main, name="dcgm-sim", daemon=True)
        self._thread.start()
        try:
            ready.result(timeout)
        except BaseException:
            self._thread.join(timeout)
            self._thread = None
            raise
        return self.addresses

    def stop(self, timeout: float = 10.0) -> None:
        thread, loop = self._thread, self._loop
        self._thread = None
        if thread is None or loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError("the DCGM simulator thread did not stop")

    def __enter__(self) -> ThreadedDcgmFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Any, timeout: float = 10.0) -> Any:
        if self._loop is None or self._thread is None:
            raise RuntimeError("the fleet is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def inject(self, fault: Fault, *, after: float | None = None) -> Fault:
        stored = self.sim.inject(fault, after=after)
        self._call(self.fleet.reconcile())
        return stored

    def clear(self, fault_id: str | None = None, *, node: str | None = None) -> list[Fault]:
        ended = self.sim.clear(fault_id, node=node)
        self._call(self.fleet.reconcile())
        return ended

    @property
    def addresses(self) -> dict[str, str]:
        return self.fleet.addresses

    @property
    def targets(self) -> list[str]:
        return self.fleet.targets

    @property
    def control_url(self) -> str:
        return self.fleet.control_url

    def url(self, node: str) -> str:
        return self.fleet.url(node)

    def running(self, node: str) -> bool:
        return self.fleet.running(node)
