"""The composition root: builds every adapter, the controller, the HTTP endpoints and the
leader election from :class:`~healer.settings.Settings`, and runs them in one TaskGroup.

Nothing else in healer constructs adapters. Tests replace ports through ``Overrides`` (the
daemon integration tests run this very function with file-backed fakes for Slurm).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import structlog
from kubernetes_asyncio import client

from healer.adapters import calls
from healer.adapters.acks import AckReceiver, AckTarget, target_of
from healer.adapters.checkpoint import HookRouter, SlurmSignalCheckpoint
from healer.adapters.hooks import JobHook, RepairRouter, Secrets, WebhookHook
from healer.adapters.kube.client import call, make_api_client
from healer.adapters.kube.crd import crd_manifest
from healer.adapters.kube.events import KubeEvents
from healer.adapters.kube.hooks import KubeTopology
from healer.adapters.kube.leader import Leadership
from healer.adapters.kube.nodes import KubeNodes
from healer.adapters.kube.self_events import SelfEvents
from healer.adapters.kube.spares import KubeSparePool
from healer.adapters.kube.store import CRStateStore
from healer.core.rules import Mode, PolicySet
from healer.core.topology import DOMAIN_LABEL
from healer.errors import ConfigError, ConflictError, HealerError, NotFoundError, PolicyError
from healer.obs import logging as hlog
from healer.obs.http import Health, make_app, serve
from healer.obs.metrics import Metrics, StateSource
from healer.ports import (
    CheckpointHook,
    SlurmDriver,
    TelemetrySource,
    Validator,
    Workload,
)
from healer.runtime.controller import Controller, RuntimeSettings
from healer.runtime.executor import Executor, Ports, SlurmNames, same_name
from healer.runtime.policy_reload import Budget, PolicyReloader, load_isolated
from healer.runtime.slurm_feed import SlurmFeed
from healer.settings import Settings

if TYPE_CHECKING:
    from healer.adapters.prometheus import PrometheusSource

log = structlog.get_logger("healer.app")


class RealClock:
    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass
class Overrides:
    """Ports a caller provides instead of the ones settings would build (tests, embedding)."""

    slurm: SlurmDriver | None = None
    workload: Workload | None = None
    checkpoint: CheckpointHook | None = None
    validator: Validator | None = None
    slurm_names: SlurmNames | None = None
    telemetry: list[TelemetrySource] | None = None
    runtime: RuntimeSettings | None = None
    after_write: Callable[[Any], None] | None = None
    """Called with the record after every persisted write (fault injection in tests)."""
    after_action: Callable[[Any], None] | None = None
    """Called with the action after it ran, before its outcome is persisted."""


def _max_mode(settings: Settings) -> Mode | None:
    return Mode.DRY_RUN if settings.dry_run else None


def _budget(settings: Settings) -> Budget:
    return Budget(seconds=settings.policy_load_timeout,
                  memory_bytes=settings.policy_load_memory_mb << 20)


async def load_policies(settings: Settings) -> PolicySet:
    """The policies, loaded in a child process within the settings' time and memory budget
    (:mod:`healer.runtime.policy_reload`); any failure is a PolicyError."""
    return await load_isolated(settings.policies, max_mode=_max_mode(settings),
                               budget=_budget(settings))


async def ensure_crd(api: client.ApiClient, install: bool) -> None:
    ext = client.ApiextensionsV1Api(api)
    body = crd_manifest()
    name = body["metadata"]["name"]
    try:
        await call(f"get CRD {name}", lambda: ext.read_custom_resource_definition(name))
        return
    except NotFoundError as e:
        if not install:
            raise ConfigError(f"the {name} CustomResourceDefinition is not installed "
                              f"({e}); apply deploy/crds/ first") from e
    except HealerError as e:  # unreachable, refused, forbidden: say so, not "not installed"
        raise ConfigError(f"cannot read the {name} CustomResourceDefinition from the API "
                          f"server: {e}") from e
    with contextlib.suppress(ConflictError):
        await call(f"create CRD {name}", lambda: ext.create_custom_resource_definition(body))  # type: ignore[arg-type]
    co = client.CustomObjectsApi(api)
    for _ in range(100):  # wait until the new resource is served
        try:
            await co.list_cluster_custom_object("healer.io", "v1alpha1", "noderemediations")
            return
        except Exception:
            await asyncio.sleep(0.1)
    raise ConfigError(f"{name} was created but is not served")


#: A telemetry source that has not delivered a poll for this long (or three poll intervals,
#: when longer) makes /healthz fail.
SOURCE_MAX_AGE = 300.0
#: The other loops' heartbeats: a loop that has not come round for this long (beyond its own
#: period) makes /healthz fail.
LOOP_SLACK = 120.0
#: The reconcile heartbeat: the controller's step lock must come free this often.
RECONCILE_MAX_AGE = 300.0


def _slurm_driver(settings: Settings, api: client.ApiClient) -> SlurmDriver:
    s = settings.slurm
    if s.driver == "scontrol":
        from healer.adapters.slurm.scontrol import ScontrolDriver

        env = {**os.environ, "SLURM_CONF": s.slurm_conf} if s.slurm_conf else None
        return ScontrolDriver(env=env)
    if s.driver == "slurmrestd":
        from healer.adapters.kube.secrets import SecretToken
        from healer.adapters.slurm.slurmrestd import SlurmrestdDriver

        if not s.slurmrestd_url or not s.token_secret:
            raise ConfigError("--slurm-driver slurmrestd needs --slurmrestd-url and "
                              "--slurmrestd-token-secret NAMESPACE/NAME[:KEY]")
        return SlurmrestdDriver(s.slurmrestd_url, SecretToken(api, s.token_secret))
    if s.driver == "slinky":
        from healer.adapters.slinky import SlinkyDriver

        jobs: SlurmDriver | None = None  # job listing and signals need Slurm's own API
        if s.slurmrestd_url and s.token_secret:
            from healer.adapters.kube.secrets import SecretToken
            from healer.adapters.slurm.slurmrestd import SlurmrestdDriver

            jobs = SlurmrestdDriver(s.slurmrestd_url, SecretToken(api, s.token_secret))
        elif s.slurm_conf:
            from healer.adapters.slurm.scontrol import ScontrolDriver

            jobs = ScontrolDriver(env={**os.environ, "SLURM_CONF": s.slurm_conf})
        driver: SlurmDriver = SlinkyDriver(api, namespace=s.nodeset_namespace, jobs=jobs,
                                           nodeset=s.nodeset)
        return driver
    raise ConfigError(f"unknown Slurm driver {s.driver!r} (expected slinky, scontrol or "
                      "slurmrestd)")


def _topology(settings: Settings, api: client.ApiClient, nodes: KubeNodes, slurm: SlurmDriver,
              *, slinky_pods: bool) -> KubeTopology:
    """The topology step: the annotation from labels or from topograph, verified against the
    slurmd pod (Slinky) and against Slurm where it reports a node's topology."""
    from healer.adapters.slinky import OperatorCapabilities, SlinkyDriver, SlinkyPods

    t = settings.topology
    topograph = None
    if t.source == "topograph":
        from healer.adapters.topograph import TopographClient, load_request

        if not t.topograph_url or not t.topograph_request:
            raise ConfigError("--topology-source topograph needs --topograph-url and "
                              "--topograph-request FILE (the /v1/generate body)")
        topograph = TopographClient(t.topograph_url, load_request(t.topograph_request))
    elif t.source != "labels":
        raise ConfigError(f"unknown topology source {t.source!r} (expected labels or "
                          "topograph)")
    # Slurm's own view of the node's topology: on Slinky the pod conditions do not carry it,
    # the job backend (slurmrestd) does
    reader = slurm.jobs if isinstance(slurm, SlinkyDriver) else slurm
    pods = SlinkyPods(api, settings.slurm.nodeset_namespace) if slinky_pods else None
    # slurm-operator <v1.1 never copies the Node's topology annotation to the slurmd pod
    caps = (slurm.capabilities if isinstance(slurm, SlinkyDriver)
            else OperatorCapabilities(api)) if slinky_pods else None
    return KubeTopology(nodes, pods=pods, slurm=reader, topograph=topograph,
                        copies_topology=caps.copies_topology if caps is not None else None)


