"""The warm-spare workload move on Slinky (the Workload port), through Kubernetes only.

Moving the workload to a spare depends on the NodeSet's scaling mode:

* StatefulSet: the Slurm node name is the pod's; once Slurm reports it drained and idle, the pod
  is evicted (the eviction API, so a PodDisruptionBudget's 429 is honoured) and the operator
  recreates it on the spare (the old node is cordoned, the spare carries the NodeSet's
  node-selector labels). A busy slurmd pod is never evicted or deleted: its preStop hook sets the
  Slurm node DOWN, which kills jobs.
* DaemonSet: the spare becomes a *new* Slurm node (named after it); the bad node's Slurm record
  stays drained.

What the operator does and this move relies on is listed in :mod:`healer.adapters.slinky` (no
affinity: one open claimed spare per NodeSet at a time; an eviction's preStop deletes the Slurm
node record, so a drain someone else set holds the move, docs/adr/0006).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from kubernetes_asyncio import client

from healer.adapters.kube.nodes import KubeNodes
from healer.adapters.kube.pods import Evicted, evict
from healer.adapters.slinky import (
    CORDON_REASON,
    NODESET_INSTANCE,
    NodeSets,
    SlinkyPods,
    foreign_reason,
    pod_ready,
    pod_state,
    slurm_name,
)
from healer.core.model import StepKey
from healer.core.vocabulary import (
    CLAIM_LABEL,
    CLAIMED_BY,
    OUT_OF_SERVICE_TAINT,
    SLURM_REASON_PREFIX,
    SPARE_TAINT,
    TAINT_EFFECT,
    TAINT_VALUE,
)
from healer.errors import NotFoundError, PermanentError
from healer.ports import (
    HookResult,
    SlurmDriver,
    SlurmNodeRecords,
    SlurmNodeState,
    StepOutcome,
)

log = structlog.get_logger("healer.adapters.slinky")


class SlinkyWorkload:
    """Workload port: move a Slurm node's slurmd to a claimed spare (see the module doc)."""

    def __init__(self, api: client.ApiClient, nodes: KubeNodes, slurm: SlurmDriver, *,
                 namespace: str, nodeset: str = "",
                 records: SlurmNodeRecords | None = None) -> None:
        """``records``: the Slurm driver's record deletion (its SlurmHandles), where it has
        one; without it a dead node's swap waits for an admin to delete the record."""
        self.api = api
        self.core = client.CoreV1Api(api)
        self.nodesets = NodeSets(api, namespace)
        self.pods = SlinkyPods(api, namespace)
        self.nodes = nodes
        self.slurm = slurm
        self.records = records
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

    async def move(self, incident: str, slurm_node: str, source: str, spare: str, *,
                   dead: bool = False, carry: bool = False) -> HookResult:
        mode = await self.scaling_mode()
        carried = ""
        if mode == "DaemonSet":
            pod = await self.pods.on_node(spare)
            if pod is None:
                # the operator starts a pod only on a Node the pod tolerates: open the spare
                await self._open(spare, incident)
                return HookResult(StepOutcome.PENDING,
                                  f"waiting for the operator to start a slurmd pod on {spare}")
            return HookResult(StepOutcome.DONE, "", {StepKey.SLURM_NODE: slurm_name(pod),
                                                     "mode": mode})
        if await self.host_network():
            # hostNetwork: the Slurm node is named after the Node, so the recreated pod is a
            # new Slurm node on the spare (the old record went with the pod's preStop)
            moved = await self.pods.on_node(spare)
            if moved is not None:
                await self._forget_reason(source, incident)
                return HookResult(StepOutcome.DONE, "", {StepKey.SLURM_NODE: slurm_name(moved),
                                                         "mode": mode, "hostNetwork": "true"})
        try:
            pod = await self.pods.by_slurm_name(slurm_node)
        except NotFoundError:
            scaled_in = await self.nodesets.scaled_in(self.nodeset, slurm_node, self.pods,
                                                      spare)
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
            # recreated and unscheduled (our eviction, the pod garbage collector on a dead
            # node, or the operator's rolling update took it off the cordoned node): it waits
            # for a Node that fits, which is our spare once open, one open spare per NodeSet
            # at a time (see _open_elsewhere)
            if dead:  # no preStop ran: Slurm's record of the node, with its reason, is there
                try:
                    st: SlurmNodeState | None = await self.slurm.state(slurm_node)
                except NotFoundError:
                    st = None  # its record is deleted already
                if st is not None:
                    theirs = foreign_reason(st)
                    if theirs and not carry:
                        return self._hold(incident, slurm_node, theirs)
                    carried = theirs
                    stale = await self._delete_dead_record(slurm_node, st)
                    if stale is not None:
                        return stale
            async with self._lock():
                other = await self._open_elsewhere(incident, spare)
                if other:
                    return HookResult(StepOutcome.PENDING, other)
                await self._open(spare, incident)
            return HookResult(StepOutcome.PENDING, f"slurmd pod of {slurm_node} is not "
                                                   f"scheduled yet; {spare} is open for it",
                              {StepKey.CARRIED: carried} if carried else {})
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
        if dead:
            return self._dead_pod(pod, source)
        st = await self.slurm.state(slurm_node)  # fresh (see SlinkyDriver.state)
        theirs = foreign_reason(st)
        if theirs and not carry:
            return self._hold(incident, slurm_node, theirs)
        # carried over: said before the eviction's preStop deletes it (the record keeps it)
        carried = theirs
        if st.busy or not (st.drain or st.down):  # DOWN with no job counts as drained
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
                                               f"{spare}",
                          {StepKey.CARRIED: carried} if carried else {})

    def _hold(self, incident: str, slurm_node: str, reason: str) -> HookResult:
        """A drain or DOWN someone else owns: evicting would run the pod's preStop, which
        deletes the Slurm node record and so their reason (docs/adr/0006); a recreated pod
        registering again clears their DOWN (docs/adr/0016). Hold until they clear it."""
        if (incident, reason) not in self._held:
            self._held.add((incident, reason))
            log.warning("holding the swap: Slurm node drained or down by someone else",
                        incident=incident, slurm_node=slurm_node, reason=reason)
        return HookResult(StepOutcome.PENDING,
                          f"Slurm node {slurm_node} is drained or down by someone else (reason "
                          f"{reason!r}); moving its slurmd would lose that, so healer holds "
                          "until the owner clears it", {StepKey.HELD: "foreign-drain"})

    async def _delete_dead_record(self, slurm_node: str,
                                  st: SlurmNodeState) -> HookResult | None:
        """Do the Slurm half of the dead pod's preStop, which never ran: delete the Slurm
        node's record before the recreated pod can register under the same name. A dynamic
        slurmd (``slurmd -Z``) registering again keeps the old record's address, the dead
        pod's IP: slurmctld would mark the replacement not responding (docs/adr/0016).
        Only once Slurm lists no job there (it requeues or fails them when it sets the node
        DOWN) and no slurmd answers for it. None: deleted, or there was none."""
        if st.busy:
            return HookResult(StepOutcome.PENDING,
                              f"Slurm still lists jobs on {slurm_node} (it has not yet set the "
                              "dead node DOWN, SlurmdTimeout): its record is deleted, and the "
                              "spare opened, once they are gone")
        if st.registered and not st.down:
            return HookResult(StepOutcome.PENDING,
                              f"Slurm still hears a slurmd for {slurm_node}: its record is "
                              "deleted, and the spare opened, once it does not")
        if self.records is None:
            return self._keep_record(slurm_node, "the Slurm driver cannot delete node records")
        try:
            await self.records.delete_node(slurm_node)
        except PermanentError as e:  # no job backend, or Slurm refuses (a reservation)
            return self._keep_record(slurm_node, str(e))
        return None

    @staticmethod
    def _keep_record(slurm_node: str, why: str) -> HookResult:
        return HookResult(StepOutcome.PENDING,
                          f"the dead pod's preStop never ran, so Slurm's record of {slurm_node} "
                          "keeps its address and the replacement would not be reached; healer "
                          f"cannot delete it ({why}): run `scontrol delete "
                          f"nodename={slurm_node}` to let the swap go on",
                          {StepKey.HELD: "slurm-record"})

    @staticmethod
    def _dead_pod(pod: dict[str, Any], source: str) -> HookResult:
        """The slurmd pod is still on the dead node: healer evicts nothing from a dead node
        (nobody is there to run the preStop); the out-of-service taint makes Kubernetes remove
        it (taint eviction, then the pod garbage collector), unless it tolerates that taint."""
        name = pod["metadata"]["name"]
        tolerated = any(
            (t.get("operator") == "Exists" and not t.get("key"))
            or t.get("key") == OUT_OF_SERVICE_TAINT
            for t in (pod.get("spec") or {}).get("tolerations") or [])
        if tolerated:
            return HookResult(StepOutcome.PENDING,
                              f"slurmd pod {name} on dead node {source} tolerates "
                              f"{OUT_OF_SERVICE_TAINT}: Kubernetes will not remove it, and "
                              "healer evicts nothing from a dead node; delete the pod (with its "
                              "grace period) to let the swap go on", {StepKey.HELD: "tolerates"})
        return HookResult(StepOutcome.PENDING,
                          f"slurmd pod {name} on dead node {source}: waiting for "
                          "kube-controller-manager to remove it (out-of-service taint)")

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
        return HookResult(StepOutcome.DONE, "", {StepKey.SLURM_NODE: slurm_node})
