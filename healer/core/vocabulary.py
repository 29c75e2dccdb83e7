"""Vocabulary: every name healer writes to or reads from the cluster, defined once.

The ``healer.io/`` labels, annotations and taints on Nodes and on healer's own objects, the
Slurm drain-reason prefix that marks a drain as healer's, the node condition the agent
publishes, and the ledger's step names. Every module uses these names, never the literals
(``tests/unit/test_vocabulary.py`` fails on a ``"healer.io/…"`` literal anywhere else in the
package; the CRD's API group ``healer.io`` is a different thing and lives with the CRD).
``docs/vocabulary.md`` is generated from this module (``healer docs --write``).

Pure constants: the core may import it, and so may everything else.
"""

from __future__ import annotations

import enum

# --- Node labels ------------------------------------------------------------------------------

#: Label an admin sets (``"true"``) to opt a node out of remediation; healer reads it.
EXCLUDE_LABEL = "healer.io/exclude"
#: Label of the default spare selector (``healer.io/role=spare``); the operator sets it.
ROLE_LABEL = "healer.io/role"
#: The ``ROLE_LABEL`` value that makes a node a warm spare.
SPARE_ROLE = "spare"
#: Label healer sets on a claimed spare: a digest of the incident (selectable, unlike the name).
CLAIM_LABEL = "healer.io/claim"
#: Label healer sets to hand a node to repair (value ``REPAIR_PENDING``); repair tooling reads it.
REPAIR_LABEL = "healer.io/repair"
#: The ``REPAIR_LABEL`` value: the node awaits repair.
REPAIR_PENDING = "pending"
#: Label healer sets (``"true"``) on a node it escalated to a human.
ESCALATED_LABEL = "healer.io/escalated"
#: Label healer sets on its NodeRemediations and Events: the node they are about.
NODE_LABEL = "healer.io/node"
#: Label healer sets on a validation Job: ``validate-<purpose>``.
PURPOSE_LABEL = "healer.io/purpose"
#: Label healer sets (``"true"``) on a warm spare that failed its validation: out of the pool
#: (the spare label someone else set stays), handed to repair.
SPARE_FAILED_LABEL = "healer.io/spare-failed"

# --- Node annotations -------------------------------------------------------------------------

#: Annotation an admin sets (``"true"``, any case) to pause remediation of a node; healer reads it.
PAUSE_ANNOTATION = "healer.io/paused"
#: Annotation healer sets on a node it cordoned (value ``CORDONED_BY_HEALER``): the cordon is ours.
CORDONED_BY = "healer.io/cordoned-by"
#: The ``CORDONED_BY`` value healer writes.
CORDONED_BY_HEALER = "healer"
#: Annotation healer sets on a node it cordoned: the incident id.
INCIDENT_ANNOTATION = "healer.io/incident"
#: Annotation healer sets on a node it cordoned: why (at most 250 characters).
REASON_ANNOTATION = "healer.io/reason"
#: Annotation healer sets on a node it cordoned: when (RFC 3339).
CORDONED_AT = "healer.io/cordoned-at"
#: Annotation healer sets on a claimed spare: the incident that claimed it.
CLAIMED_BY = "healer.io/claimed-by"
#: Annotation healer sets on a claimed spare: when it was claimed.
CLAIMED_AT = "healer.io/claimed-at"
#: Annotation repair tooling sets when a repair finished: ``passed`` or ``failed``.
REPAIR_RESULT = "healer.io/repair-result"
#: Annotation healer sets when it hands a node to repair: the incident.
REPAIR_INCIDENT = "healer.io/repair-incident"
#: Annotation healer sets on a warm spare: its last validation, JSON (``result`` passed|failed,
#: ``at`` RFC 3339, ``checks``, ``detail``); survives a restart, readable by an operator.
SPARE_VALIDATION = "healer.io/spare-validation"
#: Annotation healer sets on a warm spare before it starts validating it: the run (JSON ``run``,
#: ``at``, ``checks``), so a restarted leader reuses that run's Jobs instead of starting more.
SPARE_VALIDATION_RUN = "healer.io/spare-validation-run"
#: Annotation a job sets to acknowledge a checkpoint request: the incident.
CHECKPOINT_ACK = "healer.io/checkpoint-ack"
#: Annotation healer sets once it signalled the jobs to checkpoint: ``<incident>:<job ids>``.
CHECKPOINT_SIGNALLED = "healer.io/checkpoint-signalled"
#: Annotation healer sets on a node it escalated: why.
ESCALATION_ANNOTATION = "healer.io/escalation"
#: Annotation healer sets on its Events: the idempotency key.
EVENT_KEY_ANNOTATION = "healer.io/key"
#: Annotation an admin sets on a dead node to say it is off or cut off (value: who and why):
#: the ``manual`` fencing provider; healer reads it, never writes or removes it.
FENCED_ANNOTATION = "healer.io/fenced"
#: Annotation healer writes when a fencing webhook's receiver acknowledged ``fenced`` through
#: the ack endpoint: the incident (bound to the node and incident, single use).
FENCE_ACK = "healer.io/fence-ack"
#: Annotation healer writes once it sent a dead node's fencing webhook: the incident (a new
#: leader does not send it again).
FENCE_REQUESTED = "healer.io/fence-requested"
#: Annotation healer writes on a dead node it tainted out of service: the incident (healer
#: removes only an out-of-service taint it set, and only once the node is back from repair).
OUT_OF_SERVICE_BY = "healer.io/out-of-service"

