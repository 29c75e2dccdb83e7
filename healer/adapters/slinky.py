"""The Slinky slurm-operator driver and the warm-spare workload move, through Kubernetes only.

Slinky turns a cordoned Node into a drained Slurm node (reason ``slurm-operator: <the Node's
nodeset.slinky.slurm.net/node-cordon-reason>``) and an uncordon into an undrain, but only for
reasons it owns. So healer's drain is: write the cordon-reason annotation *first*, then cordon
(the operator keeps an existing reason, so the order matters); the Slurm state is read from
the slurmd pod's ``SlurmNodeState*`` conditions; undrain is: remove healer's annotation and
uncordon, and the operator undrains. healer never touches a reason it did not set.

Moving the workload to a spare depends on the NodeSet's scaling mode:

* StatefulSet: the Slurm node name is the pod's; once Slurm reports it drained and idle, the pod
  is evicted (the eviction API, so a PodDisruptionBudget's 429 is honoured) and the operator
  recreates it on the spare (the old node is cordoned, the spare carries the NodeSet's
  node-selector labels). A busy slurmd pod is never evicted or deleted: its preStop hook sets the
  Slurm node DOWN, which kills jobs.
* DaemonSet: the spare becomes a *new* Slurm node (named after it); the bad node's Slurm record
  stays drained.

What the real operator does and healer relies on (read at v1.0.0 and v1.1.0):

* It adds no affinity: a recreated StatefulSet-mode pod lands on *any* uncordoned Node matching
  the NodeSet's nodeSelector and tolerations. So a claimed spare stays closed (the NoSchedule
  spare taint) until ``move`` evicts, and per NodeSet at most one claimed spare is open without
  its slurmd pod at a time (checked against the cluster, so it holds across a leader restart).
* Evicting the pod runs its preStop hook, which deletes the Slurm node record: a drain someone
  else set (an admin's ``scontrol update state=drain``) would be lost and the new pod register
  IDLE. ``move`` holds (PENDING) while Slurm shows such a drain (docs/adr/0006).
* It undrains an uncordoned node only with ``updateStrategy.type: RollingUpdate`` (OnDelete or
  an empty type: never), and v1.0 panics on a RollingUpdate without a ``rollingUpdate`` block:
  ``drain`` refuses (PermanentError) before changing anything in those cases.
* Only v1.1+ copies the Node's topology annotation to the slurmd pod
  (:class:`OperatorCapabilities` tells which one runs).
* It re-lists Slurm every 30 s and requeues every 10-30 s; cordon to DRAIN takes about 1.4 s
  and the pod conditions follow about 2 s later: every wait here is a PENDING the policy's
  pollInterval polls again, never a sleep in the adapter.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import structlog
from kubernetes_asyncio import client

from healer.adapters.kube.client import call, to_dict
from healer.adapters.kube.nodes import KubeNodes
from healer.adapters.kube.pods import Evicted, evict
from healer.core.vocabulary import (
    CLAIM_LABEL,
    CLAIMED_BY,
    CORDONED_BY,
    CORDONED_BY_HEALER,
    SLURM_REASON_PREFIX,
    SPARE_TAINT,
    TAINT_EFFECT,
    TAINT_VALUE,
)
from healer.errors import HealerError, NotFoundError, PermanentError, TransientError
from healer.ports import (
    HookResult,
    SlurmDriver,
    SlurmJob,
    SlurmNodeState,
    StepOutcome,
)

NODESET_GROUP, NODESET_VERSION, NODESET_PLURAL = "slinky.slurm.net", "v1beta1", "nodesets"
SLURMD_SELECTOR = "app.kubernetes.io/name=slurmd"
CORDON_REASON = "nodeset.slinky.slurm.net/node-cordon-reason"
POD_HOSTNAME = "nodeset.slinky.slurm.net/pod-hostname"
SCALING_MODE_LABEL = "nodeset.slinky.slurm.net/scaling-mode"
OPERATOR_PREFIX = "slurm-operator: "
CONDITION_PREFIX = "SlurmNodeState"
BASE_STATES = ("Allocated", "Down", "Error", "Future", "Idle", "Mixed", "Unknown")
NODESET_INSTANCE = "app.kubernetes.io/instance"
NODESET_CRD = "nodesets.slinky.slurm.net"

log = structlog.get_logger("healer.adapters.slinky")


def slurm_name(pod: Mapping[str, Any]) -> str:
    """The Slurm node name of a slurmd pod, as the operator derives it (``GetSlurmNodeName``):
    with ``hostNetwork`` outside DaemonSet mode, the Node's name (the pod-hostname label is set
    before the pod is scheduled, so it is empty then); otherwise the pod-hostname label, the
    pod's hostname, or its name."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    labels = meta.get("labels") or {}
    if spec.get("hostNetwork") and labels.get(SCALING_MODE_LABEL) != "DaemonSet":
        return str(spec.get("nodeName") or "")
    return str(labels.get(POD_HOSTNAME) or spec.get("hostname") or meta.get("name", ""))


