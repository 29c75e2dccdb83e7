"""``healer agent``: the optional node DaemonSet. NVML in, one node condition and Events out.

The agent's composition root. On its own node it publishes the ``GPUHealthy`` condition
(:mod:`healer.agent.publish`), one Event per XID (and per other NVML event), and its own
``/metrics``, ``/healthz`` and ``/readyz``. It never cordons, drains, taints or labels anything:
acting on the condition is the controller's job.

Loops (one asyncio TaskGroup-like set of tasks):

* NVML events (``NvmlReader.events()``, a watcher thread): recorded at once, the condition is
  re-assessed and written at once, and the counters are re-read;
* NVML counters: read every ``--interval`` seconds (in a thread);
* the condition: written when its status, reason or message changes, else every
  ``--heartbeat`` seconds (``lastHeartbeatTime``); ``lastTransitionTime`` moves only when the
  status or the reason changes (and survives agent restarts: it is read back from the node);
* liveness: heartbeats for ``/healthz`` (event loop, NVML poll, event watcher).

Exit codes: 0 after SIGTERM/SIGINT; 2 when NVML (or the Kubernetes client configuration, or the
settings) cannot be used, with one log line saying why; 1 when a loop died. An unreachable API
server is not fatal: the outage is logged once, its end once, and the writes resume.

Run it as ``healer agent`` (registered in :mod:`healer.cli` through :func:`add_agent_flags` and
:func:`cmd_agent`) or ``python -m healer.agent.main``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import structlog

from healer import flags
from healer.adapters.clock import SYSTEM_CLOCK
from healer.adapters.kube.event_series import WriteBudget
from healer.adapters.kube.events import KubeEvents, LiteEventWriter
from healer.adapters.kube.lite import LiteClient, lite_client
from healer.agent.findings import Assessment, GpuEvent, GpuReading, Thresholds, assess
from healer.agent.metrics import AgentMetrics, AgentState
from healer.agent.nvml import NvmlReader
from healer.agent.publish import (
    EVENT_WRITE_BURST,
    EVENT_WRITE_EVERY,
    Condition,
    ConditionWriter,
    EventSink,
    build_condition,
    event_reason,
    event_type,
    next_write_in,
    should_write,
)
from healer.core.xid import XidCatalog
from healer.errors import ConfigError, HealerError, TransientError
from healer.obs import logging as hlog
from healer.obs.http import Health, make_app, serve
from healer.policy.catalog import default_catalog
from healer.ports import Clock

log = structlog.get_logger("healer.agent")

#: The outage key the API server's unavailability is logged under (once down, once back).
API = "kube-apiserver"
#: NVML events kept for the assessment (within the event window): an XID storm stays bounded.
MAX_EVENTS = 10_000


@dataclass(frozen=True)
class AgentSettings:
    node_name: str
    """The node this agent runs on (the DaemonSet passes spec.nodeName as NODE_NAME)."""
    kubeconfig: str | None = None
    """None: the in-cluster service account."""
    context: str | None = None
    """Events about Nodes (cluster-scoped) are written here, like the controller's. The API
    server refuses them anywhere but ``default`` (involvedObject.namespace must match)."""
    instance: str = ""
    """reportingInstance of the Events (default: the pod name, else the host name)."""
    interval: float = 10.0
    """Seconds between two reads of the NVML counters."""
    heartbeat: float = 30.0
    """Seconds between two writes of an unchanged condition (lastHeartbeatTime)."""
    thresholds: Thresholds = field(default_factory=Thresholds)
    nvml_wait_ms: int = 250
    """nvmlEventSetWait timeout; bounds how long stopping the event watcher takes."""
    api_timeout: float = 10.0
    """Seconds one API request may take."""
    http_host: str = "127.0.0.1"
    """The one address to serve on (the DaemonSet passes the pod IP)."""
    http_port: int = 8081
    debug_state: bool = False
    log_level: str = "info"
    log_json: bool | None = None

    def validate(self) -> None:
        if not self.node_name:
            raise ConfigError("healer agent needs the node's name: --node-name or $NODE_NAME "
                              "(the DaemonSet sets it from spec.nodeName)")
        for name in ("interval", "heartbeat", "api_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0 seconds, "
                                  f"not {getattr(self, name)}")
        if self.nvml_wait_ms <= 0:
            raise ConfigError("--nvml-wait-ms must be > 0")
        if not 0 <= self.http_port <= 65535:
            raise ConfigError(f"--http-port {self.http_port} is not a TCP port")


async def _wait(clock: Clock, event: asyncio.Event, seconds: float) -> bool:
    """Wait for ``event`` at most ``seconds`` of ``clock``'s time; True if it was set."""
    if event.is_set():
        return True
    timer = asyncio.ensure_future(clock.sleep(max(seconds, 0.0)))
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((timer, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        waiter.cancel()
    return event.is_set()


class Agent:
    """The agent's loops and the state they share (one event loop; no locks needed)."""

    def __init__(self, settings: AgentSettings, reader: NvmlReader, writer: ConditionWriter,
                 sink: EventSink, catalog: XidCatalog, health: Health,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.settings = settings
        self.reader = reader
        self.writer = writer
        self.sink = sink
        self.catalog = catalog
        self.health = health
        self.clock = clock
        self.state = AgentState(node=settings.node_name, driver=reader.driver_version,
                                gpus=reader.gpus)
        self.metrics = AgentMetrics(lambda: self.state)
        self.once = hlog.OnceLogger("healer.agent")
        self.readings: list[GpuReading] = []
        self.events: list[GpuEvent] = []
        self.assessment: Assessment | None = None
        #: what this process last wrote
        self.last: Condition | None = None
        #: what the node carried before this process first wrote (read once)
        self.previous: Condition | None = None
        self.loaded = False
        self.failures = 0
        #: when the oldest NVML event not yet reflected in a write was received
        self.unwritten_since: float | None = None
        self.wake = asyncio.Event()
        self.poll_now = asyncio.Event()
        self._inflight: asyncio.Future[list[GpuReading]] | None = None
        sink.on_emit, sink.on_drop = self._on_emit, self._on_drop

    # -- NVML ----------------------------------------------------------------------------------

    async def read(self) -> None:
        """Read every GPU's counters (in a thread). NVML failing is logged once, not fatal."""
        fut: asyncio.Future[list[GpuReading]] = asyncio.ensure_future(
            asyncio.to_thread(self.reader.read))
        self._inflight = fut
        try:
            readings = await asyncio.shield(fut)
        except Exception as e:
            self.metrics.nvml_failure("read", type(e).__name__)
            self.once.failed("nvml", repr(e))
            return
        self.once.ok("nvml")
        self.readings = readings
        self.state.readings = readings
        self.state.last_read = self.clock.now()
        self.metrics.readings(readings)
        self.health.beat("nvml-poll", max(3 * self.settings.interval, 30.0))

    def on_event(self, ev: GpuEvent) -> None:
        """An NVML event: keep it, count it, queue its Event, re-assess and re-read now."""
        self.events.append(ev)
        if len(self.events) > MAX_EVENTS:
            del self.events[:-MAX_EVENTS]
        self.metrics.event(ev)
        self.sink.add(ev)
        if self.unwritten_since is None:
            self.unwritten_since = ev.at
        level = log.warning if event_type(ev, self.catalog) == "Warning" else log.info
        level("nvml event", kind=ev.kind.value, gpu=ev.index, uuid=ev.uuid, xid=ev.xid,
              event_type=ev.event_type)
        self.wake.set()
        self.poll_now.set()

    async def event_loop(self) -> None:
        # events() is an async generator: aclosing stops the watcher when this task ends
        events = cast("AsyncGenerator[GpuEvent, None]", self.reader.events())
        async with contextlib.aclosing(events) as stream:
            async for ev in stream:
                self.on_event(ev)
        raise TransientError("the NVML event watcher stopped")

    async def poll_loop(self) -> None:
        while True:
            await _wait(self.clock, self.poll_now, self.settings.interval)
            self.poll_now.clear()
            await self.read()
            self.wake.set()

    async def liveness(self) -> None:
        while True:
            self.health.beat("event-loop", 10.0)
            if self.reader.watching:
                self.health.beat("nvml-events", 10.0)
            await self.clock.sleep(1.0)

    # -- publishing ----------------------------------------------------------------------------

    def assess(self, now: float) -> Assessment:
        cutoff = now - self.settings.thresholds.event_window_s
        self.events = [e for e in self.events if e.at >= cutoff]
        a = assess(self.readings, self.events, self.catalog, self.settings.thresholds, now)
        self.assessment = a
        self.state.assessment = a
        return a

    async def publish_once(self) -> bool:
        """Assess; write the condition if it changed or the heartbeat is due; flush Events.

        Returns whether the condition was written. Raises HealerError/TimeoutError when the
        API server did not take it (nothing is lost: the next call tries again).
        """
        now = self.clock.now()
        a = self.assess(now)
        pending_since = self.unwritten_since
        if not self.loaded:
            self.previous = await self.writer.current()
            self.loaded = True
        before = self.last or self.previous
        cond = build_condition(a, before, now)
        wrote = False
        if should_write(cond, self.last, self.settings.heartbeat):
            await self.writer.write(cond)
            wrote = True
            self.metrics.writes.labels("ok").inc()
            self.state.last_write = self.clock.now()
            if not cond.same_content(before):
                level = log.info if cond.status == "True" else log.warning
                level("condition", type=cond.type, status=cond.status, reason=cond.reason,
                      message=cond.message, transition=not cond.same_state(before))
            self.last = cond
            if pending_since is not None:
                self.metrics.latency.observe(max(0.0, self.clock.now() - pending_since))
        if self.unwritten_since == pending_since:
            self.unwritten_since = None
        due = self.sink.next_flush_in()
        if self.sink.pending or (due is not None and due <= 0):
            # a bound on API calls, in real time (not the agent's clock)
            async with asyncio.timeout(self.settings.api_timeout * 4):
                await self.sink.flush()
        return wrote

    async def publish_step(self) -> float:
        """One publish; returns the seconds until the next one is due (a wake comes earlier).

        A failure is counted and retried with a backoff (at most the heartbeat, 15 s).
        """
        try:
            await self.publish_once()
        except (HealerError, TimeoutError) as e:
            self._failed(e)
            return min(0.5 * (1 << min(self.failures, 6)), self.settings.heartbeat, 15.0)
        self.failures = 0
        for what in (API, "node-status", "event-queue"):
            self.once.ok(what)
        self.health.set_ready("condition-written", True)
        wait = next_write_in(self.last, self.settings.heartbeat, self.clock.now())
        due = self.sink.next_flush_in()
        if self.sink.pending:  # Events waiting for the write budget
            due = min(due if due is not None else wait, self.sink.events.budget_wait())
        return min(wait, due) if due is not None else wait

    async def publish_loop(self) -> None:
        while True:
            self.wake.clear()
            await _wait(self.clock, self.wake, await self.publish_step())

    def _failed(self, e: BaseException) -> None:
        self.failures += 1
        if isinstance(e, TimeoutError):
            e = TransientError(f"no answer from the API server within "
                               f"{self.settings.api_timeout:g}s")
        self.metrics.writes.labels("error").inc()
        self.metrics.api_errors.labels(type(e).__name__).inc()
        # the API server away is one outage (logged once, its end once); a refusal (403, 404:
        # a wrong NODE_NAME, missing RBAC) is another, logged once with what was refused
        self.once.failed(API if isinstance(e, TransientError) else "node-status", str(e))

    def _on_emit(self, ev: GpuEvent, reason: str) -> None:
        self.metrics.k8s_events.labels(reason, "emitted").inc()

    def _on_drop(self, ev: GpuEvent, why: str) -> None:
        self.metrics.k8s_events.labels(event_reason(ev), "dropped").inc()
        if why == "queue full":  # a storm during an outage: counted, logged once
            self.once.failed("event-queue", f"more than {self.sink.pending.maxlen} Events "
                             "waiting; the oldest are dropped")
            return
        log.error("event dropped", kind=ev.kind.value, gpu=ev.index, xid=ev.xid, why=why)

    def debug_state(self) -> dict[str, Any]:
        return {"node": self.settings.node_name, "driver": self.reader.driver_version,
                "gpus": [g.to_dict() for g in self.reader.gpus],
                "condition": None if self.last is None else self.last.to_api(),
                "assessment": None if self.assessment is None else self.assessment.to_dict(),
                "pendingEvents": len(self.sink.pending), "apiFailures": self.failures}

    async def settle(self, seconds: float = 5.0) -> None:
        """After cancelling the loops: let an NVML read still running in its thread finish."""
        fut = self._inflight
        if fut is not None and not fut.done():  # a bound on a thread, in real time
            await asyncio.wait([fut], timeout=seconds)


# ---------------------------------------------------------------------------------------------
# composition root


async def _api_client(settings: AgentSettings) -> LiteClient:
    try:
        return lite_client(settings.kubeconfig, settings.context, timeout=settings.api_timeout)
    except Exception as e:  # kubeconfig unreadable, not in a cluster...
        where = settings.kubeconfig or "the in-cluster service account"
        raise ConfigError(f"cannot configure the Kubernetes client from {where}: "
                          f"{type(e).__name__}: {e}") from e


async def run_agent(settings: AgentSettings, *, reader: NvmlReader | None = None,
                    catalog: XidCatalog | None = None) -> int:
    """Run the agent until SIGTERM/SIGINT. Returns the process exit code (see the module)."""
    hlog.setup(settings.log_level, settings.log_json)
    nvml = reader or NvmlReader(wait_timeout_ms=settings.nvml_wait_ms)
    try:
        settings.validate()
        await asyncio.to_thread(nvml.open)
        api = await _api_client(settings)
    except ConfigError as e:
        log.error("cannot start", node=settings.node_name, error=str(e))
        await asyncio.to_thread(nvml.stop)
        return 2
    try:
        return await _run(settings, nvml, api, catalog or default_catalog())
    except ConfigError as e:
        log.error("cannot start", node=settings.node_name, error=str(e))
        return 2
    finally:
        await api.close()
        await asyncio.to_thread(nvml.stop)


async def _run(settings: AgentSettings, reader: NvmlReader, api: LiteClient,
               catalog: XidCatalog) -> int:
    node = settings.node_name
    instance = settings.instance or os.environ.get("POD_NAME") or socket.gethostname()
    writer = ConditionWriter(api, node)
    events = KubeEvents(LiteEventWriter(api), instance=instance,  # Node Events: in default
                        budget=WriteBudget(EVENT_WRITE_BURST, EVENT_WRITE_EVERY))
    sink = EventSink(events, node, catalog)
    health = Health()
    agent = Agent(settings, reader, writer, sink, catalog, health)
    health.set_ready("nvml", True)
    health.set_ready("condition-written", False)
    health.beat("event-loop", 10.0)
    try:
        runner = await serve(make_app(health, agent.metrics.registry,
                                      agent.debug_state if settings.debug_state else None),
                             settings.http_host, settings.http_port)
    except OSError as e:
        raise ConfigError(f"cannot serve HTTP on {settings.http_host}:{settings.http_port}: "
                          f"{e}") from e
    await agent.read()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(agent.liveness(), name="liveness"),
             asyncio.create_task(agent.event_loop(), name="nvml-events"),
             asyncio.create_task(agent.poll_loop(), name="nvml-poll"),
             asyncio.create_task(agent.publish_loop(), name="publish")]
    log.info("started", node=node, driver=reader.driver_version,
             gpus=[f"{g.index}:{g.uuid}" for g in reader.gpus], interval=settings.interval,
             heartbeat=settings.heartbeat,
             http=f"{settings.http_host}:{settings.http_port}")
    stopper = asyncio.create_task(stop.wait(), name="stop")
    done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    for t in done:
        exc = None if t is stopper or t.cancelled() else t.exception()
        if isinstance(exc, ConfigError):  # NVML events cannot be used at all (event set)
            log.error("cannot start", node=node, error=str(exc))
            code = 2
        elif exc is not None:
            log.error("task failed", task=t.get_name(), error=repr(exc))
            code = 1
    log.info("shutting down", node=node)
    for t in [stopper, *tasks]:
        t.cancel()
    await asyncio.gather(stopper, *tasks, return_exceptions=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    await agent.settle()
    await runner.cleanup()
    return code


# ---------------------------------------------------------------------------------------------
# command line


def add_agent_flags(p: argparse.ArgumentParser) -> None:
    """The flags of ``healer agent`` (also used by ``python -m healer.agent.main``)."""
    env = os.environ.get
    p.add_argument("--node-name", default=env("NODE_NAME", ""),
                   help="this node's name (default: $NODE_NAME, set from spec.nodeName)")
    p.add_argument("--kubeconfig", default=env("KUBECONFIG"),
                   help="kubeconfig (default: $KUBECONFIG, else in-cluster)")
    p.add_argument("--context", default=None)
    p.add_argument("--interval", type=flags.seconds(0.1, 3600), default=10.0,
                   help="seconds between two reads of the NVML counters (default: 10)")
    p.add_argument("--heartbeat", type=flags.seconds(1, 3600), default=30.0,
                   help="seconds between two writes of an unchanged condition (default: 30)")
    p.add_argument("--event-window", type=flags.seconds(1, 30 * 86400), default=3600.0,
                   help="seconds an XID/NVML event keeps the condition False (default: 3600)")
    p.add_argument("--ecc-corrected-max", type=flags.integer(0, 2**63 - 1), default=1000,
                   help="volatile corrected ECC errors above which: EccCorrectableStorm")
    p.add_argument("--nvlink-errors-max", type=flags.integer(0, 2**63 - 1), default=100,
                   help="NVLink errors of one kind above which: NvlinkErrors")
    p.add_argument("--pcie-replays-max", type=flags.integer(0, 2**63 - 1), default=100,
                   help="PCIe replays above which: PcieReplays")
    p.add_argument("--nvml-wait-ms", type=flags.integer(1, 60_000), default=250,
                   help="NVML event wait timeout in ms (bounds how long stopping takes)")
    p.add_argument("--api-timeout", type=flags.seconds(0.1, 600), default=10.0,
                   help="seconds one API request may take (default: 10)")
    p.add_argument("--http-host", default=os.environ.get("HEALER_HTTP_HOST", "127.0.0.1"),
                   type=flags.host,
                   help="the one address to serve on (default 127.0.0.1; the DaemonSet passes "
                        "the pod IP; $HEALER_HTTP_HOST)")
    p.add_argument("--debug-state", action="store_true",
                   help="serve /debug/state (redacted; default off)")
    p.add_argument("--http-port", type=flags.port, default=8081,
                   help="/metrics, /healthz, /readyz (default: 8081)")
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-format", choices=["auto", "json", "console"], default="auto")


def agent_settings(args: argparse.Namespace) -> AgentSettings:
    """Flags → settings. Raises ConfigError for values no agent can run with."""
    try:
        thresholds = Thresholds(ecc_corrected_max=args.ecc_corrected_max,
                                nvlink_errors_max=args.nvlink_errors_max,
                                pcie_replays_max=args.pcie_replays_max,
                                event_window_s=args.event_window)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    settings = AgentSettings(
        node_name=args.node_name or "", kubeconfig=args.kubeconfig or None, context=args.context,
        interval=args.interval,
        heartbeat=args.heartbeat, thresholds=thresholds, nvml_wait_ms=args.nvml_wait_ms,
        api_timeout=args.api_timeout, http_host=args.http_host, http_port=args.http_port,
        debug_state=args.debug_state,
        log_level=args.log_level,
        log_json=None if args.log_format == "auto" else args.log_format == "json")
    settings.validate()
    return settings


def cmd_agent(args: argparse.Namespace) -> int:
    """``healer agent``: run the node agent until SIGTERM. 2: bad settings or no NVML."""
    try:
        settings = agent_settings(args)
    except ConfigError as e:
        print(f"healer agent: {e}", file=sys.stderr)
        return 2
    return asyncio.run(run_agent(settings))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="healer agent",
                                description="the node agent: GPUHealthy from NVML")
    add_agent_flags(p)
    return cmd_agent(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