async def run(settings: Settings, overrides: Overrides | None = None,
              ready: Callable[[Controller], Awaitable[None]] | None = None) -> int:
    """Run the controller until SIGTERM/SIGINT. Returns the process exit code."""
    with contextlib.ExitStack() as stack:
        log_stream = (stack.enter_context(open(settings.log_file, "a", buffering=1))  # noqa: ASYNC230 (once, at start)
                      if settings.log_file else None)
        hlog.setup(settings.log_level, settings.log_json, log_stream)
        try:
            return await _start(settings, overrides or Overrides(), ready)
        finally:
            if log_stream is not None:
                hlog.setup(settings.log_level, settings.log_json)  # the file is closing


async def _start(settings: Settings, o: Overrides,
                 ready: Callable[[Controller], Awaitable[None]] | None) -> int:
    metrics = Metrics()
    calls.set_observer(metrics.observe_call)
    try:  # a bad kubeconfig is found before the policies are loaded (in a child process)
        api = await make_api_client(settings.kube.kubeconfig, settings.kube.context)
    except ConfigError as e:
        log.error("cannot start", error=str(e))
        return 2
    slurm: SlurmDriver | None = None
    try:
        try:
            policies = await load_policies(settings)
            metrics.policies_loaded(policies.digest, True)
        except PolicyError as e:  # invalid, or the loader ran out of time or memory, crashed
            log.error("cannot start: the policies cannot be loaded",
                      problems=[str(p) for p in e.problems])
            return 2
        await ensure_crd(api, settings.kube.install_crd)
        slurm = o.slurm or _slurm_driver(settings, api)
        return await _run(settings, replace(o, slurm=slurm), api, policies, metrics, ready)
    except ConfigError as e:
        log.error("cannot start", error=str(e))
        return 2
    finally:
        if slurm is not None and o.slurm is None:  # built here: its HTTP sessions close here
            await _close_slurm(slurm)
        await api.close()


