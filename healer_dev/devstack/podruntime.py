"""A pod runtime for kwok: a real ``slurmd -Z`` for every Running Slinky worker pod.

This is a STAND-IN for kubelet + container runtime, for slurmd pods only. kwok fakes
kubelets (it moves pods to Running, runs no container); slurm-operator's NodeSet worker pods
(labels ``app.kubernetes.io/name=slurmd``, ``app.kubernetes.io/component=worker``) would each
run ``slurmd -Z --conf-server … --conf 'Features=…'`` and, when terminating, the preStop hook
``scontrol update nodename=$(hostname) state=down reason='Pod is terminating' && scontrol
delete nodename=$(hostname)``. :class:`PodRuntime` does that against a
:class:`~healer_dev.devstack.slurm.LocalSlurm` created with ``max_dynamic_nodes``:

* it lists and watches the worker pods (the loop survives watch expiry, 410 and API errors:
  it logs, backs off and lists again);
* for a pod that is Running, bound (``spec.nodeName``) and not terminating it adds the
  finalizer :data:`FINALIZER` to the pod, then starts a dynamic slurmd under the pod's Slurm
  name (label ``nodeset.slinky.slurm.net/pod-hostname``; else ``spec.nodeName`` with
  ``hostNetwork``; else ``spec.hostname``; else the pod name) with the slurmd container's
  ``--conf`` argument as the operator wrote it (``Features=…`` and the NodeSet's ``extraConf``
  items), followed, as the slurmd image's entrypoint appends its own, by ``CPUs=``,
  ``RealMemory=`` and ``Gres=gpu:h100:<the container's nvidia.com/gpu limit>`` (else this
  runtime's) where the ``--conf`` has none: so a ``--conf`` Slurm refuses (an empty
  ``Topology=``, SlinkyProject/slurm-operator#261) registers as it would in the pod; on a
  loopback "pod IP" (127.0.0.N, one per pod uid, released when it stops);
* when the pod gets a ``deletionTimestamp`` (or vanishes) it runs the operator's preStop
  commands, stops that slurmd (SIGTERM, then its process group and slurmstepds are killed)
  and removes the finalizer: as with a real kubelet, the pod object stays (Terminating) until
  the preStop ran and the container stopped; kwok's ``healer-pod-gone`` stage deleted it with
  grace period 0 already, so the API server removes it as soon as the finalizer goes;
* everything for one Slurm name is serialized: a StatefulSet pod recreated under the same name
  gets its slurmd only after the old pod's preStop and stop are done.

**Dead nodes** (:meth:`PodRuntime.kill_node`): the runtime stops acting for a node's pods as
a dead kubelet would: no preStop, no new slurmd, its finalizer stays through a graceful delete
(the pod stays Terminating, as a real one whose kubelet never confirms); the node's slurmds
are killed with their jobs (power loss) or frozen (SIGSTOP: cut off but alive). Only a *force*
delete (grace period 0, e.g. kube-controller-manager's pod garbage collector on an
out-of-service node) releases the finalizer, since the API server would remove a real pod at
once (this finalizer stands for the kubelet's confirmation, which a force delete skips); the
slot is then freed without a preStop. :meth:`PodRuntime.revive_node` lets the node's frozen
slurmds answer again and the runtime act for it again.

It does not: run the container image, configless mode (``--conf-server``; slurmd reads the
LocalSlurm's slurm.conf), probes, restarts of a slurmd that died on its own, resource limits
(beyond the GPU count), volumes, or the grace period (preStop commands have their own
timeouts). The slurmds run the LocalSlurm's Slurm (26.05 under the Slinky stack), so their
preStop ``scontrol`` is that Slurm's too. It does not update pod status (kwok does). :meth:`aclose`
stops every slurmd without a preStop (as a dying node would) and removes its finalizers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from healer_dev.devstack.slurm import LocalSlurm

__all__ = [
    "FINALIZER",
    "POD_HOSTNAME_LABEL",
    "PRESTOP_REASON",
    "SELECTOR",
    "HistoryEntry",
    "PodRuntime",
    "conf_features",
    "slurm_name_of",
]

log = logging.getLogger(__name__)

FINALIZER = "devstack.healer.io/slurmd"
#: the operator's worker pod labels (labels.WithWorkerLabels: app slurmd, component worker)
SELECTOR = "app.kubernetes.io/name=slurmd,app.kubernetes.io/component=worker"
POD_HOSTNAME_LABEL = "nodeset.slinky.slurm.net/pod-hostname"
CONTAINER = "slurmd"
#: the Node's topology spec the operator copies to the pod (v1.1+)
TOPOLOGY_ANNOTATION = "topology.slinky.slurm.net/spec"
#: the reason text of the operator's preStop hook (workerbuilder/worker_app.go)
PRESTOP_REASON = "Pod is terminating"


class HistoryEntry(NamedTuple):
    time: float  # time.time()
    event: str  # seen-running, starting, registered, start-failed, prestop, prestop-failed,
    #             stopped, finalizer-added, finalizer-removed
    slurm_name: str
    pod: str  # namespace/name
    node: str  # the Kubernetes Node


@dataclass(frozen=True)
class _Pod:
    uid: str
    namespace: str
    name: str
    slurm_name: str
    node: str
    running: bool
    terminating: bool
    finalized: bool  # carries our finalizer
    features: str | None
    conf: str = ""  # the slurmd container's --conf value, unquoted
    gpus: int | None = None  # the slurmd container's nvidia.com/gpu limit
    topology: str = ""  # the pod's topology.slinky.slurm.net/spec annotation
    forced: bool = False  # deleted with grace period 0 (a force delete)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def should_run(self) -> bool:
        return self.running and bool(self.node) and not self.terminating


@dataclass
class _Slot:
    pod: _Pod
    ip: str


def slurm_name_of(pod: Any) -> str:
    """The Slurm node name of a worker pod (a ``V1Pod``), "" when it has none yet."""
    md, spec = pod.metadata, pod.spec
    mode = (md.labels or {}).get("nodeset.slinky.slurm.net/scaling-mode")
    if spec is not None and spec.host_network and mode != "DaemonSet":
        return str(spec.node_name or "")  # the operator's GetSlurmNodeName
    label = (md.labels or {}).get(POD_HOSTNAME_LABEL)
    if label:
        return str(label)
    if spec is not None and spec.hostname:
        return str(spec.hostname)
    return str(md.name)


def conf_value(args: Sequence[str]) -> str:
    """The value of a slurmd ``--conf`` argument, unquoted (the operator quotes it: ``'A=1
    B=2'``); "" when there is none."""
    args = list(args)
    for i, a in enumerate(args):
        if a == "--conf" and i + 1 < len(args):
            return args[i + 1].strip().strip("'\"")
        if a.startswith("--conf="):
            return a.split("=", 1)[1].strip().strip("'\"")
    return ""


def conf_features(args: Sequence[str]) -> str | None:
    """``Features`` of a slurmd ``--conf`` argument (the operator quotes it: ``'A=1 B=2'``)."""
    for item in conf_value(args).split():
        key, _, val = item.partition("=")
        if key.lower() in ("features", "feature") and val:
            return val
    return None


def _conf_keys(conf: str) -> set[str]:
    return {item.partition("=")[0].lower() for item in conf.split() if "=" in item}


def _view(pod: Any) -> _Pod:
    md, spec, st = pod.metadata, pod.spec, pod.status
    features = None
    conf = ""
    gpus: int | None = None
    for c in (spec.containers or []) if spec is not None else []:
        if c.name == CONTAINER:
            features = conf_features(c.args or [])
            conf = conf_value(c.args or [])
            limit = ((c.resources.limits if c.resources is not None else None) or {}).get(
                "nvidia.com/gpu")
            gpus = int(limit) if limit is not None and str(limit).isdigit() else None
    return _Pod(
        uid=str(md.uid), namespace=str(md.namespace), name=str(md.name),
        slurm_name=slurm_name_of(pod), node=str((spec.node_name if spec else None) or ""),
        running=st is not None and st.phase == "Running",
        terminating=md.deletion_timestamp is not None,
        finalized=FINALIZER in (md.finalizers or []), features=features, conf=conf, gpus=gpus,
        topology=str((md.annotations or {}).get(TOPOLOGY_ANNOTATION, "")),
        forced=md.deletion_timestamp is not None and md.deletion_grace_period_seconds == 0)


class _IPs:
    """Loopback pod IPs: round robin over 127.0.0.0/8 (not .0, .1 of 127.0.0, .255 ends)."""

    def __init__(self, first: str = "127.0.0.2") -> None:
        self._next = int(ipaddress.IPv4Address(first))
        self._by_uid: dict[str, str] = {}

    def get(self, uid: str) -> str:
        if uid in self._by_uid:
            return self._by_uid[uid]
        used = set(self._by_uid.values())
        while True:
            ip = ipaddress.IPv4Address(self._next)
            self._next += 1
            if self._next >= int(ipaddress.IPv4Address("127.255.255.255")):
                self._next = int(ipaddress.IPv4Address("127.0.0.2"))
            s = str(ip)
            if s != "127.0.0.1" and not s.endswith((".0", ".255")) and s not in used:
                self._by_uid[uid] = s
                return s

    def release(self, uid: str) -> None:
        self._by_uid.pop(uid, None)


class PodRuntime:
    """Runs a real dynamic slurmd for every Running worker pod (see the module docstring).

    >>> rt = PodRuntime(api, slurm, namespace="ns")       # doctest: +SKIP
    >>> task = asyncio.create_task(rt.run()); ...; await rt.aclose()
    """

    def __init__(self, api: client.ApiClient, slurm: LocalSlurm, *, namespace: str | None = None,
                 namespaces: Iterable[str] | None = None, cpus: int | None = None,
                 real_memory: int = 1000, gres: str | None = None,
                 label_selector: str = SELECTOR, watch_timeout: int = 60,
                 command_timeout: float = 30.0, retry_delay: float = 5.0,
                 history_size: int = 1000) -> None:
        self.core = client.CoreV1Api(api)
        self.slurm = slurm
        self.namespace = namespace
        #: with ``namespaces`` (not None), only pods in these namespaces get a slurmd; the
        #: set grows with :meth:`handle_namespace` (other runtimes may own other namespaces)
        self.namespaces: set[str] | None = set(namespaces) if namespaces is not None else None
        self.cpus = cpus if cpus is not None else slurm.cpus_per_node
        self.real_memory = real_memory
        self.gres = gres if gres is not None else (
            f"gpu:h100:{slurm.gpus_per_node}" if slurm.gpus_per_node else "")
        self.label_selector = label_selector
        self.watch_timeout = watch_timeout
        self.command_timeout = command_timeout
        self.retry_delay = retry_delay
        self.history: deque[HistoryEntry] = deque(maxlen=history_size)
        self.errors: deque[str] = deque(maxlen=100)
        self.synced = asyncio.Event()  # set after the first list
        #: cleared, slurmd starts wait (as a slow image pull or a crash-looping container
        #: would); thread-safe, so a test on another event loop can hold and release it
        self.start_gate = threading.Event()
        self.start_gate.set()
        #: set, a slurmd's ``--conf`` carries ``Topology=<the pod's topology annotation>``
        #: (empty when it has none) before what the image appends, as slurm-operator 1.2's
        #: pods do: an empty one makes Slurm read the next item as the topology and refuse
        #: the registration (SlinkyProject/slurm-operator#261). Off: v1.1's pods, which get
        #: their topology from the operator through slurmrestd after registering.
        self.conf_topology = False
        self._pods: dict[str, _Pod] = {}  # uid -> latest view
        self._slots: dict[str, _Slot] = {}  # Slurm name -> the slurmd running for a pod
        self._dirty: set[str] = set()
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._ips = _IPs()
        self._seen_running: set[str] = set()
        self._run_task: asyncio.Task[None] | None = None
        self._closing = False
        #: Kubernetes node -> how its slurmds died ("kill" or "freeze"): a dead kubelet
        self.dead_nodes: dict[str, str] = {}

    # -- public ----------------------------------------------------------------------------

    @property
    def running(self) -> dict[str, str]:
        """Slurm name -> ``namespace/pod`` of every slurmd this runtime started."""
        return {n: s.pod.key for n, s in self._slots.items()}

    @property
    def addresses(self) -> dict[str, str]:
        """Slurm name -> the loopback "pod IP" its slurmd listens on."""
        return {n: s.ip for n, s in self._slots.items()}

    def handle_namespace(self, namespace: str) -> None:
        """Run slurmds for the pods of ``namespace`` too (with a ``namespaces`` filter; call
        it on the runtime's event loop). Pods already there are picked up on the next watch
        event or list."""
        if self.namespaces is not None:
            self.namespaces.add(namespace)

    async def kill_node(self, node: str, *, slurmd: str = "kill") -> list[str]:
        """From now on ``node``'s kubelet is dead (see the module docstring): its slurmds are
        killed with their jobs (``slurmd="kill"``, a power loss) or frozen (``"freeze"``,
        SIGSTOP: cut off, still alive). Returns the Slurm names of its slurmds."""
        if slurmd not in ("kill", "freeze"):
            raise ValueError(f"slurmd must be kill or freeze, not {slurmd!r}")
        self.dead_nodes[node] = slurmd
        sig = signal.SIGKILL if slurmd == "kill" else signal.SIGSTOP
        names = [n for n, slot in self._slots.items() if slot.pod.node == node]
        for name in names:
            await asyncio.to_thread(self.slurm.signal_dynamic_slurmd, name, sig)
            self._record(f"node-dead-{slurmd}", name, self._slots[name].pod)
        return names

    async def revive_node(self, node: str) -> list[str]:
        """``node``'s kubelet answers again: its frozen slurmds go on (SIGCONT) and the runtime
        acts for its pods again. Returns the Slurm names of its slurmds still running."""
        how = self.dead_nodes.pop(node, None)
        names = [n for n, slot in self._slots.items() if slot.pod.node == node]
        for name in names:
            slot = self._slots[name]
            self._record("node-revived", name, slot.pod)
            if how == "freeze":
                await asyncio.to_thread(self.slurm.signal_dynamic_slurmd, name, signal.SIGCONT)
            else:  # killed: the kubelet starts the container again
                await asyncio.to_thread(self.slurm.stop_dynamic_slurmd, name)
                self._release(name, slot, "stopped")
            self._mark(name)
        for p in list(self._pods.values()):
            if p.node == node:
                self._mark(p.slurm_name)
        return names

    def events(self, event: str | None = None, slurm_name: str | None = None
               ) -> list[HistoryEntry]:
        return [h for h in self.history if (event is None or h.event == event)
                and (slurm_name is None or h.slurm_name == slurm_name)]

    async def run(self) -> None:
        """List + watch the worker pods until cancelled (or :meth:`aclose`)."""
        self._run_task = asyncio.current_task()
        backoff = 0.2
        while not self._closing:
            try:
                rv = await self._resync()
                backoff = 0.2
                kw: dict[str, Any] = {"label_selector": self.label_selector,
                                      "resource_version": rv,
                                      "timeout_seconds": self.watch_timeout}
                fn, args = self._list_fn()
                async with watch.Watch() as w:
                    async for ev in w.stream(fn, *args, **kw):
                        self._on_pod(str(ev["type"]), ev["object"])
            except asyncio.CancelledError:
                raise
            except Exception as e:  # expired watch (410), API down...: list again
                if isinstance(e, ApiException) and e.status == 410:
                    log.debug("pod runtime: watch expired, listing again")
                    continue
                self.errors.append(f"watch: {type(e).__name__}: {e}")
                log.warning("pod runtime: pod watch failed (%s); listing again in %.1f s",
                            e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def aclose(self) -> None:
        """Stop watching, stop every slurmd (no preStop) and remove this runtime's finalizers
        from their pods. Idempotent."""
        self._closing = True
        if self._run_task is not None and self._run_task is not asyncio.current_task():
            self._run_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._run_task
        # let a slurmd start-up or preStop in a thread finish (a cancelled await would leave
        # the thread running and perhaps a slurmd behind), then cancel what is left
        workers = list(self._workers.values())
        if workers:
            _, late = await asyncio.wait(workers, timeout=self.slurm.start_timeout + 15)
            for t in late:
                t.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        for name, slot in list(self._slots.items()):
            await asyncio.to_thread(self.slurm.stop_dynamic_slurmd, name)
            self._release(name, slot, "stopped")
            with contextlib.suppress(Exception):
                await self._remove_finalizer(slot.pod)

    # -- watching --------------------------------------------------------------------------

    def _list_fn(self) -> tuple[Any, tuple[Any, ...]]:
        if self.namespace:
            return self.core.list_namespaced_pod, (self.namespace,)
        return self.core.list_pod_for_all_namespaces, ()

    async def _resync(self) -> str:
        fn, args = self._list_fn()
        pods = await fn(*args, label_selector=self.label_selector)
        seen = set()
        for p in pods.items:
            self._on_pod("SYNC", p)
            seen.add(str(p.metadata.uid))
        for uid in [u for u in self._pods if u not in seen]:
            self._forget(uid)
        # pods whose slurmd runs but that were neither listed nor known any more
        for name, slot in self._slots.items():
            if slot.pod.uid not in seen:
                self._mark(name)
        self.synced.set()
        return str(pods.metadata.resource_version)

    def _on_pod(self, kind: str, obj: Any) -> None:
        if kind == "BOOKMARK" or obj is None or getattr(obj, "metadata", None) is None:
            return
        pod = _view(obj)
        if self.namespaces is not None and pod.namespace not in self.namespaces \
                and pod.uid not in self._pods:
            return  # another runtime's (or nobody's) pod
        if kind == "DELETED":
            self._forget(pod.uid)
            return
        if not pod.slurm_name:
            return
        old = self._pods.get(pod.uid)
        self._pods[pod.uid] = pod
        if old is not None and old.slurm_name != pod.slurm_name:
            self._mark(old.slurm_name)
        if pod.should_run and pod.uid not in self._seen_running:
            self._seen_running.add(pod.uid)
            self._record("seen-running", pod.slurm_name, pod)
        self._mark(pod.slurm_name)

    def _forget(self, uid: str) -> None:
        pod = self._pods.pop(uid, None)
        self._seen_running.discard(uid)
        if pod is not None:
            self._mark(pod.slurm_name)

    # -- per Slurm name, serialized ----------------------------------------------------------

    def _mark(self, name: str) -> None:
        if self._closing or not name:
            return
        self._dirty.add(name)
        if name not in self._workers:
            self._workers[name] = asyncio.create_task(self._worker(name),
                                                      name=f"pod-runtime {name}")

    async def _worker(self, name: str) -> None:
        try:
            while name in self._dirty and not self._closing:
                self._dirty.discard(name)
                try:
                    await self._reconcile(name)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    self.errors.append(f"{name}: {type(e).__name__}: {e}")
                    log.warning("pod runtime: %s: %s; again in %.1f s", name, e,
                                self.retry_delay)
                    asyncio.get_running_loop().call_later(self.retry_delay, self._mark, name)
        finally:
            self._workers.pop(name, None)
        if name in self._dirty and not self._closing:
            self._mark(name)

    async def _reconcile(self, name: str) -> None:
        slot = self._slots.get(name)
        if slot is not None:
            cur = self._pods.get(slot.pod.uid)
            if slot.pod.node in self.dead_nodes:
                if cur is None or cur.forced:  # force-deleted: the API server drops it at once
                    await self._dead_teardown(name, slot, cur)
                    self._dirty.add(name)
                return  # a dead kubelet does nothing else
            if cur is not None and cur.should_run and cur.slurm_name == name:
                slot.pod = cur
                return
            await self._teardown(name, slot, cur)
            self._dirty.add(name)  # a replacement pod may be waiting
            return
        pods = [p for p in self._pods.values() if p.slurm_name == name]
        for p in pods:
            dead = p.node in self.dead_nodes
            if p.terminating and p.finalized and (not dead or p.forced):
                await self._remove_finalizer(p)  # e.g. its slurmd never came up
        ready = sorted((p for p in pods if p.should_run and p.node not in self.dead_nodes),
                       key=lambda p: p.key)
        if ready:
            await self._bringup(name, ready[0])

    async def _bringup(self, name: str, pod: _Pod) -> None:
        if not self.start_gate.is_set():  # held (tests): look again shortly
            asyncio.get_running_loop().call_later(0.2, self._mark, name)
            return
        if not pod.finalized:
            try:
                await self._patch(pod, {"metadata": {"finalizers": [FINALIZER], "uid": pod.uid}})
            except ApiException as e:
                if e.status in (404, 409, 422):  # gone, or being deleted: no new finalizer
                    log.debug("pod runtime: %s: no finalizer (%s)", pod.key, e.status)
                    return
                raise
            self._record("finalizer-added", name, pod)
        slot = self._slots[name] = _Slot(pod, self._ips.get(pod.uid))
        conf = self.slurmd_conf(pod)
        self._record("starting", name, pod)
        try:
            await asyncio.to_thread(self.slurm.start_dynamic_slurmd, name, pod_ip=slot.ip,
                                    conf=conf, wait=True)
        except Exception as e:
            self._record("start-failed", name, pod)
            await asyncio.to_thread(self.slurm.stop_dynamic_slurmd, name)
            self._release(name, slot, None)
            await self._remove_finalizer(pod)
            raise RuntimeError(f"slurmd for pod {pod.key} did not start: {e}") from e
        self._record("registered", name, pod)
        await self._mark_ready(pod)

    def slurmd_conf(self, pod: _Pod) -> str:
        """The pod's ``--conf``, then what the slurmd image appends where it is absent."""
        have = _conf_keys(pod.conf)
        extra = []
        if self.conf_topology and "topology" not in have:
            extra.append(f"Topology={pod.topology}")
        if "cpus" not in have:
            extra.append(f"CPUs={self.cpus}")
        if "realmemory" not in have:
            extra.append(f"RealMemory={self.real_memory}")
        gres = f"gpu:h100:{pod.gpus}" if pod.gpus else self.gres
        if "gres" not in have and gres:
            extra.append(f"Gres={gres}")
        return " ".join(x for x in (pod.conf, *extra) if x)

    async def _mark_ready(self, pod: _Pod) -> None:
        """The slurmd container's readiness probe passes once slurmd serves: the pod turns
        Ready only now (kwok's ``healer-slurmd-pod-started`` stage started it unready). The
        real operator deletes a Ready pod whose Slurm node is not registered, so a pod must
        not look Ready before its slurmd registered."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conds = [{"type": t, "status": "True", "lastTransitionTime": now}
                 for t in ("ContainersReady", "Ready")]
        try:
            await self.core.patch_namespaced_pod_status(
                pod.name, pod.namespace, {"metadata": {"uid": pod.uid},
                                          "status": {"conditions": conds}})
        except ApiException as e:
            if e.status not in (404, 409, 422):
                raise
            return
        self._record("ready", pod.slurm_name, pod)

    async def _teardown(self, name: str, slot: _Slot, cur: _Pod | None) -> None:
        """preStop (when the pod is terminating or gone), stop slurmd, drop the finalizer."""
        pod = cur or slot.pod
        if cur is None or cur.terminating:
            self._record("prestop", name, pod)
            ok = await self._scontrol("update", f"nodename={name}", "state=down",
                                      f"reason={PRESTOP_REASON}")
            if ok:
                ok = await self._scontrol("delete", f"nodename={name}")
            if not ok:
                self._record("prestop-failed", name, pod)
        await asyncio.to_thread(self.slurm.stop_dynamic_slurmd, name)
        self._release(name, slot, "stopped")
        if cur is not None:
            await self._remove_finalizer(cur)

    async def _dead_teardown(self, name: str, slot: _Slot, cur: _Pod | None) -> None:
        """A pod of a dead node was force-deleted: no preStop (nobody is there to run it),
        its slurmd (dead or frozen) is reaped, its finalizer released."""
        await asyncio.to_thread(self.slurm.stop_dynamic_slurmd, name)
        self._release(name, slot, "force-deleted")
        if cur is not None:
            await self._remove_finalizer(cur)

    def _release(self, name: str, slot: _Slot, event: str | None) -> None:
        if self._slots.get(name) is slot:
            del self._slots[name]
        self._ips.release(slot.pod.uid)
        if event:
            self._record(event, name, slot.pod)

    # -- helpers -----------------------------------------------------------------------------

    async def _scontrol(self, *args: str) -> bool:
        argv = ["scontrol", *args]
        try:
            r = await asyncio.to_thread(self.slurm.run, argv, check=False,
                                        timeout=self.command_timeout)
        except Exception as e:  # a timeout (ConfigError)
            self.errors.append(f"{' '.join(argv)}: {e}")
            return False
        if r.returncode != 0:
            self.errors.append(f"{' '.join(argv)}: exit {r.returncode}: "
                               f"{(r.stderr or r.stdout).strip()}")
        return r.returncode == 0

    async def _patch(self, pod: _Pod, body: dict[str, Any]) -> None:
        # a dict body goes out as a strategic merge patch (finalizers merge as a set)
        await self.core.patch_namespaced_pod(pod.name, pod.namespace, body)

    async def _remove_finalizer(self, pod: _Pod) -> None:
        try:
            await self._patch(pod, {"metadata": {
                "$deleteFromPrimitiveList/finalizers": [FINALIZER],
                "uid": pod.uid}})  # never touch a newer pod of the same name
        except ApiException as e:
            if e.status not in (404, 409, 422):
                raise
            return
        self._record("finalizer-removed", pod.slurm_name, pod)

    def _record(self, event: str, name: str, pod: _Pod) -> None:
        self.history.append(HistoryEntry(time.time(), event, name, pod.key, pod.node))
        log.debug("pod runtime: %s %s (pod %s on %s)", event, name, pod.key, pod.node)