def pod_state(pod: Mapping[str, Any]) -> SlurmNodeState:
    """Slurm's view of the node, as Slinky mirrors it into pod conditions."""
    base, flags, reason = "UNKNOWN", set(), ""
    registered = False
    for c in (pod.get("status") or {}).get("conditions") or []:
        ctype = str(c.get("type", ""))
        if not ctype.startswith(CONDITION_PREFIX) or c.get("status") != "True":
            continue
        registered = True
        name = ctype[len(CONDITION_PREFIX):]
        if name in BASE_STATES:
            base = name.upper()
        else:
            flags.add(re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper())  # NotResponding → NOT_..
            if name == "Drain":
                reason = str(c.get("message") or "")
    reason = carried_reason(reason)
    # FUTURE and UNKNOWN (e.g. just after a slurmctld restart, before the slurmd answers) are
    # not a registered, serving node
    return SlurmNodeState(slurm_name(pod), base, frozenset(flags), reason,
                          registered=registered and "NOT_RESPONDING" not in flags
                          and base not in ("FUTURE", "UNKNOWN"))


def carried_reason(reason: str) -> str:
    """healer's reason as the operator carries it (``slurm-operator: healer: …``) → healer's."""
    if reason.startswith(OPERATOR_PREFIX + SLURM_REASON_PREFIX):
        return reason[len(OPERATOR_PREFIX):]
    return reason


def pod_ready(pod: Mapping[str, Any]) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def foreign_drain(st: SlurmNodeState) -> str:
    """The reason of a drain that is neither healer's nor the operator's ("" if none): its
    owner, not healer, decides when it ends."""
    if st.drain and st.reason and not st.reason_is_ours and \
            not st.reason.startswith(OPERATOR_PREFIX):
        return st.reason
    return ""


class OperatorCapabilities:
    """What the running slurm-operator supports, from its NodeSet CRD (read once, cached).

    ``v1.1+`` when the CRD's v1beta1 spec schema has ``scalingMode`` (added in v1.1, together
    with the copy of the Node's topology annotation to the slurmd pod). An unreadable CRD
    (403/404) is *unknown* (None), cached too; a transient error is asked again next time."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._known: bool | None = None
        self._read = False

    async def v1_1(self) -> bool | None:
        if not self._read:
            try:
                raw = to_dict(self.api, await call(
                    f"get CustomResourceDefinition {NODESET_CRD}",
                    lambda: client.ApiextensionsV1Api(self.api)
                    .read_custom_resource_definition(NODESET_CRD)))
            except TransientError:
                return None
            except HealerError as e:  # 403/404: RBAC or no CRD; unknown, asked no more
                log.warning("slurm-operator version unknown", crd=NODESET_CRD, error=str(e))
                self._known, self._read = None, True
                return None
            self._known, self._read = _has_scaling_mode(raw), True
        return self._known

    async def copies_topology(self) -> bool | None:
        """Whether the operator copies the Node's topology annotation to the slurmd pod."""
        return await self.v1_1()


def _has_scaling_mode(crd: Mapping[str, Any]) -> bool:
    for v in (crd.get("spec") or {}).get("versions") or []:
        if v.get("name") != NODESET_VERSION:
            continue
        props = (((v.get("schema") or {}).get("openAPIV3Schema") or {}).get("properties")
                 or {})
        spec = (props.get("spec") or {}).get("properties") or {}
        return "scalingMode" in spec
    return False


