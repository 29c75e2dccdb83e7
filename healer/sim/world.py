"""A simulated GPU fleet: Kubernetes nodes, Slurm nodes and jobs, warm spares. In memory.

The simulator answers the state machine's actions the way the real adapters would (a drain is
accepted at once and completes when the node's jobs end; a busy slurmd is never moved; a spare
is claimed topology-first), with configurable latencies, so ``healer simulate``, ``healer
backtest`` and the property tests run the real engine against a believable world. It is not a
test double of any adapter: it has no Kubernetes or Slurm API at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from healer.core import actions as a
from healer.core.machine import SlurmObservation, StepResult, Trigger, TriggerKind
from healer.core.model import NodeCondition, NodeView, StepKey, StepOutcome, Taint
from healer.core.topology import (
    DOMAIN_LABEL,
    placement,
    placement_data,
    rank_spares,
    same_domain_spares,
    slinky_topology_spec,
)
from healer.core.vocabulary import (
    CORDONED_BY,
    ESCALATED_LABEL,
    FENCED_ANNOTATION,
    OUT_OF_SERVICE_EFFECT,
    OUT_OF_SERVICE_TAINT,
    OUT_OF_SERVICE_VALUE,
    REPAIR_LABEL,
    REPAIR_PENDING,
    ROLE_LABEL,
    SLURM_REASON_PREFIX,
    SPARE_ROLE,
    SPARE_TAINT,
    TAINT_EFFECT,
    TAINT_VALUE,
)

Result = tuple[StepOutcome, str, dict[str, str]]


@dataclass
class SimJob:
    id: int
    node: str  # Slurm node name
    ends_at: float
    checkpointable: bool = True
    checkpoint_time: float = 60.0  # a checkpointing job writes its state, then exits
    acked_at: float | None = None


@dataclass
class SimNode:
    name: str
    labels: dict[str, str]
    spare: bool = False
    unschedulable: bool = False
    ready: bool = True
    annotations: dict[str, str] = field(default_factory=dict)
    taints: list[Taint] = field(default_factory=list)
    claimed_by: str = ""  # incident that claimed this spare

    def view(self, now: float) -> NodeView:
        conds = (NodeCondition("Ready", "True" if self.ready else "False", "", "", 0.0),)
        return NodeView(self.name, dict(self.labels), dict(self.annotations),
                        self.unschedulable, tuple(self.taints), conds)


@dataclass
class SimSlurmNode:
    name: str
    host: str  # the Kubernetes node its slurmd runs on
    drain: bool = False
    reason: str = ""
    registered_at: float = 0.0


@dataclass
class Latencies:
    api: float = 1.0  # a Kubernetes/Slurm call
    pod_start: float = 45.0  # a slurmd pod scheduled on the spare until Ready and registered
    validation: float = 120.0


@dataclass
class Effects:
    """What the world actually did, for assertions (each counted once per real change)."""

    swaps: dict[str, int] = field(default_factory=dict)  # incident -> slurmd moves
    drains: list[tuple[float, str, str]] = field(default_factory=list)
    undrains: list[tuple[float, str]] = field(default_factory=list)
    cordons: list[tuple[float, str]] = field(default_factory=list)
    uncordons: list[tuple[float, str]] = field(default_factory=list)
    events: list[tuple[float, str, str, str]] = field(default_factory=list)  # t, node, reason, note
    event_keys: set[str] = field(default_factory=set)
    signals_sent: list[tuple[float, int, str]] = field(default_factory=list)
    requeued: list[tuple[float, int]] = field(default_factory=list)
    killed_busy: list[tuple[float, str]] = field(default_factory=list)  # must stay empty


class SimWorld:
    def __init__(self, nodes: list[SimNode], jobs: list[SimJob] | None = None,
                 latencies: Latencies | None = None,
                 repair_results: Mapping[str, tuple[float, bool]] | None = None,
                 failing_validation: set[str] | None = None) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.slurm = {n.name: SimSlurmNode(n.name, n.name) for n in nodes if not n.spare}
        self.jobs: dict[int, SimJob] = {j.id: j for j in (jobs or [])}
        self.lat = latencies or Latencies()
        self.effects = Effects()
        self.repair_results = dict(repair_results or {})  # node -> (delay, passed)
        self.failing_validation = set(failing_validation or ())
        self._moved_at: dict[str, float] = {}
        self._validation_started: dict[str, float] = {}
        self.pending_repairs: list[tuple[float, str, str, bool]] = []  # at, node, incident, ok
        self.capacity_changed_at: list[float] = []
        self._touched: set[str] = set(self.nodes)
        self._host_of: dict[str, str] = {n.name: n.name for n in nodes if not n.spare}
        self._claims: dict[str, str] = {}  # incident -> claimed spare
        self._by_domain: dict[str, set[str]] = {}  # NVLink domain -> its nodes
        for n in nodes:
            self._index(n)

    # -- views -------------------------------------------------------------------------------

    def node_views(self, now: float) -> dict[str, NodeView]:
        return {n: s.view(now) for n, s in self.nodes.items()}

    def due_repairs(self, now: float) -> list[Trigger]:
        """The repair results due by ``now`` (taken out of the pending list), as triggers."""
        due = [r for r in self.pending_repairs if r[0] <= now]
        self.pending_repairs = [r for r in self.pending_repairs if r[0] > now]
        return [Trigger(TriggerKind.REPAIR, node, now, incident=incident, repair_passed=ok)
                for _, node, incident, ok in due]

    def view_of(self, node: str, now: float) -> NodeView | None:
        n = self.nodes.get(node)
        return n.view(now) if n is not None else None

    def touch(self, *nodes: str) -> None:
        """Note that these nodes changed (a scripted admin action, a new node)."""
        for name in nodes:
            if name:
                self._touched.add(name)
                n = self.nodes.get(name)
                if n is not None:
                    self._index(n)

    def _index(self, n: SimNode) -> None:
        dom = n.labels.get(DOMAIN_LABEL)
        if dom:
            self._by_domain.setdefault(dom, set()).add(n.name)

    def touched(self) -> set[str]:
        """The nodes whose view may have changed since the last call (then forgotten)."""
        out, self._touched = self._touched, set()
        return out

    def slurm_name(self, node: str) -> str:
        """The Slurm node whose slurmd runs on Kubernetes node ``node`` ("" if none)."""
        name = self._host_of.get(node)
        if name is not None:
            s = self.slurm.get(name)
            if s is not None and s.host == node:
                return name
        for s in self.slurm.values():
            if s.host == node:
                self._host_of[node] = s.name
                return s.name
        return ""

    def jobs_on(self, slurm_node: str, now: float) -> list[SimJob]:
        return [j for j in self.jobs.values() if j.node == slurm_node and j.ends_at > now]

    def busy(self, slurm_node: str, now: float) -> bool:
        return bool(self.jobs_on(slurm_node, now))

    def spare_depth(self) -> int:
        return sum(1 for n in self.nodes.values() if n.spare and not n.claimed_by)

    def summary(self) -> dict[str, Any]:
        return {
            "spares_free": self.spare_depth(),
            "cordoned": sorted(n for n, s in self.nodes.items() if s.unschedulable),
            "drained": sorted(n for n, s in self.slurm.items() if s.drain),
        }

    # -- actions -----------------------------------------------------------------------------

    def execute(self, action: a.Action, now: float) -> list[tuple[float, Trigger]]:
        """Run ``action`` at ``now``; return the triggers it produces and when they arrive."""
        t = now + self.lat.api
        handler = getattr(self, f"_do_{type(action).__name__}")
        out: list[tuple[float, Trigger]] = []
        res = handler(action, now)
        # what an action may change: its node, and the spare or target it names
        self.touch(action.node, getattr(action, "spare", ""), getattr(action, "target", ""))
        if res is None:
            return out
        if isinstance(res, SlurmObservation):
            out.append((t, Trigger(TriggerKind.SLURM, action.node, t, incident=action.incident,
                                   slurm=res)))
        else:
            status, error, data = res
            out.append((t, Trigger(TriggerKind.STEP, action.node, t, incident=action.incident,
                                   result=StepResult(action.ledger_name, status, error,
                                                     tuple(sorted(data.items()))))))
        return out

    def _ok(self, **data: str) -> Result:
        return StepOutcome.DONE, "", dict(data)

    def _do_Checkpoint(self, act: a.Checkpoint, now: float) -> Result:
        sn = act.slurm_node or self.slurm_name(act.node)
        jobs = self.jobs_on(sn, now)
        for j in jobs:
            if j.acked_at is None:
                j.acked_at = now
                self.effects.signals_sent.append((now, j.id, act.signal))
                if j.checkpointable:
                    j.ends_at = min(j.ends_at, now + j.checkpoint_time)
        if not self.jobs_on(sn, now + self.lat.api):
            return self._ok(slurmNode=sn, jobs=str(len(jobs)))
        return StepOutcome.PENDING, "", {StepKey.SLURM_NODE: sn, "waiting": str(len(jobs))}

    def _do_DrainSlurm(self, act: a.DrainSlurm, now: float) -> Result:
        sn = self.slurm_name(act.node) or act.slurm_node
        s = self.slurm.get(sn)
        if s is None:
            return StepOutcome.FAILED, f"no Slurm node runs on {act.node}", {}
        owner = "healer"
        if s.drain and not s.reason.startswith(SLURM_REASON_PREFIX):
            owner = "other"  # someone else drained it first: keep their reason
        elif not s.drain:
            s.drain, s.reason = True, act.reason
            self.effects.drains.append((now, sn, act.reason))
        return self._ok(slurmNode=sn, owner=owner)

    def _do_ObserveSlurm(self, act: a.ObserveSlurm, now: float) -> SlurmObservation | None:
        sn = act.slurm_node or self.slurm_name(act.node)
        s = self.slurm.get(sn)
        if s is None:
            return None  # nothing to observe; the next poll asks again
        return SlurmObservation(drain=s.drain, busy=self.busy(sn, now), reason=s.reason,
                                ours=s.reason.startswith(SLURM_REASON_PREFIX))

    def _do_RequeueJobs(self, act: a.RequeueJobs, now: float) -> Result:
        sn = act.slurm_node or self.slurm_name(act.node)
        for j in self.jobs_on(sn, now):
            j.ends_at = now
            self.effects.requeued.append((now, j.id))
        return self._ok()

    def _do_Cordon(self, act: a.Cordon, now: float) -> Result:
        n = self.nodes[act.node]
        if not n.unschedulable:
            n.unschedulable = True
            n.annotations[CORDONED_BY] = act.incident
            self.effects.cordons.append((now, act.node))
        return self._ok()

    def _do_ClaimSpare(self, act: a.ClaimSpare, now: float) -> Result:
        claimed = self.nodes.get(self._claims.get(act.incident, ""))
        if claimed is not None and claimed.claimed_by == act.incident:
            # idempotent: already claimed by this incident
            return self._ok(spare=claimed.name, **placement_data(placement(
                self.nodes[act.node].view(now), claimed.view(now))))
        free = [n.view(now) for n in self.free_spares(act.node)]
        bad = self.nodes[act.node].view(now)
        ranked = (same_domain_spares if act.same_domain else rank_spares)(bad, free)
        if not ranked:
            if act.same_domain:
                return (StepOutcome.UNAVAILABLE, "no free spare in NVLink domain "
                        f"{bad.labels.get(DOMAIN_LABEL) or '(none)'} (requireSameDomain)", {})
            return StepOutcome.UNAVAILABLE, "no free spare in the pool", {}
        best = self.nodes[ranked[0].name]
        best.claimed_by = act.incident
        self._claims[act.incident] = best.name
        return self._ok(spare=best.name, domain=best.labels.get(DOMAIN_LABEL, ""),
                        **placement_data(placement(bad, ranked[0])))

    def free_spares(self, node: str) -> list[SimNode]:
        """The spares that ``node``'s incident may claim: those of its NVLink domain when it
        has any (a spare there always ranks first), else every free spare."""

        def free(n: SimNode | None) -> bool:
            return n is not None and n.spare and not n.claimed_by and n.ready \
                and n.name != node

        bad = self.nodes.get(node)
        dom = bad.labels.get(DOMAIN_LABEL) if bad is not None else None
        if dom:
            near = [self.nodes[m] for m in sorted(self._by_domain.get(dom, ()))
                    if free(self.nodes.get(m))]
            if near:
                return near
        return [n for n in self.nodes.values() if free(n)]

    def _do_MoveWorkload(self, act: a.MoveWorkload, now: float) -> Result:
        if act.incident in self._moved_at:
            return self._ok(slurmNode=act.slurm_node)  # already moved for this incident
        sn = act.slurm_node or self.slurm_name(act.node)
        s = self.slurm.get(sn)
        if s is None or s.host != act.node:
            return StepOutcome.FAILED, f"Slurm node {sn!r} is not on {act.node}", {}
        if self.busy(sn, now):
            return StepOutcome.PENDING, "Slurm reports the node busy: not moving it", {}
        if s.drain and s.reason and not s.reason.startswith(SLURM_REASON_PREFIX):
            # as the Slinky workload move (docs/adr/0006): moving would delete their drain
            return (StepOutcome.PENDING, f"Slurm node {sn} is drained by someone else (reason "
                    f"{s.reason!r}): healer holds until the owner clears it",
                    {StepKey.HELD: "foreign-drain"})
        spare = self.nodes[act.spare]
        spare.spare = False
        spare.labels.pop(ROLE_LABEL, None)
        spare.taints = [t for t in spare.taints if t.key != SPARE_TAINT]
        s.host = act.spare
        s.registered_at = now + self.lat.pod_start
        self._moved_at[act.incident] = now
        self.effects.swaps[act.incident] = self.effects.swaps.get(act.incident, 0) + 1
        return self._ok(slurmNode=sn)

    def _do_AwaitReplacement(self, act: a.AwaitReplacement, now: float) -> Result:
        s = self.slurm.get(act.slurm_node)
        if s is None or s.host != act.spare:
            return StepOutcome.FAILED, "the Slurm node is not on the spare", {}
        if now >= s.registered_at:
            return self._ok()
        return StepOutcome.PENDING, "", {}

    def _do_AnnotateTopology(self, act: a.AnnotateTopology, now: float) -> Result:
        n = self.nodes[act.target]
        spec = slinky_topology_spec(n.view(now))
        n.annotations["topology.slinky.slurm.net/spec"] = spec
        return self._ok(topology=spec)

    def _do_Validate(self, act: a.Validate, now: float) -> Result:
        key = f"{act.incident}/{act.purpose}"
        started = self._validation_started.setdefault(key, now)
        if now - started < self.lat.validation:
            return StepOutcome.PENDING, "", {}
        if act.target in self.failing_validation:
            return StepOutcome.FAILED, "dcgmi diag failed", {}
        return self._ok()

    def _do_UndrainSlurm(self, act: a.UndrainSlurm, now: float) -> Result:
        sn = act.slurm_node or self.slurm_name(act.target)
        s = self.slurm.get(sn)
        if s is None:
            return self._ok(note="no such Slurm node")
        if s.drain and s.reason.startswith(SLURM_REASON_PREFIX) and act.incident in s.reason:
            s.drain, s.reason = False, ""
            self.effects.undrains.append((now, sn))
            return self._ok()
        return self._ok(note="not drained by this incident: left alone")

    def _do_Uncordon(self, act: a.Uncordon, now: float) -> Result:
        n = self.nodes[act.node]
        if n.annotations.get(CORDONED_BY) == act.incident:
            n.unschedulable = False
            del n.annotations[CORDONED_BY]
            self.effects.uncordons.append((now, act.node))
        return self._ok()

    def _do_ReleaseSpare(self, act: a.ReleaseSpare, now: float) -> Result:
        n = self.nodes.get(act.spare)
        if n is not None and n.claimed_by == act.incident and n.spare:
            n.claimed_by = ""
            self.capacity_changed_at.append(now)
        return self._ok()

    def _do_MarkRepair(self, act: a.MarkRepair, now: float) -> Result:
        n = self.nodes[act.node]
        if n.labels.get(REPAIR_LABEL) != REPAIR_PENDING:
            n.labels[REPAIR_LABEL] = REPAIR_PENDING
            if act.node in self.repair_results:
                delay, ok = self.repair_results[act.node]
                self.pending_repairs.append((now + delay, act.node, act.incident, ok))
        return self._ok()

    def _do_ReturnToPool(self, act: a.ReturnToPool, now: float) -> Result:
        n = self.nodes[act.node]
        n.labels.pop(REPAIR_LABEL, None)
        n.labels[ROLE_LABEL] = SPARE_ROLE
        n.spare, n.claimed_by, n.unschedulable = True, "", False
        n.annotations.pop(CORDONED_BY, None)
        n.taints.append(Taint(SPARE_TAINT, TAINT_VALUE, TAINT_EFFECT))
        self.capacity_changed_at.append(now)
        return self._ok()

    def _do_LostJobs(self, act: a.LostJobs, now: float) -> Result:
        """A dead node's jobs end with it (Slurm fails them)."""
        sn = act.slurm_node or self.slurm_name(act.node)
        lost = self.jobs_on(sn, now)
        for j in lost:
            j.ends_at = now
        return self._ok(jobs=",".join(f"{j.id}:NODE_FAIL" for j in lost) or "none")

    def _do_Fence(self, act: a.Fence, now: float) -> Result:
        """Only an admin fences here: the node's ``healer.io/fenced`` annotation."""
        n = self.nodes[act.node]
        by = n.annotations.get(FENCED_ANNOTATION)
        if by and "manual" in act.providers:
            return self._ok(provider="manual", by=by)
        return StepOutcome.PENDING, "no fencing provider said so yet", {}

    def _do_TaintOutOfService(self, act: a.TaintOutOfService, now: float) -> Result:
        n = self.nodes[act.node]
        if not any(t.key == OUT_OF_SERVICE_TAINT for t in n.taints):
            n.taints.append(Taint(OUT_OF_SERVICE_TAINT, OUT_OF_SERVICE_VALUE,
                                  OUT_OF_SERVICE_EFFECT))
        return self._ok()

    def _do_ClearOutOfService(self, act: a.ClearOutOfService, now: float) -> Result:
        n = self.nodes[act.node]
        if not n.ready:
            return StepOutcome.PENDING, f"{act.node} is not Ready yet", {}
        n.taints = [t for t in n.taints if t.key != OUT_OF_SERVICE_TAINT]
        return self._ok(cleared="true")

    def _do_Escalate(self, act: a.Escalate, now: float) -> Result:
        self.nodes[act.node].labels[ESCALATED_LABEL] = "true"
        return self._ok()

    def _do_EmitEvent(self, act: a.EmitEvent, now: float) -> None:
        if act.key not in self.effects.event_keys:
            self.effects.event_keys.add(act.key)
            self.effects.events.append((now, act.node, act.reason, act.note))
        return None