# --- Taints -----------------------------------------------------------------------------------

#: Taint healer puts on a node it cordoned (``REMEDIATION_TAINT=true:NoSchedule``).
REMEDIATION_TAINT = "healer.io/remediation"
#: Taint on a warm spare (``SPARE_TAINT=true:NoSchedule``), so nothing lands on it by accident;
#: the operator (or healer, returning a repaired node to the pool) sets it, a claim removes it.
SPARE_TAINT = "healer.io/spare"
#: The value of both of healer's taints.
TAINT_VALUE = "true"
#: The effect of both of healer's taints.
TAINT_EFFECT = "NoSchedule"

# --- Kubernetes' own names healer reads or writes ----------------------------------------------

#: The non-graceful node shutdown taint (GA in Kubernetes 1.28): on a NotReady Node, the pod
#: garbage collector of kube-controller-manager force-deletes its terminating pods. healer sets
#: it (``OUT_OF_SERVICE_TAINT=OUT_OF_SERVICE_VALUE:OUT_OF_SERVICE_EFFECT``) only on a fenced
#: dead node.
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
#: The value healer gives the out-of-service taint.
OUT_OF_SERVICE_VALUE = "nodeshutdown"
#: The effect of the out-of-service taint.
OUT_OF_SERVICE_EFFECT = "NoExecute"
#: The taint a cloud controller manager puts on a Node whose instance is shut down: the
#: ``cloudShutdown`` fencing provider.
CLOUD_SHUTDOWN_TAINT = "node.cloudprovider.kubernetes.io/shutdown"

# --- Other names ------------------------------------------------------------------------------

#: The reporting controller of every Event healer writes.
REPORTING_CONTROLLER = "healer.io/healer"
#: Prefix of every Slurm drain reason healer sets; a drain with another reason is not healer's.
SLURM_REASON_PREFIX = "healer: "
#: Prefix a job writes into its Slurm comment (``healer-ack:<incident>``) to acknowledge a
#: checkpoint request (the ``slurm-signal`` hook); healer reads it.
CHECKPOINT_ACK_COMMENT_PREFIX = "healer-ack:"
#: Node condition the agent publishes (and the default health policy reads).
GPU_CONDITION = "GPUHealthy"
#: The field manager the agent writes that condition with: GPU identity is read only from a
#: GPUHealthy condition whose message this manager wrote (ADR 0009, managedFields).
AGENT_FIELD_MANAGER = "healer-agent"
#: Tag of the machine-readable GPU identity block the agent appends to its condition's
#: message (``[healer.io/gpus v1 *2:GPU-…:1650…]``; :mod:`healer.core.gpu_identity`).
GPU_IDENTITY_TAG = "healer.io/gpus"


class StepName(enum.StrEnum):
    """The ledger's step names (``Action.ledger_name``): one entry per step of an incident.

    Members compare and hash as their strings, but they are not exact ``str``: orjson refuses
    one as a dict key (``TypeError: Dict key must be str``), so a name that can end up as a key
    of the stored record is ``.value``."""

    CHECKPOINT = "checkpoint"  # ask the node's jobs to checkpoint
    DRAIN = "drain"  # drain the Slurm node
    OBSERVE_SLURM = "observe-slurm"  # read the Slurm node's state (not ledgered)
    REQUEUE = "requeue"  # requeue the Slurm node's jobs
    CORDON = "cordon"  # cordon and taint the Kubernetes node
    CLAIM_SPARE = "claim-spare"  # claim a warm spare
    MOVE_WORKLOAD = "move-workload"  # move the slurmd to the spare
    AWAIT_REPLACEMENT = "await-replacement"  # wait for the replacement slurmd and Slurm node
    ANNOTATE_TOPOLOGY = "annotate-topology"  # write and verify the replacement's topology
    VALIDATE = "validate"  # the validation gate (ledgered as validate-<purpose>)
    VALIDATE_REPLACEMENT = "validate-replacement"  # validate the replacement
    VALIDATE_REPAIRED = "validate-repaired"  # validate a repaired node
    UNDRAIN = "undrain"  # return the (replacement) node to Slurm
    UNDO_DRAIN = "undo-drain"  # give back a drain that is no longer needed
    UNCORDON = "uncordon"  # uncordon, remove healer's taint and provenance
    RELEASE_SPARE = "release-spare"  # give back a claimed spare that never took over
    MARK_REPAIR = "mark-repair"  # hand the node to repair
    RETURN_TO_POOL = "return-to-pool"  # a repaired node joins the spare pool
    LOST_JOBS = "lost-jobs"  # a dead node: which jobs Slurm failed or requeued there
    FENCE = "fence"  # a dead node: a provider says it is off or cut off
    OUT_OF_SERVICE = "out-of-service"  # a fenced node: the out-of-service taint
    CLEAR_OUT_OF_SERVICE = "clear-out-of-service"  # back from repair: that taint comes off
    ESCALATE = "escalate"  # a human is needed
    EVENT = "event"  # an Event (not ledgered; keyed event-<name>)