async def _close_slurm(driver: SlurmDriver) -> None:
    """Close the Slurm driver's HTTP sessions (slurmrestd; the Slinky driver's job backend)."""
    for d in (driver, getattr(driver, "jobs", None)):
        close = getattr(d, "close", None)
        if close is not None:
            await close()


async def _run(settings: Settings, o: Overrides, api: client.ApiClient, policies: PolicySet,
               metrics: Metrics, ready: Callable[[Controller], Awaitable[None]] | None) -> int:
    nodes = KubeNodes(api)
    events = KubeEvents(api,  # Events about Nodes: the API server takes them only in default
                        instance=settings.leader.identity)
    store = CRStateStore(api)
    slurm = o.slurm or _slurm_driver(settings, api)
    workload = o.workload
    labels_provider = None
    slurm_names = o.slurm_names
    if workload is None:
        from healer.adapters.slinky import SlinkyPods, SlinkyWorkload

        sw = SlinkyWorkload(api, nodes, slurm, namespace=settings.slurm.nodeset_namespace,
                            nodeset=settings.slurm.nodeset)
        workload, labels_provider = sw, sw.node_selector
        if slurm_names is None and (settings.slurm.driver == "slinky" or settings.slurm.nodeset):
            # on Slinky the Slurm node is the slurmd pod's name, whichever driver drains it
            slurm_names = SlinkyPods(api, settings.slurm.nodeset_namespace).slurm_name_on
    spares = KubeSparePool(nodes, policies.fleet.spare_selector,
                           labels_provider=labels_provider,
                           topology_name="default" if settings.topology.source == "labels"
                           else None)
    validator = o.validator
    if validator is None:
        from healer.adapters.kube.jobs import JobValidator

        validator = JobValidator(api, namespace=settings.kube.namespace)
    secrets = Secrets(api)
    webhook = WebhookHook(nodes, secrets, callback_url=settings.callback_url)
    jobhook = JobHook(api, nodes, namespace=settings.kube.namespace)
    checkpoint = o.checkpoint or HookRouter({"slurm-signal": SlurmSignalCheckpoint(slurm, nodes),
                                             "webhook": webhook, "job": jobhook})
    ports = Ports(nodes=nodes, events=events, slurm=slurm, spares=spares, workload=workload,
                  topology=_topology(settings, api, nodes, slurm,
                                     slinky_pods=o.workload is None),
                  validator=validator, checkpoint=checkpoint,
                  repair=RepairRouter(nodes, {"webhook": webhook, "job": jobhook}),
                  slurm_names=slurm_names or same_name)
    clock = RealClock()
    executor = Executor(ports, clock.now)
    if o.after_write is not None:
        store = _WriteProbe(store, o.after_write)  # type: ignore[assignment]
    if o.after_action is not None:
        executor = _ActionProbe(ports, clock.now, o.after_action)
    ctl = Controller(policies=policies, executor=executor, store=store,
                     clock=clock, settings=o.runtime or RuntimeSettings(), observer=metrics)
    slurm_feed = _slurm_feed(settings, api, slurm, ctl, clock)
    health = Health()
    health.set_ready("policies", True)
    health.set_ready("nodes-synced", False)
    depth: dict[str, int] = {}
    sources = list(o.telemetry or [])
    prom: list[PrometheusSource] = []
    if settings.telemetry.prometheus_url:
        from healer.adapters.prometheus import PrometheusSource

        tel = settings.telemetry
        prom.append(PrometheusSource(
            tel.prometheus_url, policies, poll_interval=tel.poll_interval,
            host_labels=tel.host_labels, bearer_token_file=tel.bearer_token_file or None,
            ca_file=tel.ca_file or None, verify=not tel.insecure_skip_verify))
        sources.extend(prom)
    metrics.attach_state(StateSource(
        records=lambda: {n: s.record for n, s in ctl.records.items()},
        history=lambda: ctl.history, view=ctl.view, spare_depth=lambda: depth,
        leading=lambda: ctl.leading,
        slurm_feed=slurm_feed.metrics if slurm_feed is not None else dict,
        stale_nodes=lambda: {**{p.name: p.last_poll.stale_nodes for p in prom if p.last_poll},
                             **ctl.stale_conditions()},
        last_poll=lambda: {p.name: p.last_success for p in prom
                           if p.last_success is not None},
        dropped=lambda: {(p.name, m, r): n for p in prom
                         for (m, r), n in p.drops.series().items()}))
    def ack_target(incident: str) -> AckTarget | None:  # the incident's node and hook keys
        rec = ctl.history.get(incident)
        return target_of(rec, ctl.policies.get(rec.policy) if rec is not None else None)

    ack = AckReceiver(nodes, secrets, ack_target)
    debug = ctl.debug_state if settings.http.debug_state else None
    try:
        runner = await serve(make_app(health, metrics.registry, debug, ack.handle),
                             settings.http.host, settings.http.port)
    except OSError as e:  # in use, not an address of this host, unresolvable
        raise ConfigError(f"cannot serve HTTP on {settings.http.host}:{settings.http.port}: "
                          f"{e.strerror or e}") from e
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def watch_nodes() -> None:
        health.beat("node-watch", 600.0)
        async for ev in nodes.watch():
            health.beat("node-watch", 600.0)
            if ev.type == "SYNCED":
                health.set_ready("nodes-synced", True)
            await ctl.on_node_event(ev)

    async def spare_depth() -> None:
        while True:
            health.beat("spare-depth", 10 + LOOP_SLACK)
            with contextlib.suppress(HealerError):
                free = await spares.depth()
                # every NVLink domain that has nodes gets a series, 0 when none is free, so
                # "this domain has no spare left" can be alerted on
                domains = {v.labels[DOMAIN_LABEL] for v in ctl.nodes.values()
                           if DOMAIN_LABEL in v.labels}
                depth.clear()
                depth.update({d: free.get(d, 0) for d in domains | set(free)})
            await asyncio.sleep(10)

    def apply_policies(new: PolicySet) -> None:
        switch_policies(new, ctl, sources)

    self_events = SelfEvents(api, namespace=settings.kube.namespace,
                             instance=settings.leader.identity, pod=settings.kube.pod_name,
                             lease=settings.leader.lease_name)
    reload_every = settings.policy_reload_seconds
    reloader = PolicyReloader(
        settings.policies, apply=apply_policies, observer=metrics, emit=self_events.emit,
        max_mode=_max_mode(settings), budget=_budget(settings),
        beat=lambda: health.beat("policy-reload",
                                 reload_every + settings.policy_load_timeout + LOOP_SLACK))
    await reloader.prime()

    async def garbage() -> None:
        while True:
            health.beat("retention", 3600 + LOOP_SLACK)
            await asyncio.sleep(3600)
            with contextlib.suppress(HealerError):
                await ctl.collect_garbage()

    async def leadership() -> None:
        if not settings.leader.enabled:
            await ctl.start_leading()
            await asyncio.Event().wait()
        lead = Leadership(api, namespace=settings.kube.namespace,
                          name=settings.leader.lease_name, identity=settings.leader.identity,
                          on_start=ctl.start_leading, on_stop=ctl.stop_leading,
                          lease_duration=settings.leader.lease_duration,
                          renew_deadline=settings.leader.renew_deadline,
                          retry_period=settings.leader.retry_period)
        await lead.run()

    tasks: list[asyncio.Task[Any]] = [
        asyncio.create_task(health.loop_heartbeat(), name="heartbeat"),
        asyncio.create_task(watch_nodes(), name="node-watch"),
        asyncio.create_task(spare_depth(), name="spare-depth"),
        asyncio.create_task(reloader.run(reload_every), name="policy-reload"),
        asyncio.create_task(garbage(), name="retention"),
        asyncio.create_task(reconcile_heartbeat(health, ctl.probe), name="reconcile"),
        asyncio.create_task(leadership(), name="leadership"),
    ]
    if slurm_feed is not None:
        tasks.append(asyncio.create_task(slurm_feed.run(), name="slurm-feed"))
    for src in sources:
        max_age = max(SOURCE_MAX_AGE, 3 * float(getattr(src, "poll_interval", 0.0) or 0.0))
        tasks.append(asyncio.create_task(src.run(_beating(health, src.name, ctl, max_age)),
                                         name=f"source:{src.name}"))
    log.info("started", identity=settings.leader.identity, dry_run=settings.dry_run,
             policies=[f"{p.name}({p.mode.value})" for p in policies.policies])
    if ready is not None:
        await ready(ctl)
    stopper = asyncio.create_task(stop.wait(), name="stop")
    try:
        done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        code = 0
        for t in done:
            if t is not stopper and t.exception() is not None:
                log.error("task failed", task=t.get_name(), error=repr(t.exception()))
                code = 1
        log.info("shutting down", grace=settings.shutdown_grace)
        await ctl.drain(settings.shutdown_grace)
        await ctl.stop_leading()
        return code
    finally:  # also when this coroutine is cancelled (embedded, as in the demo and tests)
        for t in [stopper, *tasks]:
            t.cancel()
        await asyncio.gather(stopper, *tasks, return_exceptions=True)
        if ctl.leading:  # cancelled: stop the workers before the API client closes
            await ctl.stop_leading()
        for p in prom:
            p.close()
        await runner.cleanup()


