"""The executor: runs a Decision's actions through the ports and reports outcomes as triggers.

Every action is idempotent by its key (incident id + step): the ports make a second run of the
same key a no-op that reports the same result, so re-issuing an open step after a restart or a
lost reply is always safe. In ``dryRun`` mode nothing that changes the world is called: each
action becomes a "DryRun: would ..." Event and reports success (a drain "completes" at once,
a spare is chosen but not claimed), so the whole flow can be watched without touching a node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import structlog

from healer.adapters.clock import SYSTEM_CLOCK
from healer.core import actions as a
from healer.core.machine import SlurmObservation, StepResult, Trigger, TriggerKind
from healer.core.model import FenceProvider, NodeRecord, StepKey, StepOutcome
from healer.core.rules import Mode
from healer.core.topology import TOPOGRAPH, TopologyKeys, placement, placement_data
from healer.core.vocabulary import ESCALATED_LABEL, ESCALATION_ANNOTATION
from healer.errors import HealerError, NotFoundError, PermanentError, TransientError
from healer.obs.logging import OnceLogger
from healer.ports import (
    CheckpointHook,
    Clock,
    EventRecorder,
    FenceSpec,
    Fencing,
    HookResult,
    HookSpec,
    NodeAPI,
    PendingClaim,
    RepairHook,
    SlurmDriver,
    SlurmHold,
    SlurmJobHistory,
    SparePool,
    Topology,
    Undrain,
    Validator,
    Workload,
)

log = structlog.get_logger("healer.executor")

SlurmNames = Callable[[str], Awaitable[str]]


async def same_name(node: str) -> str:
    """Bare Slurm: the Slurm node is named like the Kubernetes node."""
    return node


@dataclass
class Ports:
    nodes: NodeAPI
    events: EventRecorder
    slurm: SlurmDriver
    spares: SparePool
    workload: Workload
    topology: Topology
    validator: Validator
    checkpoint: CheckpointHook
    repair: RepairHook
    fencing: Fencing
    slurm_names: SlurmNames = same_name
    topology_keys: TopologyKeys = TOPOGRAPH  # the labels a placement is reported from
    slurm_history: SlurmJobHistory | None = None
    """The Slurm driver's job history, where its registry entry has one (SlurmHandles)."""
    slurm_hold: SlurmHold | None = None
    """The Slurm driver's drain with someone else's reason, where it has one."""


@dataclass(frozen=True, slots=True)
class Outcome:
    status: StepOutcome
    error: str = ""
    data: Mapping[str, str] | None = None


def _hook(r: HookResult) -> Outcome:
    return Outcome(r.outcome, r.detail if r.outcome is not StepOutcome.DONE else "",
                   dict(r.data))


async def _no_spare(p: Ports, act: a.ClaimSpare) -> str:
    """Why no spare was claimed, in words ``healer status`` shows."""
    if not act.same_domain:
        return "no warm spare fits this node"
    dom = ""
    with contextlib.suppress(HealerError):
        dom = (await p.nodes.get(act.node)).labels.get(p.topology_keys.domain, "")
    return (f"no free warm spare in NVLink domain {dom or '(none)'} (swap.requireSameDomain: "
            "spares in other domains are not taken)")


async def _lost_jobs(p: Ports, act: a.LostJobs) -> Outcome:
    """The jobs a dead node took with it, as Slurm reports them: a report, never a reason to
    stop (an unreadable Slurm says so in the report)."""
    sn = act.slurm_node
    try:
        sn = sn or await p.slurm_names(act.node)
        jobs = await (p.slurm_history.recent_jobs_on(sn) if p.slurm_history is not None
                      else p.slurm.jobs_on(sn))
        text = ",".join(f"{j.id}:{j.state}" for j in jobs) or "none"
    except HealerError as e:
        text = f"unknown ({e})"[:250]
    data: dict[str, str] = {StepKey.JOBS: text}
    if sn:
        data[StepKey.SLURM_NODE] = sn
    return Outcome(StepOutcome.DONE, "", data)


async def _clear_out_of_service(p: Ports, act: a.ClearOutOfService) -> Outcome:
    """healer's out-of-service taint comes off only once the node is Ready again: its kubelet
    is back and has settled its pods, so none of the old ones can come back."""
    try:
        view = await p.nodes.get(act.node)
    except NotFoundError:
        return Outcome(StepOutcome.DONE, "", {"cleared": "false", "why": "the Node is gone"})
    if not view.ready:
        return Outcome(StepOutcome.PENDING, f"{act.node} is not Ready yet: the out-of-service "
                                           "taint stays until its kubelet is back")
    cleared = await p.nodes.clear_out_of_service(act.node, act.incident)
    return Outcome(StepOutcome.DONE, "", {"cleared": str(cleared).lower()})


