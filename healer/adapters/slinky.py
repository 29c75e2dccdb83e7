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
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from healer.adapters.kube.client import call, to_dict
from healer.adapters.kube.nodes import CORDONED_BY, HEALER, KubeNodes
from healer.adapters.kube.pods import Evicted, evict
from healer.errors import NotFoundError, PermanentError, TransientError
from healer.ports import (
    SLURM_REASON_PREFIX,
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
OPERATOR_PREFIX = "slurm-operator: "
CONDITION_PREFIX = "SlurmNodeState"
BASE_STATES = ("Allocated", "Down", "Error", "Future", "Idle", "Mixed", "Unknown")
INCIDENT_IN_REASON = re.compile(r"\[([^\]\s]+)\]\s*$")


def slurm_name(pod: Mapping[str, Any]) -> str:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    labels = meta.get("labels") or {}
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
    if reason.startswith(OPERATOR_PREFIX + SLURM_REASON_PREFIX):
        reason = reason[len(OPERATOR_PREFIX):]  # healer's reason, carried by the operator
    # FUTURE and UNKNOWN (e.g. just after a slurmctld restart, before the slurmd answers) are
    # not a registered, serving node
    return SlurmNodeState(slurm_name(pod), base, frozenset(flags), reason,
                          registered=registered and "NOT_RESPONDING" not in flags
                          and base not in ("FUTURE", "UNKNOWN"))


def pod_ready(pod: Mapping[str, Any]) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


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


class SlinkyDriver:
    """SlurmDriver on Slinky. Job listing and signals need Slurm's own API: give ``jobs`` a
    slurmrestd (or scontrol) driver; without one, checkpoint signals are unavailable."""

    def __init__(self, api: client.ApiClient, *, namespace: str, nodes: KubeNodes | None = None,
                 jobs: SlurmDriver | None = None) -> None:
        self.pods = SlinkyPods(api, namespace)
        self.nodes = nodes or KubeNodes(api)
        self.jobs = jobs

    async def state(self, node: str) -> SlurmNodeState:
        return pod_state(await self.pods.by_slurm_name(node))

    async def drain(self, node: str, reason: str) -> bool:
        pod = await self.pods.by_slurm_name(node)
        st = pod_state(pod)
        host = str((pod.get("spec") or {}).get("nodeName") or "")
        if not host:
            raise TransientError(f"slurmd pod of {node} is not scheduled")
        if st.drain and st.reason and not st.reason_is_ours and \
                not st.reason.startswith(OPERATOR_PREFIX):
            return False  # someone drained it with their own reason: theirs to clear
        m = INCIDENT_IN_REASON.search(reason)
        incident = m.group(1) if m else reason
        k8s = await self.nodes.get(host)
        if k8s.unschedulable and k8s.annotations.get(CORDONED_BY) != HEALER:
            return False  # someone else's cordon: the operator drains with their reason
        current = k8s.annotations.get(CORDON_REASON)
        if current is None or current.startswith(SLURM_REASON_PREFIX):
            if current != reason:
                await self.nodes.patch_metadata(host, annotations={CORDON_REASON: reason})
        elif not k8s.unschedulable:
            return False  # an admin's cordon reason is waiting there: do not replace it
        # the operator drains on cordon; False: someone cordoned it in between (theirs)
        return await self.nodes.cordon(host, incident, reason)

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
        self.co = client.CustomObjectsApi(api)
        self.pods = SlinkyPods(api, namespace)
        self.nodes = nodes
        self.slurm = slurm
        self.namespace = namespace
        self.nodeset = nodeset

    async def nodeset_spec(self) -> dict[str, Any]:
        if not self.nodeset:
            raise PermanentError("the NodeSet to remediate is not configured (--nodeset)")
        raw = to_dict(self.api, await call(
            f"get NodeSet {self.namespace}/{self.nodeset}",
            lambda: self.co.get_namespaced_custom_object(NODESET_GROUP, NODESET_VERSION,
                                                         self.namespace, NODESET_PLURAL,
                                                         self.nodeset)))
        return dict(raw.get("spec") or {})

    async def scaling_mode(self) -> str:
        return str((await self.nodeset_spec()).get("scalingMode") or "StatefulSet")

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
                return HookResult(StepOutcome.PENDING,
                                  f"waiting for the operator to start a slurmd pod on {spare}")
            return HookResult(StepOutcome.DONE, "", {"slurmNode": slurm_name(pod),
                                                     "mode": mode})
        try:
            pod = await self.pods.by_slurm_name(slurm_node)
        except NotFoundError:
            return HookResult(StepOutcome.PENDING, f"slurmd pod of {slurm_node} is being "
                                                   "recreated")
        host = (pod.get("spec") or {}).get("nodeName")
        if host == spare:
            await self._forget_reason(source, incident)
            return HookResult(StepOutcome.DONE, "", {"mode": mode})
        if not host:
            return HookResult(StepOutcome.PENDING, f"slurmd pod of {slurm_node} is not "
                                                   "scheduled yet")
        if host != source:
            return HookResult(StepOutcome.FAILED, f"slurmd pod of {slurm_node} runs on {host}, "
                                                  f"neither on {source} nor on {spare}")
        st = pod_state(pod)
        if st.busy or not st.drain:
            return HookResult(StepOutcome.PENDING, f"Slurm reports {slurm_node} "
                                                   f"{'busy' if st.busy else 'not drained'}: "
                                                   "its slurmd pod stays where it is")
        meta = pod["metadata"]
        outcome = await evict(self.api, self.namespace, meta["name"], meta.get("uid"))
        if outcome == Evicted.BLOCKED:
            return HookResult(StepOutcome.PENDING, "a PodDisruptionBudget blocks the eviction "
                                                   "for now")
        return HookResult(StepOutcome.PENDING, f"evicted {meta['name']}; waiting for it on "
                                               f"{spare}")

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