def _slurm_feed(settings: Settings, api: client.ApiClient, slurm: SlurmDriver, ctl: Controller,
                clock: RealClock) -> SlurmFeed | None:
    """The guardrails' view of Slurm (issue 12), when the driver can list nodes."""
    from healer.adapters.slinky import SlinkyPods
    from healer.adapters.slurm.states import slurm_states

    if not settings.slurm.state_interval:
        return None
    hosts = None
    if settings.slurm.driver == "slinky" or settings.slurm.nodeset:  # Slurm name = the pod's
        hosts = SlinkyPods(api, settings.slurm.nodeset_namespace).hosts
    states = slurm_states(slurm, hosts)
    if states is None:
        log.warning("the Slurm driver cannot list nodes: the guardrails count only Kubernetes")
        return None
    ctl.expect_slurm()
    return SlurmFeed(states, ctl, clock, interval=settings.slurm.state_interval)


def switch_policies(new: PolicySet, ctl: Any, sources: Sequence[Any]) -> None:
    """Install reloaded policies: sources first (each re-derives its queries), then the
    controller; if any step raises, the sources already switched are switched back and the
    error propagates (the reloader reports it): nothing is half-applied."""
    old, switched = ctl.policies, []
    try:
        for src in sources:
            set_policies = getattr(src, "set_policies", None)
            if set_policies is not None:
                set_policies(new)
                switched.append(set_policies)
        ctl.set_policies(new)
    except Exception:
        for undo in switched:
            with contextlib.suppress(Exception):
                undo(old)
        raise