class ActionRunner(Protocol):
    """What the controller needs of the executor: run one action, report its outcome as
    triggers (:class:`Executor`; a test may wrap it, ``healer.app.Overrides.wrap_actions``)."""

    async def run(self, action: a.Action, record: NodeRecord | None) -> list[Trigger]: ...


#: The ports that act on a node (with several NodeSets, that node's NodeSet's).
PortsRoute = Callable[[str], Ports]


class Executor:
    """Runs the core's actions through the ports: ``ports``, or, with several NodeSets, the
    ports ``route`` picks for the action's node (its Slurm cluster, spares, workload)."""

    def __init__(self, ports: Ports, clock: Clock = SYSTEM_CLOCK, *,
                 route: PortsRoute | None = None) -> None:
        self.p = ports
        self.route: PortsRoute = route if route is not None else (lambda _node: ports)
        self.clock = clock
        self._retrying = OnceLogger("healer.executor")

    async def run(self, action: a.Action, record: NodeRecord | None) -> list[Trigger]:
        """Run one action; return the triggers that report its outcome (maybe none)."""
        dry = record is not None and record.mode is Mode.DRY_RUN
        node = action.node
        try:
            if isinstance(action, a.EmitEvent):
                await self._emit(action)
                return []
            if isinstance(action, a.ObserveSlurm):
                return [await self._observe(action, dry)]
            if dry:
                out = await self._dry(action)
            else:
                out = await self._run(action, record)
        except TransientError as e:
            out = Outcome(StepOutcome.RETRY, str(e))
        except HealerError as e:
            out = Outcome(StepOutcome.FAILED, str(e))
        except Exception as e:  # a bug in an adapter: fail the step, keep the daemon alive
            log.exception("action crashed", action=action.key)
            out = Outcome(StepOutcome.FAILED, f"{type(e).__name__}: {e}")
        what = f"step {action.ledger_name} on {node}"
        if out.status is StepOutcome.RETRY:  # logged once until the step gets through
            self._retrying.failed(what, out.error)
        elif out.status is StepOutcome.FAILED:  # not a recovery: the failure is logged instead
            self._retrying.down.pop(what, None)
            log.warning("step failed", node=node, incident=action.incident,
                        step=action.ledger_name, error=out.error)
        else:
            self._retrying.ok(what)
        now = self.clock.now()
        data = tuple(sorted((out.data or {}).items()))
        return [Trigger(TriggerKind.STEP, node, now, incident=action.incident,
                        result=StepResult(action.ledger_name, out.status, out.error, data))]

    async def _emit(self, act: a.EmitEvent) -> None:
        """An Event that cannot be written is logged, never a reason to stop a remediation
        (the NodeRemediation and the metrics still say what happened)."""
        try:
            await self.p.events.emit(key=act.key, node=act.node, reason=act.reason,
                                     note=act.note, type=act.type, action=act.reason,
                                     remediation=act.incident)
        except HealerError as e:
            log.warning("event not written", reason=act.reason, key=act.key, error=str(e))

    async def _observe(self, act: a.ObserveSlurm, dry: bool) -> Trigger:
        now = self.clock.now()
        if dry:
            obs = SlurmObservation(drain=True, busy=False, reason="(dry run)", ours=True)
        else:
            p = self.route(act.node)
            sn = act.slurm_node or await p.slurm_names(act.node)
            st = await p.slurm.state(sn, host=act.node)
            obs = SlurmObservation(drain=st.drain, busy=st.busy, down=st.down, reason=st.reason,
                                   ours=st.reason_is_ours)
        return Trigger(TriggerKind.SLURM, act.node, now, incident=act.incident, slurm=obs)

    async def _dry(self, act: a.Action) -> Outcome:
        data: dict[str, str] = {}
        if isinstance(act, a.ClaimSpare):
            data[StepKey.SPARE] = "(dry-run spare)"
        if isinstance(act, a.Fence):
            data.update(provider=FenceProvider.MANUAL.value, by="(dry run: would wait for "
                        f"{', '.join(act.providers) or 'a provider'})")
        await self.p.events.emit(key=f"{act.key}/dry-run", node=act.node, reason="DryRun",
                                 note=f"would {act.describe()}", action=act.step,
                                 remediation=act.incident)
        return Outcome(StepOutcome.DONE, "", data)

    async def _run(self, act: a.Action, record: NodeRecord | None) -> Outcome:
        p = self.route(act.node)
        match act:
            case a.Checkpoint():
                sn = act.slurm_node or await p.slurm_names(act.node)
                spec = HookSpec(act.hook, act.signal, act.url, act.secret_ref, act.job_template)
                return _hook(await p.checkpoint.checkpoint(act.incident, act.node, sn, spec))
            case a.DrainSlurm():
                sn = act.slurm_node or await p.slurm_names(act.node)
                owned = await p.slurm.drain(sn, act.reason, act.incident, host=act.node)
                return Outcome(StepOutcome.DONE, "", {StepKey.SLURM_NODE: sn,
                                                     "owner": "healer" if owned else "other"})
            case a.RequeueJobs():
                sn = act.slurm_node or await p.slurm_names(act.node)
                ids = await p.slurm.requeue_jobs(sn)
                return Outcome(StepOutcome.DONE, "", {StepKey.JOBS: ",".join(map(str, ids))})
            case a.Cordon():
                owned = await p.nodes.cordon(act.node, act.incident, act.reason)
                return Outcome(StepOutcome.DONE, "",
                               {StepKey.OWNER: "healer" if owned else "other"})
            case a.ClaimSpare():
                spare = await p.spares.claim(act.node, act.incident,
                                             same_domain=act.same_domain,
                                             labels=dict(act.labels) if act.labels else None)
                if spare is None:
                    return Outcome(StepOutcome.UNAVAILABLE, await _no_spare(p, act))
                if isinstance(spare, PendingClaim):  # the spare is being validated first
                    return Outcome(StepOutcome.PENDING, spare.detail)
                data: dict[str, str] = {StepKey.SPARE: spare}
                with contextlib.suppress(HealerError):  # the claim stands; only the report
                    data.update(placement_data(placement(await p.nodes.get(act.node),
                                                         await p.nodes.get(spare),
                                                         p.topology_keys)))
                return Outcome(StepOutcome.DONE, "", data)
            case a.MoveWorkload():
                try:
                    sn = act.slurm_node or await p.slurm_names(act.node)
                except NotFoundError:
                    if not act.dead:
                        raise
                    sn = ""  # its pod is gone already: the move looks on the spare
                return _hook(await p.workload.move(act.incident, sn, act.node, act.spare,
                                                   dead=act.dead, carry=act.carry))
            case a.AwaitReplacement():
                out = _hook(await p.workload.replacement_ready(act.incident, act.slurm_node,
                                                               act.spare))
                if out.status is StepOutcome.DONE and act.carry:
                    sn = act.slurm_node or dict(out.data or {}).get(StepKey.SLURM_NODE, "")
                    if p.slurm_hold is None:
                        raise PermanentError("swap.foreignReason carryOver needs a Slurm driver "
                                             "that sets a reason (scontrol or slurmrestd, or "
                                             "the slinky driver with one as its job backend)")
                    await p.slurm_hold.hold(sn, act.carry)
                    out = Outcome(StepOutcome.DONE, "",
                                  {**(out.data or {}), StepKey.CARRIED: act.carry})
                return out
            case a.AnnotateTopology():
                return _hook(await p.topology.annotate(act.incident, act.target, act.slurm_node))
            case a.Validate():
                return _hook(await p.validator.validate(act.incident, act.target, act.image,
                                                        act.command, act.purpose))
            case a.UndrainSlurm():
                sn = act.slurm_node or await p.slurm_names(act.target)
                undrain = await p.slurm.undrain(sn, act.incident, host=act.target)
                if undrain is Undrain.SETTLING:
                    return Outcome(StepOutcome.PENDING, f"{sn} still drained by healer")
                return Outcome(StepOutcome.DONE, "",
                               {StepKey.SLURM_NODE: sn, "undrain": undrain.value})
            case a.Uncordon():
                done = await p.nodes.uncordon(act.node, act.incident)
                return Outcome(StepOutcome.DONE, "", {"uncordoned": str(done).lower()})
            case a.ReleaseSpare():
                if act.spare:
                    await p.spares.release(act.spare, act.incident)
                return Outcome(StepOutcome.DONE)
            case a.MarkRepair():
                spec = HookSpec(act.hook, url=act.url, secret_ref=act.secret_ref,
                                job_template=act.job_template)
                return _hook(await p.repair.hand_off(act.incident, act.node, spec))
            case a.ReturnToPool():
                await p.spares.return_to_pool(act.node, act.incident)
                return Outcome(StepOutcome.DONE)
            case a.Escalate():
                try:
                    await p.nodes.patch_metadata(act.node, labels={ESCALATED_LABEL: "true"},
                                                 annotations={ESCALATION_ANNOTATION: act.reason})
                except NotFoundError:  # the Node is gone: nothing to mark
                    return Outcome(StepOutcome.DONE, "", {"node": "gone"})
                return Outcome(StepOutcome.DONE)
            case a.LostJobs():
                return await _lost_jobs(p, act)
            case a.Fence():
                fence = FenceSpec(frozenset(FenceProvider(x) for x in act.providers), act.url,
                                  act.secret_ref, act.deadline)
                return _hook(await p.fencing.fence(act.incident, act.node, fence))
            case a.TaintOutOfService():
                ours = await p.nodes.taint_out_of_service(act.node, act.incident)
                return Outcome(StepOutcome.DONE, "", {StepKey.OWNER: "healer" if ours else "other"})
            case a.ClearOutOfService():
                return await _clear_out_of_service(p, act)
        raise PermanentError(f"no executor for {type(act).__name__}")
