"""The composition root of ``healer run``: builds every adapter, the controller and the loops
around it from :class:`~healer.settings.Settings`, and runs them until SIGTERM.

Read :func:`_run` first: the adapters (the ports the executor acts through), the controller,
the HTTP endpoints, the policy reloader, then the loops (:mod:`healer.runtime.loops`,
:mod:`healer.runtime.node_events`). Nothing else in healer constructs the daemon's adapters;
the drivers get what they share (the Kubernetes nodes client) from here.

Tests and embedders replace ports through :class:`Overrides` (the daemon integration tests run
this very function with file-backed fakes for Slurm) and may wrap the state store and the
executor (``wrap_store``, ``wrap_actions``: a test's fault injection lives in the test).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import structlog
from aiohttp import web
from kubernetes_asyncio import client

from healer.adapters import calls
from healer.adapters.acks import AckReceiver, AckTarget, target_of
from healer.adapters.checkpoint import HookRouter, SlurmSignalCheckpoint
from healer.adapters.clock import SYSTEM_CLOCK
from healer.adapters.fencing import KubeFencing
from healer.adapters.hooks import JobHook, RepairRouter, Secrets, WebhookHook
from healer.adapters.kube.client import ApiEventWriter, make_api_client
from healer.adapters.kube.events import KubeEvents
from healer.adapters.kube.leader import Leadership
from healer.adapters.kube.nodes import KubeNodes
from healer.adapters.kube.ratelimit import RateLimit, limit_requests
from healer.adapters.kube.self_events import SelfEvents
from healer.adapters.kube.spares import KubeSparePool
from healer.adapters.kube.store import CRStateStore, ensure_crd
from healer.adapters.slinky import OperatorCapabilities
from healer.adapters.spare_validation import SpareValidator
from healer.adapters.topology_step import KubeTopology
from healer.app_nodesets import NodeSetPorts, NodeSetWiring
from healer.core.engine import Engine
from healer.core.nodesets import NodeSetRules
from healer.core.rules import HookKind, Mode, PolicySet
from healer.core.slurm_drivers import SlurmDriverKind, capabilities_of
from healer.core.topology import TOPOGRAPH, TopologyKeys
from healer.errors import ConfigError, PolicyError
from healer.obs import logging as hlog
from healer.obs.http import Health, make_app, serve
from healer.obs.metrics import Metrics, StateSource
from healer.ports import (
    CheckpointHook,
    Clock,
    EventRecorder,
    RepairHook,
    SlurmDriver,
    SlurmHandles,
    SlurmStates,
    StateStore,
    TelemetrySource,
    Validator,
    Workload,
    slurm_handles,
)
from healer.runtime.controller import Controller, RuntimeSettings
from healer.runtime.dependencies import Dependencies
from healer.runtime.event_queue import EventQueue
from healer.runtime.executor import ActionRunner, Executor, Ports, SlurmNames, same_name
from healer.runtime.loops import (
    LOOP_SLACK,
    SOURCE_MAX_AGE,
    lead,
    reconcile_heartbeat,
    retention,
    run_until_stopped,
    source_sink,
    spare_depth,
)
from healer.runtime.node_events import NodeEvents
from healer.runtime.policy_reload import (
    Budget,
    PoliciesInForce,
    PolicyReloader,
    load_isolated,
    switch_policies,
)
from healer.runtime.slurm_feed import SlurmFeed
from healer.runtime.spare_validation import spare_validation
from healer.settings import Settings

if TYPE_CHECKING:
    from healer.adapters.prometheus import PrometheusSource

log = structlog.get_logger("healer.app")


@dataclass
class Overrides:
    """Ports a caller provides instead of the ones settings would build (tests, embedding)."""

    slurm: SlurmHandles | None = None
    """A Slurm driver with the capabilities the caller says it has."""
    workload: Workload | None = None
    checkpoint: CheckpointHook | None = None
    validator: Validator | None = None
    telemetry: list[TelemetrySource] | None = None
    runtime: RuntimeSettings | None = None
    wrap_store: Callable[[StateStore], StateStore] | None = None
    """Wraps the state store healer built (e.g. a test's probe after every persisted write)."""
    wrap_actions: Callable[[ActionRunner], ActionRunner] | None = None
    """Wraps the executor healer built (e.g. a test's probe after each action ran, before its
    outcome is persisted)."""


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
    # client-go's politeness: QPS and burst in front of every request (Leases exempt)
    limit_requests(api, RateLimit(settings.kube.api_qps, settings.kube.api_burst))
    side: SlurmSide | None = None
    try:
        try:
            policies = await load_policies(settings)
            metrics.policies_loaded(policies.digest, True)
        except PolicyError as e:  # invalid, or the loader ran out of time or memory, crashed
            log.error("cannot start: the policies cannot be loaded",
                      problems=[str(p) for p in e.problems])
            return 2
        await ensure_crd(api, settings.kube.install_crd)
        nodes = KubeNodes(api)
        side = _slurm_side(settings, api, nodes, o.slurm)
        return await _run(settings, o, api, nodes, side, policies, metrics, ready)
    except ConfigError as e:
        log.error("cannot start", error=str(e))
        return 2
    finally:
        if side is not None and o.slurm is None:  # built here: its HTTP sessions close here
            await side.handles.driver.close()
        await api.close()


async def _run(settings: Settings, o: Overrides, api: client.ApiClient, nodes: KubeNodes,
               side: SlurmSide, policies: PolicySet, metrics: Metrics,
               ready: Callable[[Controller], Awaitable[None]] | None) -> int:
    """The daemon: its ports, the controller, the HTTP endpoints, then its loops."""
    secrets = Secrets(api)
    slurm = side.handles
    # Events are written off the critical path, repeats folded into series (one queue)
    events = EventQueue(KubeEvents(ApiEventWriter(api), instance=settings.leader.identity))
    clock = SYSTEM_CLOCK
    # the policies in force, for the readers built before the controller; a reload moves it on
    in_force = PoliciesInForce(policies)
    hooks = _hooks(settings, api, nodes, secrets)
    # the daemon's one spare validator: every pool's claims validate through it
    validator = _spare_validator(nodes, events, hooks.repair, api, settings.kube.namespace,
                                 in_force, clock)
    ports = _ports(settings, o, api, nodes, secrets, side, policies, events=events,
                   hooks=hooks, validation=validator)
    runtime = o.runtime or RuntimeSettings()
    # the engine first: the NodeSet route reads its node cache (a node's labels pick its NodeSet)
    engine = Engine(policies, paused=runtime.paused)
    # several NodeSets (kind: SlurmNodeSet): each node acts through its NodeSet's ports
    nodesets = NodeSetPorts(
        functools.partial(_nodeset_wiring, settings, o, api, nodes, secrets, in_force,
                          validator, events=events),
        ports, in_force, _slurm_states(settings, api, slurm), nodes=lambda: engine.nodes)
    executor: ActionRunner = Executor(ports, clock, route=nodesets.route)
    store: StateStore = CRStateStore(api)
    if o.wrap_actions is not None:
        executor = o.wrap_actions(executor)
    if o.wrap_store is not None:
        store = o.wrap_store(store)
    ctl = Controller(policies=policies, executor=executor, store=store,
                     clock=clock, settings=runtime, observer=metrics, engine=engine)
    nodesets.prepare()
    health = Health(clock=clock.now)
    health.set_ready("policies", True)
    health.set_ready("nodes-synced", False)
    self_events = SelfEvents(api, namespace=settings.kube.namespace,
                             instance=settings.leader.identity, pod=settings.kube.pod_name,
                             lease=settings.leader.lease_name)
    # a lost Slurm view: on /readyz, as an Event, in the metrics
    slurm_feed = _slurm_feed(settings, nodesets if policies.nodesets or nodesets.default_states
                             else None, ctl, clock,
                             on_view=Dependencies(health, self_events.emit).slurm_view)
    prom = _prometheus(settings, policies)
    sources: list[TelemetrySource] = [*(o.telemetry or []), *prom]
    depth: dict[str, int] = {}
    metrics.attach_state(_state_source(ctl, prom, depth, slurm_feed, nodesets))
    runner = await _serve(settings, health, metrics, ctl, nodes, secrets, slurm_feed)
    reloader = _reloader(settings, self_events, metrics, health, clock,
                         apply=functools.partial(switch_policies, controller=ctl,
                                                 followers=prom, in_force=in_force))
    await reloader.prime()
    loops = {
        "heartbeat": health.loop_heartbeat(clock.sleep),
        "node-watch": NodeEvents(nodes, ctl, health).run(),
        "spare-depth": spare_depth(health, ports.spares, ctl, depth, clock),
        "spare-validation": spare_validation(health, validator, ports, ctl, clock),
        "policy-reload": reloader.run(settings.policy_reload_seconds),
        "retention": retention(health, ctl, clock),
        "reconcile": reconcile_heartbeat(health, ctl.probe, clock),
        "leadership": lead(ctl, _election(settings, api, ctl)),
    }
    if slurm_feed is not None:
        loops["slurm-feed"] = slurm_feed.run()
    for src in sources:
        max_age = max(SOURCE_MAX_AGE, 3 * src.poll_interval)
        loops[f"source:{src.name}"] = src.run(source_sink(health, src.name, ctl, max_age))

    async def started() -> None:
        log.info("started", identity=settings.leader.identity, dry_run=settings.dry_run,
                 policies=[f"{p.name}({p.mode.value})" for p in policies.policies])
        if ready is not None:
            await ready(ctl)

    try:
        return await run_until_stopped(ctl, loops, grace=settings.shutdown_grace,
                                       started=started)
    finally:
        for p in prom:
            p.close()
        if o.slurm is None:
            await nodesets.close()
        await events.close(settings.shutdown_grace)
        await runner.cleanup()


def _spare_validator(nodes: KubeNodes, events: EventRecorder, repair: RepairHook,
                     api: client.ApiClient, namespace: str, policies: PoliciesInForce,
                     clock: Clock) -> SpareValidator:
    """The daemon's one spare validator; its check Jobs run in ``namespace`` (healer's own)."""
    from healer.adapters.kube.check_jobs import KubeCheckJobs

    return SpareValidator(nodes, events, repair, KubeCheckJobs(api, namespace=namespace),
                          settings=lambda: policies().fleet.spare_validation, clock=clock)


@dataclass(frozen=True, slots=True)
class _Hooks:
    """The webhook and Job hooks one set of ports shares (checkpoint, repair, fencing)."""

    webhook: WebhookHook
    job: JobHook
    repair: RepairRouter


def _hooks(settings: Settings, api: client.ApiClient, nodes: KubeNodes,
           secrets: Secrets) -> _Hooks:
    webhook = WebhookHook(nodes, secrets, callback_url=settings.callback_url)
    job = JobHook(api, nodes, namespace=settings.kube.namespace)
    return _Hooks(webhook, job, RepairRouter(nodes, {HookKind.WEBHOOK: webhook, HookKind.JOB: job}))


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


@dataclass(frozen=True, slots=True)
class SlurmSide:
    """The Slurm driver (with its capabilities' handles) and what the topology step reads
    beside it."""

    handles: SlurmHandles
    view: SlurmDriver | None
    """Slurm's own API, for a node's topology (on Slinky the job backend, if any)."""
    operator: OperatorCapabilities
    """What the running slurm-operator supports (read lazily, only on Slinky)."""


def _slurm_side(settings: Settings, api: client.ApiClient, nodes: KubeNodes,
                given: SlurmHandles | None) -> SlurmSide:
    """The Slurm driver the settings name (``--slurm-driver``, built by its entry in
    :data:`_FACTORIES`), or the caller's."""
    operator = OperatorCapabilities(api)
    if given is not None:
        return SlurmSide(given, given.driver, operator)
    settings.slurm.check_driver()
    return _FACTORIES[settings.slurm.driver](settings, api, nodes, operator)


def _scontrol_side(settings: Settings, api: client.ApiClient, nodes: KubeNodes,
                   operator: OperatorCapabilities) -> SlurmSide:
    handles = _scontrol(settings)
    return SlurmSide(handles, handles.driver, operator)


def _slurmrestd_side(settings: Settings, api: client.ApiClient, nodes: KubeNodes,
                     operator: OperatorCapabilities) -> SlurmSide:
    handles = _slurmrestd(settings, api)
    return SlurmSide(handles, handles.driver, operator)


def _slinky_side(settings: Settings, api: client.ApiClient, nodes: KubeNodes,
                 operator: OperatorCapabilities) -> SlurmSide:
    from healer.adapters.slinky import SlinkyDriver

    s = settings.slurm
    # job listing and signals need Slurm's own API: slurmrestd, else scontrol, else none
    backend = SlurmDriverKind.SLURMRESTD if s.slurmrestd_url and s.token_secret else \
        SlurmDriverKind.SCONTROL if s.slurm_conf else None
    jobs = _slurmrestd(settings, api) if backend is SlurmDriverKind.SLURMRESTD else \
        _scontrol(settings) if backend is SlurmDriverKind.SCONTROL else None
    driver = SlinkyDriver(api, nodes, namespace=s.nodeset_namespace, jobs=jobs,
                          nodeset=s.nodeset, capabilities=operator)
    handles = slurm_handles(capabilities_of(SlurmDriverKind.SLINKY, backend), driver,
                            states=driver)
    return SlurmSide(handles, jobs.driver if jobs is not None else None, operator)


#: Each driver's factory (the registry entry, :data:`healer.core.slurm_drivers.DRIVERS`, says
#: what it can do and needs; this says how it is built).
_FACTORIES: Mapping[SlurmDriverKind, Callable[
    [Settings, client.ApiClient, KubeNodes, OperatorCapabilities], SlurmSide]] = {
    SlurmDriverKind.SLINKY: _slinky_side,
    SlurmDriverKind.SCONTROL: _scontrol_side,
    SlurmDriverKind.SLURMRESTD: _slurmrestd_side,
}


def _scontrol(settings: Settings) -> SlurmHandles:
    """An scontrol driver, with the handles its registry entry gives it."""
    from healer.adapters.slurm.scontrol import ScontrolDriver

    conf = settings.slurm.slurm_conf
    driver = ScontrolDriver(env={**os.environ, "SLURM_CONF": conf} if conf else None)
    return slurm_handles(capabilities_of(SlurmDriverKind.SCONTROL), driver, lister=driver)


def _slurmrestd(settings: Settings, api: client.ApiClient) -> SlurmHandles:
    """A slurmrestd driver, with the handles its registry entry gives it."""
    from healer.adapters.kube.secrets import SecretToken
    from healer.adapters.slurm.slurmrestd import SlurmrestdDriver

    s = settings.slurm
    driver = SlurmrestdDriver(s.slurmrestd_url, SecretToken(api, s.token_secret))
    return slurm_handles(capabilities_of(SlurmDriverKind.SLURMRESTD), driver, lister=driver)


def _topology(settings: Settings, api: client.ApiClient, nodes: KubeNodes, side: SlurmSide,
              keys: TopologyKeys) -> KubeTopology:
    """The topology step: the annotation from labels or from topograph, verified against the
    slurmd pod (Slinky) and against Slurm where it reports a node's topology."""
    from healer.adapters.slinky import SlinkyPods

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
    # where there are no slurmd pods (bare Slurm), the placement is not checked
    pods = SlinkyPods(api, settings.slurm.nodeset_namespace)
    # slurm-operator <v1.1 never copies the Node's topology annotation to the slurmd pod
    return KubeTopology(nodes, pods=pods, slurm=side.view, topograph=topograph,
                        copies_topology=side.operator.copies_topology, keys=keys)


def _ports(settings: Settings, o: Overrides, api: client.ApiClient, nodes: KubeNodes,
           secrets: Secrets, side: SlurmSide, policies: PolicySet,
           nodeset: NodeSetRules | None = None, *, events: EventRecorder | None = None,
           hooks: _Hooks | None = None, validation: SpareValidator | None = None) -> Ports:
    """Every port the executor acts through: the real adapters, or the caller's overrides;
    for ``nodeset``, with its spares, tolerations and topology labels (``settings`` then says
    its Slurm cluster and Slinky NodeSet, :func:`_nodeset_settings`); ``hooks``: the webhook
    and Job hooks, where already built; ``validation``: the spare validator claims use."""
    slurm = side.handles.driver
    keys = nodeset.topology if nodeset is not None else TOPOGRAPH
    workload = o.workload
    labels_provider = None
    if workload is None:
        from healer.adapters.slinky_workload import SlinkyWorkload

        sw = SlinkyWorkload(api, nodes, slurm, namespace=settings.slurm.nodeset_namespace,
                            nodeset=settings.slurm.nodeset, records=side.handles.records)
        workload, labels_provider = sw, sw.node_selector
    slurm_names: SlurmNames = same_name
    if settings.slurm.on_slinky:
        from healer.adapters.slinky import SlinkyPods

        # on Slinky the Slurm node is the slurmd pod's name, whichever driver drains it
        slurm_names = SlinkyPods(api, settings.slurm.nodeset_namespace).slurm_name_on
    spare_selector = (nodeset.spare_selector if nodeset is not None else None) \
        or policies.fleet.spare_selector
    spares = KubeSparePool(nodes, spare_selector, labels_provider=labels_provider,
                           topology_name="default" if settings.topology.source == "labels"
                           else None, keys=keys,
                           tolerations=nodeset.tolerations if nodeset is not None else None,
                           validation=validation)
    validator = o.validator
    if validator is None:
        from healer.adapters.kube.jobs import JobValidator

        validator = JobValidator(api, namespace=settings.kube.namespace)
    if hooks is None:
        hooks = _hooks(settings, api, nodes, secrets)
    webhook = hooks.webhook
    checkpoint = o.checkpoint or HookRouter({
        HookKind.SLURM_SIGNAL: SlurmSignalCheckpoint(slurm, nodes),
        HookKind.WEBHOOK: webhook, HookKind.JOB: hooks.job})
    if events is None:
        events = KubeEvents(ApiEventWriter(api), instance=settings.leader.identity)
    return Ports(nodes=nodes, events=events,
                 slurm=slurm, spares=spares, workload=workload,
                 topology=_topology(settings, api, nodes, side, keys),
                 validator=validator, checkpoint=checkpoint,
                 repair=hooks.repair,
                 fencing=KubeFencing(nodes, webhook, callback_url=settings.callback_url),
                 slurm_names=slurm_names, topology_keys=keys,
                 slurm_history=side.handles.history, slurm_hold=side.handles.hold)


def _nodeset_settings(settings: Settings, ns: NodeSetRules) -> Settings:
    """The settings as the command line would give them for this one NodeSet."""
    return replace(settings, slurm=replace(
        settings.slurm, driver=ns.slurm.driver, slurmrestd_url=ns.slurm.slurmrestd_url,
        token_secret=ns.slurm.token_secret, slurm_conf=ns.slurm.slurm_conf,
        nodeset_namespace=ns.namespace or settings.slurm.nodeset_namespace,
        nodeset=ns.nodeset))


def _nodeset_wiring(settings: Settings, o: Overrides, api: client.ApiClient, nodes: KubeNodes,
                    secrets: Secrets, policies: PoliciesInForce,
                    validator: SpareValidator, ns: NodeSetRules, *,
                    events: EventRecorder | None = None) -> NodeSetWiring:
    """One NodeSet's ports and Slurm feed (:class:`healer.app_nodesets.NodeSetPorts`)."""
    own = _nodeset_settings(settings, ns)
    side = _slurm_side(own, api, nodes, o.slurm)
    ports = _ports(own, o, api, nodes, secrets, side, policies(), ns, events=events,
                   validation=validator)
    return NodeSetWiring(ports, _slurm_states(own, api, side.handles), side.handles.driver)


def _prometheus(settings: Settings, policies: PolicySet) -> list[PrometheusSource]:
    """The DCGM-through-Prometheus source, when a Prometheus URL is set."""
    tel = settings.telemetry
    if not tel.prometheus_url:
        return []
    from healer.adapters.prometheus import PrometheusSource

    return [PrometheusSource(
        tel.prometheus_url, policies, poll_interval=tel.poll_interval,
        host_labels=tel.host_labels, bearer_token_file=tel.bearer_token_file or None,
        ca_file=tel.ca_file or None, verify=not tel.insecure_skip_verify)]


def _state_source(ctl: Controller, prom: Sequence[PrometheusSource], depth: Mapping[str, int],
                  slurm_feed: SlurmFeed | None, nodesets: NodeSetPorts) -> StateSource:
    """What the metrics read at scrape time."""
    return StateSource(
        records=lambda: {n: s.record for n, s in ctl.records.items()},
        history=lambda: ctl.history, view=ctl.view, spare_depth=lambda: depth,
        leading=lambda: ctl.leading,
        slurm_feed=(lambda: {**slurm_feed.metrics(), "nodesets": dict(nodesets.readable)})
        if slurm_feed is not None else dict,
        stale_nodes=lambda: {**{p.name: p.last_poll.stale_nodes for p in prom if p.last_poll},
                             **ctl.stale_conditions()},
        last_poll=lambda: {p.name: p.last_success for p in prom
                           if p.last_success is not None},
        dropped=lambda: {(p.name, m, r): n for p in prom
                         for (m, r), n in p.drops.series().items()})


async def _serve(settings: Settings, health: Health, metrics: Metrics, ctl: Controller,
                 nodes: KubeNodes, secrets: Secrets,
                 slurm_feed: SlurmFeed | None) -> web.AppRunner:
    """/healthz, /readyz, /metrics, /debug/state (when enabled) and the webhook acks."""
    def ack_target(incident: str) -> AckTarget | None:  # the incident's node and hook keys
        rec = ctl.history.get(incident)
        return target_of(rec, ctl.policies.get(rec.policy) if rec is not None else None)

    ack = AckReceiver(nodes, secrets, ack_target)
    def debug_state() -> dict[str, object]:  # the controller's, with the Slurm feed's findings
        state = ctl.debug_state()
        if slurm_feed is not None:
            state["slurmFeed"] = slurm_feed.debug()
        return state

    debug = debug_state if settings.http.debug_state else None
    try:
        return await serve(make_app(health, metrics.registry, debug, ack.handle),
                           settings.http.host, settings.http.port)
    except OSError as e:  # in use, not an address of this host, unresolvable
        raise ConfigError(f"cannot serve HTTP on {settings.http.host}:{settings.http.port}: "
                          f"{e.strerror or e}") from e


def _reloader(settings: Settings, self_events: SelfEvents, metrics: Metrics, health: Health,
              clock: Clock, *, apply: Callable[[PolicySet], None]) -> PolicyReloader:
    """The policy reload loop: a failed reload is an Event about healer itself."""
    every = settings.policy_reload_seconds + settings.policy_load_timeout + LOOP_SLACK
    return PolicyReloader(settings.policies, apply=apply, observer=metrics,
                          emit=self_events.emit, max_mode=_max_mode(settings),
                          budget=_budget(settings), beat=lambda: health.beat("policy-reload",
                                                                             every),
                          clock=clock)


def _election(settings: Settings, api: client.ApiClient, ctl: Controller) -> Leadership | None:
    """The Lease that makes one replica the leader (None: leader election is off)."""
    if not settings.leader.enabled:
        return None
    return Leadership(api, namespace=settings.kube.namespace, name=settings.leader.lease_name,
                      identity=settings.leader.identity, on_start=ctl.start_leading,
                      on_stop=ctl.stop_leading, lease_duration=settings.leader.lease_duration,
                      renew_deadline=settings.leader.renew_deadline,
                      retry_period=settings.leader.retry_period)


def _slurm_states(settings: Settings, api: client.ApiClient,
                  slurm: SlurmHandles) -> SlurmStates | None:
    """Slurm's node states by Kubernetes node, when the driver can list nodes."""
    from healer.adapters.slinky import SlinkyPods
    from healer.adapters.slurm.states import slurm_states

    hosts = None
    if settings.slurm.on_slinky:  # Slurm name = the pod's
        hosts = SlinkyPods(api, settings.slurm.nodeset_namespace).hosts
    return slurm_states(slurm, hosts)


def _slurm_feed(settings: Settings, states: SlurmStates | None, ctl: Controller,
                clock: Clock, *, on_view: Callable[[bool, str], Awaitable[None]]
                ) -> SlurmFeed | None:
    """The guardrails' view of Slurm (issue 12), when the drivers can list nodes."""
    if not settings.slurm.state_interval:
        return None
    if states is None:
        log.warning("the Slurm driver cannot list nodes: the guardrails count only Kubernetes")
        return None
    ctl.expect_slurm()
    return SlurmFeed(states, ctl, clock, interval=settings.slurm.state_interval,
                     on_view=on_view)
