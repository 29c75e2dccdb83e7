"""Actions: what the state machine asks the executor to do, as data.

Every action names its incident and its ledger step; ``key`` (incident id + step) is the
idempotency key: running an action twice with the same key has the effect of running it once.
The executor reports the outcome of a ledgered action back as a ``STEP`` trigger carrying a
:class:`~healer.core.model.StepOutcome`. Waiting actions (a checkpoint ack, a drain, a
replacement becoming ready) are polled: the machine re-issues the same action with the same key
until it reports ``DONE``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from healer.core.vocabulary import StepName


class Impact(enum.Enum):
    """What an action does to capacity. Guardrails gate only ``DISRUPTIVE`` actions."""

    NONE = "none"  # observation, events, labels on nodes out of service
    DISRUPTIVE = "disruptive"  # takes capacity out or touches running work
    RECOVERY = "recovery"  # gives capacity back: never blocked by the breaker


class HookKind(enum.StrEnum):
    """How a checkpoint or a repair reaches the outside (a policy's ``steps.checkpoint.hook``
    and ``steps.repair.hook``; the value is the policy's word)."""

    SLURM_SIGNAL = "slurm-signal"  # checkpoint only: signal the node's jobs through Slurm
    WEBHOOK = "webhook"  # an HMAC-signed HTTP call
    JOB = "job"  # a Kubernetes Job from a ConfigMap template
    NONE = "none"  # repair only: label the node, call nothing


#: The hooks a checkpoint may use, and a repair (the policy schema allows exactly these).
CHECKPOINT_HOOKS = (HookKind.SLURM_SIGNAL, HookKind.WEBHOOK, HookKind.JOB)
REPAIR_HOOKS = (HookKind.NONE, HookKind.WEBHOOK, HookKind.JOB)


@dataclass(frozen=True, slots=True)
class Action:
    incident: str
    node: str

    step: ClassVar[str] = ""
    impact: ClassVar[Impact] = Impact.NONE
    ledgered: ClassVar[bool] = True  # recorded in the ledger, reported back as a STEP trigger

    @property
    def ledger_name(self) -> str:
        """The ledger step this action belongs to (usually ``step``)."""
        return self.step

    @property
    def key(self) -> str:
        return f"{self.incident}/{self.ledger_name}"

    def describe(self) -> str:
        return f"{self.step} {self.node}"


@dataclass(frozen=True, slots=True)
class Checkpoint(Action):
    """Ask the jobs on the node to checkpoint; DONE once they acknowledged or ended."""

    hook: HookKind = HookKind.SLURM_SIGNAL
    signal: str = "USR1"
    slurm_node: str = ""
    url: str = ""
    secret_ref: str = ""
    job_template: str = ""
    step: ClassVar[str] = StepName.CHECKPOINT.value
    impact: ClassVar[Impact] = Impact.DISRUPTIVE


@dataclass(frozen=True, slots=True)
class DrainSlurm(Action):
    """Drain the Slurm node (reason prefixed ``healer: ``); DONE once the request is accepted."""

    slurm_node: str = ""
    reason: str = ""
    step: ClassVar[str] = StepName.DRAIN.value
    impact: ClassVar[Impact] = Impact.DISRUPTIVE


@dataclass(frozen=True, slots=True)
class ObserveSlurm(Action):
    """Read the Slurm node's state; answered by a ``SLURM`` trigger, not a ledger step."""

    slurm_node: str = ""
    step: ClassVar[str] = StepName.OBSERVE_SLURM.value
    ledgered: ClassVar[bool] = False


@dataclass(frozen=True, slots=True)
class RequeueJobs(Action):
    """Requeue every job on the Slurm node (the drain deadline passed and the policy says so)."""

    slurm_node: str = ""
    step: ClassVar[str] = StepName.REQUEUE.value
    impact: ClassVar[Impact] = Impact.DISRUPTIVE


@dataclass(frozen=True, slots=True)
class Cordon(Action):
    """Cordon and taint the Kubernetes node, with healer's provenance annotations."""

    reason: str = ""
    step: ClassVar[str] = StepName.CORDON.value
    impact: ClassVar[Impact] = Impact.DISRUPTIVE


@dataclass(frozen=True, slots=True)
class ClaimSpare(Action):
    """Choose (topology-aware) and atomically claim a warm spare; DONE with ``spare`` and its
    placement (``match``, ``nodeDomain``, ``spareDomain``, ``switch``) in data. With
    ``same_domain`` only a spare in the node's NVLink domain may be taken (else UNAVAILABLE)."""

    same_domain: bool = False
    labels: tuple[tuple[str, str], ...] = ()  # the node's, when its Node may be gone (dead)
    step: ClassVar[str] = StepName.CLAIM_SPARE.value
    impact: ClassVar[Impact] = Impact.DISRUPTIVE


@dataclass(frozen=True, slots=True)
class MoveWorkload(Action):
    """Move the Slurm node's slurmd to the spare (never while Slurm reports it busy). From a
    ``dead`` (fenced, out-of-service) node nothing is evicted gracefully: its pod goes through
    kube-controller-manager's pod garbage collector and is recreated on the spare."""

    spare: str = ""
    slurm_node: str = ""
    dead: bool = False
    carry: bool = False  # swap.foreignReason carryOver: move over someone else's reason
    step: ClassVar[str] = StepName.MOVE_WORKLOAD.value
    impact: ClassVar[Impact] = Impact.DISRUPTIVE


@dataclass(frozen=True, slots=True)
class AwaitReplacement(Action):
    """DONE once the replacement slurmd is Ready and its Slurm node registered (and, with
    ``carry``, drained with that reason: someone else's, carried over by the move)."""

    spare: str = ""
    slurm_node: str = ""
    carry: str = ""
    step: ClassVar[str] = StepName.AWAIT_REPLACEMENT.value


@dataclass(frozen=True, slots=True)
class AnnotateTopology(Action):
    """Write the replacement's topology annotation and verify Slurm sees it."""

    target: str = ""
    slurm_node: str = ""
    step: ClassVar[str] = StepName.ANNOTATE_TOPOLOGY.value


@dataclass(frozen=True, slots=True)
class Validate(Action):
    """Run the validation gate (a Job) on ``target``; DONE on success, FAILED on failure."""

    target: str = ""
    image: str = ""
    command: tuple[str, ...] = ()
    purpose: str = "replacement"  # replacement | repaired
    step: ClassVar[str] = StepName.VALIDATE.value

    @property
    def ledger_name(self) -> str:
        return f"validate-{self.purpose}"


@dataclass(frozen=True, slots=True)
class UndrainSlurm(Action):
    """Undrain the Slurm node, only if its drain reason is healer's own."""

    target: str = ""
    slurm_node: str = ""
    purpose: str = "serve"  # serve: return the (replacement) node to Slurm | undo: give back
    step: ClassVar[str] = StepName.UNDRAIN.value
    impact: ClassVar[Impact] = Impact.RECOVERY

    @property
    def ledger_name(self) -> str:
        return StepName.UNDRAIN.value if self.purpose == "serve" else StepName.UNDO_DRAIN.value


@dataclass(frozen=True, slots=True)
class Uncordon(Action):
    """Uncordon and remove healer's taint and provenance, only where healer put them."""

    step: ClassVar[str] = StepName.UNCORDON.value
    impact: ClassVar[Impact] = Impact.RECOVERY


@dataclass(frozen=True, slots=True)
class ReleaseSpare(Action):
    """Give back a claimed spare that never took over (cancel before the move)."""

    spare: str = ""
    step: ClassVar[str] = StepName.RELEASE_SPARE.value
    impact: ClassVar[Impact] = Impact.RECOVERY


@dataclass(frozen=True, slots=True)
class MarkRepair(Action):
    """Label the node for repair and call the repair hook, if any."""

    hook: HookKind = HookKind.NONE
    url: str = ""
    secret_ref: str = ""
    job_template: str = ""
    step: ClassVar[str] = StepName.MARK_REPAIR.value


@dataclass(frozen=True, slots=True)
class ReturnToPool(Action):
    """A repaired, validated node joins the warm-spare pool."""

    step: ClassVar[str] = StepName.RETURN_TO_POOL.value
    impact: ClassVar[Impact] = Impact.RECOVERY


@dataclass(frozen=True, slots=True)
class LostJobs(Action):
    """A dead node: report the jobs Slurm failed or requeued there (a read; never blocks)."""

    slurm_node: str = ""
    step: ClassVar[str] = StepName.LOST_JOBS.value


@dataclass(frozen=True, slots=True)
class Fence(Action):
    """A dead node: DONE once one of ``providers`` says its machine is off or cut off (the
    webhook provider is asked once per incident; ``deadline`` is when healer stops waiting,
    seconds since the epoch, sent with it). Nothing irreversible happens before it is DONE."""

    providers: tuple[str, ...] = ()
    url: str = ""
    secret_ref: str = ""
    deadline: float = 0.0
    step: ClassVar[str] = StepName.FENCE.value
    impact: ClassVar[Impact] = Impact.DISRUPTIVE


@dataclass(frozen=True, slots=True)
class TaintOutOfService(Action):
    """A fenced node: ``node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`` (with
    healer's provenance), so kube-controller-manager's pod garbage collector removes its pods."""

    step: ClassVar[str] = StepName.OUT_OF_SERVICE.value
    impact: ClassVar[Impact] = Impact.DISRUPTIVE


@dataclass(frozen=True, slots=True)
class ClearOutOfService(Action):
    """Back from repair: remove the out-of-service taint healer set, once the node is Ready
    again (its kubelet is back, so its old pods cannot come back)."""

    step: ClassVar[str] = StepName.CLEAR_OUT_OF_SERVICE.value
    impact: ClassVar[Impact] = Impact.RECOVERY


@dataclass(frozen=True, slots=True)
class Escalate(Action):
    """A human is needed: mark the node and raise a Warning Event; the node stays as it is."""

    reason: str = ""
    step: ClassVar[str] = StepName.ESCALATE.value


@dataclass(frozen=True, slots=True)
class EmitEvent(Action):
    """A Kubernetes Event on the node and the NodeRemediation (idempotent by ``name``)."""

    reason: str = ""
    note: str = ""
    type: str = "Normal"
    name: str = ""  # distinguishes events of one incident; part of the idempotency key
    step: ClassVar[str] = StepName.EVENT.value
    ledgered: ClassVar[bool] = False

    @property
    def ledger_name(self) -> str:
        return f"event-{self.name or self.reason}"


#: Every concrete action type, for documentation and exhaustive tests.
ALL_ACTIONS: tuple[type[Action], ...] = (
    Checkpoint, DrainSlurm, ObserveSlurm, RequeueJobs, Cordon, ClaimSpare, MoveWorkload,
    AwaitReplacement, AnnotateTopology, Validate, UndrainSlurm, Uncordon, ReleaseSpare,
    MarkRepair, ReturnToPool, LostJobs, Fence, TaintOutOfService, ClearOutOfService, Escalate,
    EmitEvent,
)