class NodeSets:
    """Reads NodeSets (shared by the driver and the workload)."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = api
        self.co = client.CustomObjectsApi(api)
        self.namespace = namespace

    async def spec(self, name: str) -> dict[str, Any]:
        raw = to_dict(self.api, await call(
            f"get NodeSet {self.namespace}/{name}",
            lambda: self.co.get_namespaced_custom_object(NODESET_GROUP, NODESET_VERSION,
                                                         self.namespace, NODESET_PLURAL, name)))
        return dict(raw.get("spec") or {})

    async def scaled_in(self, name: str, slurm_node: str, pods: SlinkyPods) -> str:
        """Why the pod of ``slurm_node`` will not come back ("" if it may): NodeSet ``name``
        already has as many live pods as it wants without it, i.e. it was scaled in and the
        operator removed this one on purpose (it picks cordoned pods first, drains such a pod
        and deletes it once drained, never with jobs on it)."""
        if not name:
            return ""
        replicas = (await self.spec(name)).get("replicas")
        if not isinstance(replicas, int):
            return ""
        others = [p for p in await pods.pods()
                  if ((p.get("metadata") or {}).get("labels") or {}).get(NODESET_INSTANCE) == name
                  and slurm_name(p) != slurm_node]
        if len(others) < replicas:
            return ""
        return (f"NodeSet {self.namespace}/{name} was scaled in to {replicas} replicas: the "
                f"operator removed the slurmd pod of {slurm_node} and will not recreate it, so "
                "there is no Slurm node to drain or move any more")


def update_strategy_problem(namespace: str, name: str, spec: Mapping[str, Any],
                            v1_1: bool | None) -> str:
    """Why healer must not drain through this NodeSet ("" when it may)."""
    us = spec.get("updateStrategy") or {}
    kind = str(us.get("type") or "")
    where = f"NodeSet {namespace}/{name}"
    if kind != "RollingUpdate":
        return (f"{where} has updateStrategy.type {kind or '(empty)'}: the slurm-operator "
                "undrains an uncordoned node only under RollingUpdate, so healer could never "
                "give the Slurm node back (it would stay drained for ever); set "
                "updateStrategy.type: RollingUpdate with a rollingUpdate block (e.g. "
                "maxUnavailable: 1)")
    if not us.get("rollingUpdate") and v1_1 is False:
        return (f"{where} has updateStrategy.type RollingUpdate without a rollingUpdate block: "
                "slurm-operator <v1.1 panics on every reconcile of it, so nothing would drain; "
                "add updateStrategy.rollingUpdate (e.g. maxUnavailable: 1)")
    return ""


class SlinkyPods:
    """Finding slurmd pods by Slurm node name or by Kubernetes node."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.namespace = namespace

    async def pods(self) -> list[dict[str, Any]]:
        raw = to_dict(self.api, await call(
            f"list slurmd pods in {self.namespace}", lambda: self.core.list_namespaced_pod(
                self.namespace, label_selector=SLURMD_SELECTOR)))
        return [p for p in raw.get("items") or []
                if not (p.get("metadata") or {}).get("deletionTimestamp")]

    async def by_slurm_name(self, name: str) -> dict[str, Any]:
        for p in await self.pods():
            if slurm_name(p) == name:
                return p
        raise NotFoundError(f"no slurmd pod for Slurm node {name} in {self.namespace}")

    async def on_node(self, node: str) -> dict[str, Any] | None:
        for p in await self.pods():
            if (p.get("spec") or {}).get("nodeName") == node:
                return p
        return None

    async def slurm_name_on(self, node: str) -> str:
        p = await self.on_node(node)
        if p is None:
            raise NotFoundError(f"no slurmd pod runs on node {node}")
        return slurm_name(p)

    async def hosts(self) -> dict[str, str]:
        """Slurm node name → the Node its (live, scheduled) slurmd pod runs on."""
        return {slurm_name(p): str(p["spec"]["nodeName"]) for p in await self.pods()
                if (p.get("spec") or {}).get("nodeName")}