async def reconcile_heartbeat(health: Health, probe: Callable[[], Awaitable[None]],
                              every: float = 5.0) -> None:
    """Beat ``reconcile`` each time ``probe`` (the controller's step lock) comes back: a step
    stuck under the lock makes /healthz fail after :data:`RECONCILE_MAX_AGE`."""
    while True:
        await probe()
        health.beat("reconcile", RECONCILE_MAX_AGE)
        await asyncio.sleep(every)


def _beating(health: Health, name: str, ctl: Controller,
             max_age: float = SOURCE_MAX_AGE) -> Callable[[Any], Awaitable[None]]:
    """The sink a source feeds: each delivery is that source's heartbeat for ``/healthz``
    (a source delivers every poll, even when Prometheus is down), so a stuck poll loop makes
    the controller unhealthy instead of silently blind."""
    health.beat(f"source:{name}", max_age)

    async def sink(signals: Any) -> None:
        health.beat(f"source:{name}", max_age)
        await ctl.on_signals(signals)

    return sink


class _WriteProbe:
    def __init__(self, store: CRStateStore, hook: Callable[[Any], None]) -> None:
        self.store, self.hook = store, hook

    async def list(self) -> Any:
        return await self.store.list()

    async def save(self, record: Any, previous: Any) -> Any:
        out = await self.store.save(record, previous)
        self.hook(record)
        return out

    async def delete(self, name: str) -> None:
        await self.store.delete(name)


class _ActionProbe(Executor):
    def __init__(self, ports: Ports, clock: Callable[[], float],
                 hook: Callable[[Any], None]) -> None:
        super().__init__(ports, clock)
        self.hook = hook

    async def run(self, action: Any, record: Any) -> Any:
        out = await super().run(action, record)
        self.hook(action)
        return out

