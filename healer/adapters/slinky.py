"""The Slinky slurm-operator driver (the SlurmDriver port) and its reading of slurmd pods and
NodeSets, through Kubernetes only.

Slinky turns a cordoned Node into a drained Slurm node (reason ``slurm-operator: <the Node's
nodeset.slinky.slurm.net/node-cordon-reason>``) and an uncordon into an undrain, but only for
reasons it owns. So healer's drain is: write the cordon-reason annotation *first*, then cordon
(the operator keeps an existing reason, so the order matters); the Slurm state is read from
the slurmd pod's ``SlurmNodeState*`` conditions; undrain is: remove healer's annotation and
uncordon, and the operator undrains. healer never touches a reason it did not set.

The warm-spare workload move (the Workload port) is :mod:`healer.adapters.slinky_workload`.

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

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import structlog
from kubernetes_asyncio import client

from healer.adapters.kube.client import call, to_dict
from healer.adapters.kube.nodes import KubeNodes
from healer.core.vocabulary import (
    CORDONED_BY,
    CORDONED_BY_HEALER,
    SLURM_REASON_PREFIX,
)
from healer.errors import HealerError, NotFoundError, PermanentError, TransientError
from healer.ports import (
    SlurmDriver,
    SlurmHandles,
    SlurmJob,
    SlurmNodeState,
    Undrain,
)

NODESET_GROUP, NODESET_VERSION, NODESET_PLURAL = "slinky.slurm.net", "v1beta1", "nodesets"
SLURMD_SELECTOR = "app.kubernetes.io/name=slurmd"
CORDON_REASON = "nodeset.slinky.slurm.net/node-cordon-reason"
POD_HOSTNAME = "nodeset.slinky.slurm.net/pod-hostname"
SCALING_MODE_LABEL = "nodeset.slinky.slurm.net/scaling-mode"
OPERATOR_PREFIX = "slurm-operator: "
CONDITION_PREFIX = "SlurmNodeState"
BASE_STATES = ("Allocated", "Down", "Error", "Future", "Idle", "Mixed", "Unknown")
#: The conditions whose message (the Slurm node's reason) healer reads: a drain's and a DOWN's.
REASON_STATES = ("Drain", "Down")
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
    """Slurm's view of the node, as Slinky mirrors it into pod conditions.

    The operator (v1.0, v1.1) writes one condition per base state and per flag, each with the
    Slurm node's reason as its message. The reason is read where it means something: on a
    drain, and on a DOWN (an admin's ``state=down reason=…`` is theirs, docs/adr/0016)."""
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
        if name in REASON_STATES:
            reason = reason or str(c.get("message") or "")
    reason = carried_reason(reason)
    # FUTURE and UNKNOWN (e.g. just after a slurmctld restart, before the slurmd answers) are
    # not a registered, serving node
    return SlurmNodeState(slurm_name(pod), base, frozenset(flags), reason,
                          registered=registered and "NOT_RESPONDING" not in flags
                          and base not in ("FUTURE", "UNKNOWN"))


def moved_state(name: str) -> SlurmNodeState:
    """Slurm node ``name`` as the Node its slurmd pod left sees it (the pod deleted, waiting
    for a Node, or on another one): DOWN, not registered, no job, and no reason (nobody set
    it, so it holds nothing)."""
    return SlurmNodeState(name, "DOWN", frozenset(), "", registered=False)


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


#: The reason slurmctld itself gives a node whose slurmd stopped answering (22.05 and later).
NOT_RESPONDING_REASON = "Not responding"
#: The reason of the slurm-operator's preStop hook (v1.0 and v1.1 write it without a prefix).
PRESTOP_REASON = "Pod is terminating"


def foreign_reason(st: SlurmNodeState) -> str:
    """The reason of a drain or a DOWN someone else set ("" if none): neither healer's, nor
    the operator's (its prefix, its preStop), nor Slurm's own ``Not responding`` of a silent
    slurmd. Moving the slurmd would lose it (docs/adr/0006, docs/adr/0016)."""
    if not (st.drain or st.down) or not st.reason or st.reason_is_ours:
        return ""
    if st.reason.startswith((OPERATOR_PREFIX, PRESTOP_REASON)):
        return ""
    if not st.drain and st.reason.startswith(NOT_RESPONDING_REASON):
        return ""
    return st.reason


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

    async def scaled_in(self, name: str, slurm_node: str, pods: SlinkyPods,
                        spare: str = "") -> str:
        """Why the pod of ``slurm_node`` will not come back ("" if it may): NodeSet ``name``
        already has as many live pods as it wants without it, i.e. it was scaled in and the
        operator removed this one on purpose (it picks cordoned pods first, drains such a pod
        and deletes it once drained, never with jobs on it)."""
        if not name:
            return ""
        replicas = (await self.spec(name)).get("replicas")
        if not isinstance(replicas, int):
            return ""
        mine = [p for p in await pods.pods()
                if ((p.get("metadata") or {}).get("labels") or {}).get(NODESET_INSTANCE) == name]
        if any(not slurm_name(p) or (spare and (p.get("spec") or {}).get("nodeName") == spare)
               for p in mine):
            # a hostNetwork pod not scheduled yet has no Slurm name, and one just bound to the
            # spare is named after it: either may be the very pod the operator recreated for
            # this one (the next look finds it on the spare)
            return ""
        others = [p for p in mine if slurm_name(p) != slurm_node]
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

    async def pods(self, *, terminating: bool = False, host: str = "") -> list[dict[str, Any]]:
        """The slurmd pods (with ``terminating``, those being deleted too); with ``host``,
        only those on that Node (the API server filters: one Node's pods, not the fleet's)."""
        def read() -> Any:
            if host:
                return self.core.list_namespaced_pod(
                    self.namespace, label_selector=SLURMD_SELECTOR,
                    field_selector=f"spec.nodeName={host}")
            return self.core.list_namespaced_pod(self.namespace, label_selector=SLURMD_SELECTOR)

        where = f" on {host}" if host else ""
        raw = to_dict(self.api, await call(f"list slurmd pods in {self.namespace}{where}", read))
        return [p for p in raw.get("items") or []
                if terminating or not (p.get("metadata") or {}).get("deletionTimestamp")]

    async def of(self, name: str, host: str = "") -> dict[str, Any]:
        """The slurmd pod of Slurm node ``name``: read among ``host``'s pods when the caller
        knows where it runs, else (or if it is not there) among every slurmd pod."""
        if host:
            for p in await self.pods(host=host):
                if slurm_name(p) == name:
                    return p
        return await self.by_slurm_name(name)

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
        """The Slurm node name of the slurmd pod on ``node`` (one being deleted names it too:
        on a dead node the pod is Terminating until Kubernetes removes it)."""
        live = [p for p in await self.pods(terminating=True, host=node)
                if (p.get("spec") or {}).get("nodeName") == node]
        live.sort(key=lambda p: bool((p.get("metadata") or {}).get("deletionTimestamp")))
        if not live:
            raise NotFoundError(f"no slurmd pod runs on node {node}")
        return slurm_name(live[0])

    async def hosted(self) -> list[dict[str, Any]]:
        """The scheduled slurmd pods that stand for their Slurm node: every live one, and a
        terminating one whose Slurm name no live pod has (on a dead node, a pod stays
        Terminating until Kubernetes removes it: its Slurm node is still that Node's)."""
        pods = [p for p in await self.pods(terminating=True)
                if (p.get("spec") or {}).get("nodeName")]
        live = {slurm_name(p) for p in pods
                if not (p.get("metadata") or {}).get("deletionTimestamp")}
        return [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")
                or slurm_name(p) not in live]

    async def hosts(self) -> dict[str, str]:
        """Slurm node name → the Node its slurmd pod runs on (:meth:`hosted`)."""
        return {slurm_name(p): str(p["spec"]["nodeName"]) for p in await self.hosted()}


class SlinkyDriver:
    """SlurmDriver on Slinky. Job listing and signals need Slurm's own API: give ``jobs`` a
    slurmrestd (or scontrol) driver's handles; without one, checkpoint signals are
    unavailable, and what the backend's handles lack (a hold, a record's deletion, the job
    history) this driver cannot do either."""

    def __init__(self, api: client.ApiClient, nodes: KubeNodes, *, namespace: str,
                 jobs: SlurmHandles | None = None, nodeset: str = "",
                 capabilities: OperatorCapabilities | None = None) -> None:
        self.pods = SlinkyPods(api, namespace)
        self.nodes = nodes
        self.backend = jobs
        self.jobs: SlurmDriver | None = jobs.driver if jobs is not None else None
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

    async def state(self, node: str, *, host: str = "") -> SlurmNodeState:
        """Slurm's view of ``node``; with ``host``, as that Kubernetes node sees it: once the
        operator has taken the slurmd pod off ``host`` (a rolling update recreates it once
        its jobs ended, unscheduled or on another Node), nothing runs on ``host`` any more."""
        return await self._state(node, host, seen_from=host)

    async def _state(self, node: str, host: str = "", *, seen_from: str = "") -> SlurmNodeState:
        try:
            pod = await self.pods.of(node, host)
        except NotFoundError as e:
            # seen from a Node: a pod being deleted (a rolling update once its jobs ended) is
            # still the Slurm node there until it is gone
            gone = [p for p in await self.pods.pods(terminating=True, host=seen_from)
                    if slurm_name(p) == node] if seen_from else []
            if not gone:
                why = await self.nodesets.scaled_in(self.nodeset, node, self.pods)
                if why:
                    raise NotFoundError(why) from e
                if not seen_from:
                    raise
                # deleted, not recreated yet: nothing runs on seen_from any more
                return moved_state(node)
            pod = gone[0]
        if seen_from and str((pod.get("spec") or {}).get("nodeName") or "") != seen_from:
            return moved_state(slurm_name(pod))
        return await self._fresh(node, pod_state(pod))

    async def _fresh(self, node: str, mirrored: SlurmNodeState) -> SlurmNodeState:
        """Slurm's own answer when there is a job backend, else the pod's mirror."""
        if self.jobs is None:
            return mirrored
        # The operator mirrors Slurm into the pod's conditions only when it re-lists Slurm
        # (every 30 s): a job that ended 1 s ago still shows Allocated there, a drain set 1 s
        # ago is not there yet. With Slurm's own API at hand, its answer is the fresh one; the
        # mirror stays the fallback.
        try:
            fresh = await self.jobs.state(node)
        except (TransientError, NotFoundError):
            return mirrored
        return replace(fresh, reason=carried_reason(fresh.reason))

    async def drain(self, node: str, reason: str, incident: str = "", *,
                    host: str = "") -> bool:
        """Drain through the operator: healer's cordon reason on the Node first, then the
        cordon (its provenance names ``incident``; without one, the reason stands in)."""
        pod = await self.pods.of(node, host)
        host = str((pod.get("spec") or {}).get("nodeName") or "")
        if not host:
            raise TransientError(f"slurmd pod of {node} is not scheduled")
        await self._check_update_strategy(pod)
        # fresh: a drain the Slurm feed just saw (a Slurm-detected incident) may not be in
        # the pod's conditions yet, and cordoning over it would claim someone else's drain
        st = await self._fresh(node, pod_state(pod))
        if foreign_drain(st) or foreign_reason(st):
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

    async def undrain(self, node: str, incident: str = "", *,
                      host: str = "") -> Undrain:
        """Take healer's cordon reason and cordon off the slurmd pod's Node; the operator
        undrains on its next reconcile, so this says SETTLING until Slurm (read fresh, see
        :meth:`state`) shows no drain of healer's for ``incident``."""
        pod = await self.pods.of(node, host)
        host = str((pod.get("spec") or {}).get("nodeName") or "")
        if host:
            k8s = await self.nodes.get(host)
            mine = k8s.annotations.get(CORDON_REASON, "")
            if mine.startswith(SLURM_REASON_PREFIX) and (not incident or incident in mine):
                await self.nodes.patch_metadata(host, annotations={CORDON_REASON: None})
            if incident:
                await self.nodes.uncordon(host, incident)
        st = await self._state(node, host)
        if st.drained_by_healer(incident):
            return Undrain.SETTLING
        # someone else's drain, or their DOWN (no DRAIN flag): theirs, left as it is
        if st.drain or foreign_reason(st):
            return Undrain.NOT_OURS
        return Undrain.CLEARED

    async def node_states(self) -> dict[str, SlurmNodeState]:
        """Every slurmd pod's Slurm state, by the Node it runs on (the guardrails' feed; a dead
        node's Terminating pod too, :meth:`SlinkyPods.hosted`): from Slurm's own API when
        there is one (one listing), else as the operator mirrors it into the pods'
        conditions (up to its 30 s re-list late)."""
        pods = await self.pods.hosted()
        fresh: dict[str, SlurmNodeState] = {}
        if self.backend is not None and self.backend.lister is not None:
            fresh = {s.name: s for s in await self.backend.lister.nodes()}
        out: dict[str, SlurmNodeState] = {}
        for p in pods:
            host, name = str(p["spec"]["nodeName"]), slurm_name(p)
            st = fresh.get(name)
            out[host] = replace(st, reason=carried_reason(st.reason)) if st is not None \
                else pod_state(p)
        return out

    async def close(self) -> None:
        """Close the job backend's HTTP sessions (a slurmrestd driver has some; scontrol none)."""
        if self.jobs is not None:
            await self.jobs.close()

    def _need_backend(self) -> SlurmHandles:
        if self.backend is None:
            raise PermanentError("the slinky driver needs a Slurm job backend (slurmrestd) to "
                                 "list, signal or requeue jobs; set --slurmrestd-url")
        return self.backend

    def _need_jobs(self) -> SlurmDriver:
        return self._need_backend().driver

    async def jobs_on(self, node: str) -> list[SlurmJob]:
        if self.jobs is None:
            st = await self.state(node)
            if st.busy:
                self._need_jobs()
            return []
        return await self.jobs.jobs_on(node)

    async def signal_jobs(self, node: str, signal: str, *, batch_only: bool = False) -> list[int]:
        return await self._need_jobs().signal_jobs(node, signal, batch_only=batch_only)

    async def hold(self, node: str, reason: str) -> None:
        """Drain ``node`` with someone else's reason through the job backend (the operator
        would prefix a reason set through a cordon: it would become the operator's)."""
        hold = self._need_backend().hold
        if hold is None:
            raise PermanentError("carrying a reason over needs a job backend that sets Slurm "
                                 "reasons (scontrol or slurmrestd)")
        await hold.hold(node, reason)

    async def delete_node(self, node: str) -> bool:
        """Delete ``node``'s Slurm record through the job backend (the operator has no such
        call: the pod's preStop does it)."""
        records = self._need_backend().records
        if records is None:
            raise PermanentError("deleting a Slurm node record needs a job backend that can "
                                 "(scontrol or slurmrestd)")
        return await records.delete_node(node)

    async def recent_jobs_on(self, node: str) -> list[SlurmJob]:
        """The job backend's recent jobs of ``node`` (ended ones too, where it can list them)."""
        backend = self._need_backend()
        history, jobs = backend.history, backend.driver
        if history is not None:
            return await history.recent_jobs_on(node)
        return await jobs.jobs_on(node)

    async def requeue_jobs(self, node: str) -> list[int]:
        return await self._need_jobs().requeue_jobs(node)