class SlinkyDriver:
    """SlurmDriver on Slinky. Job listing and signals need Slurm's own API: give ``jobs`` a
    slurmrestd (or scontrol) driver; without one, checkpoint signals are unavailable."""

    def __init__(self, api: client.ApiClient, nodes: KubeNodes, *, namespace: str,
                 jobs: SlurmDriver | None = None, nodeset: str = "",
                 capabilities: OperatorCapabilities | None = None) -> None:
        self.pods = SlinkyPods(api, namespace)
        self.nodes = nodes
        self.jobs = jobs
        self.nodesets = NodeSets(api, namespace)
        self.nodeset = nodeset
        self.capabilities = capabilities or OperatorCapabilities(api)

    async def _check_update_strategy(self, pod: Mapping[str, Any]) -> None:
        """Refuse (PermanentError) a NodeSet whose update strategy makes the operator never
        undrain, or (v1.0) never drain: before healer changes anything."""
        labels = (pod.get("metadata") or {}).get("labels") or {}
        name = str(labels.get(NODESET_INSTANCE) or self.nodeset)
        if not name:
            return  # no NodeSet known: nothing to check against
        spec = await self.nodesets.spec(name)
        problem = update_strategy_problem(self.nodesets.namespace, name, spec,
                                          await self.capabilities.v1_1())
        if problem:
            raise PermanentError(problem)

    async def state(self, node: str) -> SlurmNodeState:
        try:
            mirrored = pod_state(await self.pods.by_slurm_name(node))
        except NotFoundError as e:
            why = await self.nodesets.scaled_in(self.nodeset, node, self.pods)
            if why:
                raise NotFoundError(why) from e
            raise
        if self.jobs is None:
            return mirrored
        # The operator mirrors Slurm into the pod's conditions only when it re-lists Slurm
        # (every 30 s): a job that ended 1 s ago still shows Allocated there. With Slurm's own
        # API at hand, its answer is the fresh one; the mirror stays the fallback.
        try:
            fresh = await self.jobs.state(node)
        except (TransientError, NotFoundError):
            return mirrored
        return replace(fresh, reason=carried_reason(fresh.reason))

    async def drain(self, node: str, reason: str, incident: str = "") -> bool:
        """Drain through the operator: healer's cordon reason on the Node first, then the
        cordon (its provenance names ``incident``; without one, the reason stands in)."""
        pod = await self.pods.by_slurm_name(node)
        st = pod_state(pod)
        host = str((pod.get("spec") or {}).get("nodeName") or "")
        if not host:
            raise TransientError(f"slurmd pod of {node} is not scheduled")
        await self._check_update_strategy(pod)
        if foreign_drain(st):
            # someone drained it with their own reason: theirs to clear (the flow goes on to
            # cordon and claim; move holds while that drain is there)
            return False
        k8s = await self.nodes.get(host)
        if k8s.unschedulable and k8s.annotations.get(CORDONED_BY) != CORDONED_BY_HEALER:
            return False  # someone else's cordon: the operator drains with their reason
        current = k8s.annotations.get(CORDON_REASON)
        if current is None or current.startswith(SLURM_REASON_PREFIX):
            if current != reason:
                await self.nodes.patch_metadata(host, annotations={CORDON_REASON: reason})
        elif not k8s.unschedulable:
            return False  # an admin's cordon reason is waiting there: do not replace it
        # the operator drains on cordon; False: someone cordoned it in between (theirs)
        return await self.nodes.cordon(host, incident or reason, reason)

    async def undrain(self, node: str, incident: str = "") -> bool:
        pod = await self.pods.by_slurm_name(node)
        host = str((pod.get("spec") or {}).get("nodeName") or "")
        if host:
            k8s = await self.nodes.get(host)
            mine = k8s.annotations.get(CORDON_REASON, "")
            if mine.startswith(SLURM_REASON_PREFIX) and (not incident or incident in mine):
                await self.nodes.patch_metadata(host, annotations={CORDON_REASON: None})
            if incident:
                await self.nodes.uncordon(host, incident)
        st = pod_state(await self.pods.by_slurm_name(node))
        return not st.drain  # the operator undrains on its next reconcile; the caller polls

    async def node_states(self) -> dict[str, SlurmNodeState]:
        """Every slurmd pod's Slurm state, by the Node it runs on (the guardrails' feed): from
        Slurm's own API when there is one (one listing), else as the operator mirrors it into
        the pods' conditions (up to its 30 s re-list late)."""
        pods = [p for p in await self.pods.pods() if (p.get("spec") or {}).get("nodeName")]
        fresh: dict[str, SlurmNodeState] = {}
        lister = getattr(self.jobs, "nodes", None)
        if lister is not None:
            fresh = {s.name: s for s in await lister()}
        out: dict[str, SlurmNodeState] = {}
        for p in pods:
            host, name = str(p["spec"]["nodeName"]), slurm_name(p)
            st = fresh.get(name)
            out[host] = replace(st, reason=carried_reason(st.reason)) if st is not None \
                else pod_state(p)
        return out

    def _need_jobs(self) -> SlurmDriver:
        if self.jobs is None:
            raise PermanentError("the slinky driver needs a Slurm job backend (slurmrestd) to "
                                 "list, signal or requeue jobs; set --slurmrestd-url")
        return self.jobs

    async def jobs_on(self, node: str) -> list[SlurmJob]:
        if self.jobs is None:
            st = await self.state(node)
            if st.busy:
                self._need_jobs()
            return []
        return await self.jobs.jobs_on(node)

    async def signal_jobs(self, node: str, signal: str, *, batch_only: bool = False) -> list[int]:
        return await self._need_jobs().signal_jobs(node, signal, batch_only=batch_only)

    async def requeue_jobs(self, node: str) -> list[int]:
        return await self._need_jobs().requeue_jobs(node)


class SlinkyWorkload:
    """Workload port: move a Slurm node's slurmd to a claimed spare (see the module doc)."""

    def __init__(self, api: client.ApiClient, nodes: KubeNodes, slurm: SlurmDriver, *,
                 namespace: str, nodeset: str = "") -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.nodesets = NodeSets(api, namespace)
        self.pods = SlinkyPods(api, namespace)
        self.nodes = nodes
        self.slurm = slurm
        self.namespace = namespace
        self.nodeset = nodeset
        self._held: set[tuple[str, str]] = set()  # (incident, reason) holds already logged
        #: one lock per NodeSet for check + open + evict (one SlinkyWorkload per process)
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def nodeset_spec(self) -> dict[str, Any]:
        if not self.nodeset:
            raise PermanentError("the NodeSet to remediate is not configured (--nodeset)")
        return await self.nodesets.spec(self.nodeset)

    def _lock(self) -> asyncio.Lock:
        return self._locks.setdefault((self.namespace, self.nodeset), asyncio.Lock())

    async def scaling_mode(self) -> str:
        return str((await self.nodeset_spec()).get("scalingMode") or "StatefulSet")

    async def host_network(self) -> bool:
        """Whether the NodeSet's pods use the host network (Slurm node name = Node name)."""
        spec = await self.nodeset_spec()
        return bool(((spec.get("template") or {}).get("spec") or {}).get("hostNetwork"))

    async def node_selector(self) -> dict[str, str]:
        """The labels a node needs to host this NodeSet's slurmd (claim labels for spares)."""
        spec = await self.nodeset_spec()
        tmpl = ((spec.get("template") or {}).get("spec") or {})
        return {str(k): str(v) for k, v in (tmpl.get("nodeSelector") or {}).items()}

    async def move(self, incident: str, slurm_node: str, source: str, spare: str) -> HookResult:
        mode = await self.scaling_mode()
        if mode == "DaemonSet":
            pod = await self.pods.on_node(spare)
            if pod is None:
                # the operator starts a pod only on a Node the pod tolerates: open the spare
                await self._open(spare, incident)
                return HookResult(StepOutcome.PENDING,
                                  f"waiting for the operator to start a slurmd pod on {spare}")
            return HookResult(StepOutcome.DONE, "", {"slurmNode": slurm_name(pod),
                                                     "mode": mode})
        if await self.host_network():
            # hostNetwork: the Slurm node is named after the Node, so the recreated pod is a
            # new Slurm node on the spare (the old record went with the pod's preStop)
            moved = await self.pods.on_node(spare)
            if moved is not None:
                await self._forget_reason(source, incident)
                return HookResult(StepOutcome.DONE, "", {"slurmNode": slurm_name(moved),
                                                         "mode": mode, "hostNetwork": "true"})
        try:
            pod = await self.pods.by_slurm_name(slurm_node)
        except NotFoundError:
            scaled_in = await self.nodesets.scaled_in(self.nodeset, slurm_node, self.pods)
            if scaled_in:
                await self._close(spare, incident)  # nothing will come: nothing may land there
                return HookResult(StepOutcome.FAILED, f"{scaled_in}; the spare was closed again")
            return HookResult(StepOutcome.PENDING, f"slurmd pod of {slurm_node} is being "
                                                   "recreated")
        host = (pod.get("spec") or {}).get("nodeName")
        if host == spare:
            await self._forget_reason(source, incident)
            return HookResult(StepOutcome.DONE, "", {"mode": mode})
        if not host:
            # recreated and unscheduled (our eviction, or the operator's rolling update took
            # it off the cordoned node): it waits for a Node that fits, which is our spare once
            # open, one open spare per NodeSet at a time (see _open_elsewhere)
            async with self._lock():
                other = await self._open_elsewhere(incident, spare)
                if other:
                    return HookResult(StepOutcome.PENDING, other)
                await self._open(spare, incident)
            return HookResult(StepOutcome.PENDING, f"slurmd pod of {slurm_node} is not "
                                                   f"scheduled yet; {spare} is open for it")
        if host != source:
            # the operator recreated it elsewhere (scale-in, a rolling update, someone deleted
            # it): our spare gets nothing, so it is closed again (it must not catch the next
            # pod of this NodeSet) and a human decides
            await self._close(spare, incident)
            return HookResult(StepOutcome.FAILED,
                              f"slurmd pod of {slurm_node} runs on {host}, neither on {source} "
                              f"nor on the spare {spare}: the slurm-operator recreated it "
                              "elsewhere (NodeSet scaled in, a rolling update, or the pod was "
                              "deleted); the spare was closed again")
        st = await self.slurm.state(slurm_node)  # fresh (see SlinkyDriver.state)
        theirs = foreign_drain(st)
        if theirs:
            return self._hold(incident, slurm_node, theirs)
        if st.busy or not st.drain:
            return HookResult(StepOutcome.PENDING, f"Slurm reports {slurm_node} "
                                                   f"{'busy' if st.busy else 'not drained'}: "
                                                   "its slurmd pod stays where it is")
        async with self._lock():
            other = await self._open_elsewhere(incident, spare)
            if other:
                return HookResult(StepOutcome.PENDING, other)
            await self._open(spare, incident)
            meta = pod["metadata"]
            outcome = await evict(self.api, self.namespace, meta["name"], meta.get("uid"))
            if outcome == Evicted.BLOCKED:
                await self._close(spare, incident)  # nothing may land there meanwhile
                return HookResult(StepOutcome.PENDING, "a PodDisruptionBudget blocks the "
                                                       "eviction for now")
        return HookResult(StepOutcome.PENDING, f"evicted {meta['name']}; waiting for it on "
                                               f"{spare}")

    def _hold(self, incident: str, slurm_node: str, reason: str) -> HookResult:
        """A drain someone else owns: evicting would run the pod's preStop, which deletes the
        Slurm node record and so their drain (docs/adr/0006). Hold until they clear it."""
        if (incident, reason) not in self._held:
            self._held.add((incident, reason))
            log.warning("holding the swap: Slurm node drained by someone else",
                        incident=incident, slurm_node=slurm_node, reason=reason)
        return HookResult(StepOutcome.PENDING,
                          f"Slurm node {slurm_node} is drained by someone else (reason "
                          f"{reason!r}); moving its slurmd pod would delete that drain, so "
                          "healer holds until the owner clears it")

    async def _open_elsewhere(self, incident: str, spare: str) -> str:
        """Another incident's claimed spare that is open and does not host its slurmd pod yet,
        among those this NodeSet's pods could land on ("" if none): read from the cluster,
        so it holds after a leader restart too."""
        selector = await self.node_selector()
        items, _ = await self.nodes.list_raw(CLAIM_LABEL)
        hosts: set[str] | None = None
        for raw in items:
            meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
            name = str(meta.get("name", ""))
            owner = str((meta.get("annotations") or {}).get(CLAIMED_BY) or "")
            labels = meta.get("labels") or {}
            if name == spare or owner == incident or not owner:
                continue
            if any(t.get("key") == SPARE_TAINT for t in spec.get("taints") or []):
                continue  # closed
            if any(labels.get(k) != v for k, v in selector.items()):
                continue  # our pods cannot land there
            if hosts is None:
                hosts = {str((p.get("spec") or {}).get("nodeName") or "")
                         for p in await self.pods.pods()
                         if ((p.get("metadata") or {}).get("labels") or {})
                         .get(NODESET_INSTANCE, self.nodeset) == self.nodeset}
            if name not in hosts:
                return (f"another swap is in flight in NodeSet {self.namespace}/{self.nodeset}: "
                        f"spare {name} (incident {owner}) is open and waits for its slurmd pod; "
                        f"{spare} stays closed until then, so the recreated pods cannot swap "
                        "spares")
        return ""

    async def _open(self, spare: str, incident: str) -> None:
        """Take the spare taint off this incident's claimed spare (idempotent)."""
        raw = await self.nodes.get_raw(spare)
        meta, spec = raw["metadata"], raw.get("spec") or {}
        if (meta.get("annotations") or {}).get(CLAIMED_BY) != incident:
            raise PermanentError(f"spare {spare} is not claimed by {incident}")
        taints = spec.get("taints") or []
        if not any(t.get("key") == SPARE_TAINT for t in taints):
            return
        kept = [t for t in taints if t.get("key") != SPARE_TAINT]
        await self.nodes._patch(spare, {"metadata": {"resourceVersion": meta["resourceVersion"]},
                                        "spec": {"taints": kept or None}})

    async def _close(self, spare: str, incident: str) -> None:
        raw = await self.nodes.get_raw(spare)
        meta, spec = raw["metadata"], raw.get("spec") or {}
        taints = list(spec.get("taints") or [])
        if (meta.get("annotations") or {}).get(CLAIMED_BY) != incident or \
                any(t.get("key") == SPARE_TAINT for t in taints):
            return
        taints.append({"key": SPARE_TAINT, "value": TAINT_VALUE, "effect": TAINT_EFFECT})
        await self.nodes._patch(spare, {"metadata": {"resourceVersion": meta["resourceVersion"]},
                                        "spec": {"taints": taints}})

    async def _forget_reason(self, source: str, incident: str) -> None:
        """The slurmd left ``source``: take healer's cordon reason off it (it stays cordoned
        for repair), so a later cordon of the repaired node cannot carry a stale reason."""
        k8s = await self.nodes.get(source)
        mine = k8s.annotations.get(CORDON_REASON, "")
        if mine.startswith(SLURM_REASON_PREFIX) and incident in mine:
            await self.nodes.patch_metadata(source, annotations={CORDON_REASON: None})

    async def replacement_ready(self, incident: str, slurm_node: str, spare: str) -> HookResult:
        try:
            pod = await self.pods.by_slurm_name(slurm_node)
        except NotFoundError:
            return HookResult(StepOutcome.PENDING, f"no slurmd pod for {slurm_node} yet")
        if (pod.get("spec") or {}).get("nodeName") != spare:
            return HookResult(StepOutcome.PENDING, f"{slurm_node} not on {spare} yet")
        st = pod_state(pod)
        if not pod_ready(pod) or not st.registered or st.down:
            return HookResult(StepOutcome.PENDING, f"{slurm_node} on {spare} not Ready, not "
                                                   "registered or still DOWN in Slurm")
        return HookResult(StepOutcome.DONE, "", {"slurmNode": slurm_node})
