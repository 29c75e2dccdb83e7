"""The ports: what the runtime needs from the outside world, as ``typing.Protocol``s.

Adapters implement them against real systems (``healer/adapters``); ``healer_dev/testing.py`` has
in-memory fakes. Every method raises only healer's own errors (:mod:`healer.errors`):
``TransientError`` when a retry may help, ``PermanentError`` when it cannot.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from healer.core.actions import HookKind as HookKind
from healer.core.model import FenceProvider, NodeRecord, NodeView, Signal

# an adapter answers with the core's one step-outcome type; adapters import it from here
from healer.core.model import StepOutcome as StepOutcome
from healer.core.slurm_drivers import SlurmCapabilities
from healer.core.vocabulary import SLURM_REASON_PREFIX

# ---------------------------------------------------------------------------------------------
# Slurm


@dataclass(frozen=True, slots=True)
class SlurmNodeState:
    """A Slurm node as healer needs to see it.

    ``base`` is Slurm's base state (IDLE, ALLOCATED, MIXED, DOWN, ...), ``flags`` the state
    flags (DRAIN, COMPLETING, NOT_RESPONDING, ...). ``drain`` = DRAIN flag set (and not UNDRAIN);
    ``busy`` = ALLOCATED, MIXED or COMPLETING; ``drained`` = drain and not busy.
    """

    name: str
    base: str
    flags: frozenset[str] = frozenset()
    reason: str = ""
    reason_user: str = ""
    registered: bool = True  # slurmd responding (not NOT_RESPONDING / not DOWN for that reason)
    topology: str = ""  # node "topology" (slurmrestd v0.0.44, Slurm >= 25.05); "" = not reported
    reason_time: str = ""  # when the reason was set, as Slurm says it ("" = not reported)
    #: Slurm reports per-node topology strings (Slurm >= 25.05): an empty ``topology`` then
    #: means "none set", not "not reported"
    reports_topology: bool = False
    features: frozenset[str] = frozenset()  # the node's (available) features
    gres: str = ""  # Slurm's GRES string, e.g. ``gpu:h100:8`` ("" = none or not reported)

    @property
    def invalid_registration(self) -> bool:
        """Slurm refused the node's registration (INVALID_REG; older Slurm: INVAL...)."""
        return bool(self.flags & {"INVALID_REG", "INVALID", "INVAL"}) or self.base == "INVAL"

    @property
    def drain(self) -> bool:
        return "DRAIN" in self.flags and "UNDRAIN" not in self.flags

    @property
    def busy(self) -> bool:
        return self.base in ("ALLOCATED", "MIXED") or "COMPLETING" in self.flags

    @property
    def drained(self) -> bool:
        return self.drain and not self.busy

    @property
    def down(self) -> bool:
        return self.base == "DOWN"

    @property
    def reason_is_ours(self) -> bool:
        return self.reason.startswith(SLURM_REASON_PREFIX)

    def drained_by_healer(self, incident: str = "") -> bool:
        """Drained with healer's reason (for ``incident``, when given): only such a drain is
        healer's to undo."""
        return self.drain and self.reason_is_ours and (not incident or incident in self.reason)


@dataclass(frozen=True, slots=True)
class SlurmJob:
    id: int
    state: str  # RUNNING, PENDING, COMPLETING, ...
    nodes: tuple[str, ...] = ()
    name: str = ""
    comment: str = ""
    requeue: bool = False


class Undrain(enum.Enum):
    """What :meth:`SlurmDriver.undrain` did."""

    CLEARED = "cleared"  # healer's drain of this incident is gone from Slurm
    NOT_OURS = "not-ours"  # nothing of this incident's to clear (no drain, or someone else's)
    SETTLING = "settling"  # asked for; the backend clears it on its own schedule: ask again


class SlurmDriver(Protocol):
    """One contract, three drivers (slinky, scontrol, slurmrestd).

    ``drain`` sets a reason that must start with ``healer: ``; if the node is already drained
    with a reason healer did not set, the driver keeps that reason and returns False (healer
    then does not own the drain and will never clear it). ``undrain`` clears only a reason that
    starts with ``healer: `` *and* contains ``incident`` (when given); otherwise it does nothing
    and says :attr:`Undrain.NOT_OURS`. A driver whose backend clears the drain later (Slinky:
    the operator, on its next reconcile) says :attr:`Undrain.SETTLING` until Slurm agrees, so
    the caller asks again. ``incident`` is the remediation's id, as data: a driver that needs
    it (Slinky: the cordon's provenance) takes it from here, never from the reason's text.
    ``close`` releases the driver's connections (idempotent; nothing to do for scontrol).
    ``host`` is the Kubernetes node the Slurm node ``node`` runs on, where the caller knows it
    ("": unknown): a driver that acts through that Node (Slinky) then reads only its pods
    instead of looking the Slurm name up among every slurmd pod; ``state`` with ``host``
    reads the Slurm node as that Node sees it (a driver whose Slurm node can leave its Node,
    Slinky, says DOWN there once it has).
    """

    async def drain(self, node: str, reason: str, incident: str = "", *,
                    host: str = "") -> bool: ...

    async def undrain(self, node: str, incident: str = "", *, host: str = "") -> Undrain: ...

    async def close(self) -> None: ...

    async def state(self, node: str, *, host: str = "") -> SlurmNodeState: ...

    async def jobs_on(self, node: str) -> list[SlurmJob]: ...

    async def signal_jobs(self, node: str, signal: str, *, batch_only: bool = False) -> list[int]:
        """Send ``signal`` to every running job on ``node``; return the job ids signalled."""
        ...

    async def requeue_jobs(self, node: str) -> list[int]: ...


class SlurmStates(Protocol):
    """Slurm's view of the whole fleet, for the guardrails (issue 12): every Slurm node's
    state, keyed by the Kubernetes node it runs on. Slurm nodes that run on no Kubernetes
    node are left out. Raises TransientError (or any HealerError) when Slurm cannot be read:
    the runtime then treats Slurm's view as unknown."""

    async def node_states(self) -> Mapping[str, SlurmNodeState]: ...


class SlurmJobHistory(Protocol):
    """A driver that also lists the jobs that ran on a node and ended with it (NODE_FAIL,
    requeued), for a dead node's report; without it, the jobs still running there are
    reported."""

    async def recent_jobs_on(self, node: str) -> list[SlurmJob]: ...


class SlurmHold(Protocol):
    """A driver that can drain a node with someone else's reason, word for word (the
    ``carryOver`` of a swap, docs/adr/0016): a drain healer does not own and never clears."""

    async def hold(self, node: str, reason: str) -> None: ...


class SlurmNodeRecords(Protocol):
    """A driver that can delete a Slurm node's record: what a slurmd pod's preStop does
    (``scontrol delete nodename=``). For a dead node, whose preStop never ran: a dynamic
    slurmd (``slurmd -Z``) that registers again under the same name keeps the old record's
    address (the dead pod's IP), so slurmctld would never reach the replacement."""

    async def delete_node(self, node: str) -> bool: ...  # False: there was no such record


class SlurmNodeLister(Protocol):
    """A driver on Slurm's own API that lists every Slurm node in one read (scontrol,
    slurmrestd), by Slurm name."""

    async def nodes(self) -> list[SlurmNodeState]: ...


class SlurmAPI(SlurmDriver, SlurmJobHistory, SlurmHold, SlurmNodeRecords, Protocol):
    """A driver with every optional capability's method (scontrol, slurmrestd; the slinky
    driver, which forwards them to its job backend): what :func:`slurm_handles` hands out,
    as far as the driver's registry entry says it can."""


@dataclass(frozen=True, slots=True)
class SlurmHandles:
    """A Slurm driver with its optional capabilities as typed handles, built once in the
    composition root from the driver's registry entry (:mod:`healer.core.slurm_drivers`):
    a handle is None exactly when the driver cannot do that. Nothing asks a driver what it
    is; a caller reads the handle."""

    driver: SlurmDriver
    lister: SlurmNodeLister | None = None
    """Every Slurm node by Slurm name in one read (scontrol, slurmrestd)."""
    states: SlurmStates | None = None
    """Every Slurm node's state by Kubernetes node, the driver's own mapping (Slinky)."""
    history: SlurmJobHistory | None = None
    hold: SlurmHold | None = None
    records: SlurmNodeRecords | None = None

    @property
    def lists_nodes(self) -> bool:
        return self.lister is not None or self.states is not None


def slurm_handles(caps: SlurmCapabilities, driver: SlurmAPI, *,
                  lister: SlurmNodeLister | None = None,
                  states: SlurmStates | None = None) -> SlurmHandles:
    """``driver``'s handles for what ``caps`` (its registry entry's capabilities) says it can
    do; ``lister`` or ``states`` is how it lists nodes, where it can."""
    if caps.lists_nodes and lister is None and states is None:
        raise ValueError("a driver that lists nodes needs a lister or its own states")
    return SlurmHandles(driver,
                        lister=lister if caps.lists_nodes else None,
                        states=states if caps.lists_nodes else None,
                        history=driver if caps.job_history else None,
                        hold=driver if caps.holds else None,
                        records=driver if caps.deletes_records else None)


# ---------------------------------------------------------------------------------------------
# Kubernetes nodes, events and the state store


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """A node watch event: ADDED, MODIFIED, DELETED, or SYNCED after a (re-)list."""

    type: str
    node: NodeView | None
    resource_version: str = ""


class NodeAPI(Protocol):
    async def get(self, name: str) -> NodeView: ...

    async def list(self, selector: str = "") -> list[NodeView]: ...

    def watch(self) -> AsyncIterator[NodeEvent]: ...

    async def cordon(self, name: str, incident: str, reason: str) -> bool:
        """Cordon + taint + provenance annotations. False if someone else had cordoned it."""
        ...

    async def uncordon(self, name: str, incident: str) -> bool:
        """Undo only what ``incident`` did: True if healer's cordon was removed."""
        ...

    async def patch_metadata(self, name: str, *, labels: Mapping[str, str | None] | None = None,
                             annotations: Mapping[str, str | None] | None = None,
                             resource_version: str | None = None) -> NodeView:
        """Set (or, with None, remove) labels/annotations; with ``resource_version`` the
        patch fails with ConflictError if the node changed since it was read."""
        ...

    async def taint_out_of_service(self, name: str, incident: str) -> bool:
        """Taint a fenced node ``node.kubernetes.io/out-of-service=nodeshutdown:NoExecute``
        with healer's provenance (``incident``). False when someone else's out-of-service
        taint is already there (kept, never taken over)."""
        ...

    async def clear_out_of_service(self, name: str, incident: str) -> bool:
        """Remove the out-of-service taint only if healer set it for ``incident``; True if it
        was removed. Never someone else's."""
        ...


class EventRecorder(Protocol):
    async def emit(self, *, key: str, node: str, reason: str, note: str, type: str = "Normal",
                   action: str = "", remediation: str = "") -> None:
        """Create an ``events.k8s.io/v1`` Event; the same ``key`` is emitted once."""
        ...


@dataclass(frozen=True, slots=True)
class StoredRecord:
    record: NodeRecord
    name: str  # the NodeRemediation object name
    resource_version: str = ""
    created_at: float = 0.0


class StateStore(Protocol):
    """Where records live (``NodeRemediation`` custom resources in production)."""

    async def list(self) -> list[StoredRecord]:
        """Every record, read from the source of truth (not a cache)."""
        ...

    async def save(self, record: NodeRecord, previous: StoredRecord | None) -> StoredRecord:
        """Create or update; ConflictError if ``previous`` is stale."""
        ...

    async def delete(self, name: str) -> None:
        """Remove a closed record (retention); a missing one is not an error."""
        ...


# ---------------------------------------------------------------------------------------------
# Spares, workload, topology, validation, hooks


@dataclass(frozen=True, slots=True)
class PendingClaim:
    """A claim that waits: the spare it would take is being validated first (``detail`` says
    which spare and which checks); the claim step polls again."""

    detail: str


class SparePool(Protocol):
    async def claim(self, node: str, incident: str, *, same_domain: bool = False,
                    labels: Mapping[str, str] | None = None) -> str | PendingClaim | None:
        """Choose (topology-aware) and atomically claim a spare for ``node``; idempotent per
        incident (a second call returns the same spare). None if no spare fits;
        ``same_domain``: only a spare in ``node``'s NVLink domain fits; a
        :class:`PendingClaim` while the chosen spare is being validated. ``labels``: the
        node's, to choose by when its Node object is gone (a dead node the cloud deleted)."""
        ...

    async def release(self, spare: str, incident: str) -> None: ...

    async def return_to_pool(self, node: str, incident: str) -> None: ...

    async def depth(self) -> Mapping[str, int]:
        """Free spares per pool/domain, for metrics."""
        ...


@dataclass(frozen=True, slots=True)
class HookSpec:
    """What a policy says about a hook (checkpoint or repair)."""

    kind: HookKind
    signal: str = "USR1"
    url: str = ""
    secret_ref: str = ""  # namespace/name[:key] of the HMAC secret (webhook)
    job_template: str = ""  # namespace/name of the ConfigMap holding the Job (job)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, HookKind):
            raise TypeError(f"HookSpec.kind must be a HookKind, not {self.kind!r}")


@dataclass(frozen=True, slots=True)
class HookResult:
    outcome: StepOutcome
    detail: str = ""
    data: Mapping[str, str] = field(default_factory=dict)


class Workload(Protocol):
    """Moves a Slurm node's slurmd to a spare and reports when the replacement serves.

    From a ``dead`` node (fenced, tainted out of service) nothing is evicted: Kubernetes
    removes its pods (the pod garbage collector), and the move only opens the spare for the
    slurmd pod the operator recreates."""

    async def move(self, incident: str, slurm_node: str, source: str, spare: str, *,
                   dead: bool = False, carry: bool = False) -> HookResult:
        """Move ``slurm_node``'s slurmd from ``source`` to ``spare``. Someone else's drain or
        DOWN reason holds it (PENDING, ``held`` data) unless ``carry``: then it moves, and
        says ``carried`` (the reason) in its data."""
        ...

    async def replacement_ready(self, incident: str, slurm_node: str, spare: str) -> HookResult: ...


class Topology(Protocol):
    async def annotate(self, incident: str, node: str, slurm_node: str) -> HookResult: ...


class Validator(Protocol):
    async def validate(self, incident: str, target: str, image: str, command: Sequence[str],
                       purpose: str) -> HookResult: ...


class CheckpointHook(Protocol):
    async def checkpoint(self, incident: str, node: str, slurm_node: str,
                         spec: HookSpec) -> HookResult: ...


class RepairHook(Protocol):
    async def hand_off(self, incident: str, node: str, spec: HookSpec) -> HookResult: ...


@dataclass(frozen=True, slots=True)
class FenceSpec:
    """What a policy says about fencing a dead node."""

    providers: frozenset[FenceProvider]
    url: str = ""  # webhook
    secret_ref: str = ""  # webhook: namespace/name[:key] of its own HMAC key
    deadline: float = 0.0  # when healer stops waiting (seconds since the epoch)


class Fencing(Protocol):
    async def fence(self, incident: str, node: str, spec: FenceSpec) -> HookResult:
        """DONE (data ``provider``, ``by``) once one of the spec's providers says ``node``'s
        machine is off or cut off; PENDING (saying what it waits for) while none does.
        Idempotent per incident: the webhook provider is sent once."""
        ...


# ---------------------------------------------------------------------------------------------
# Telemetry and time

SignalSink = Callable[[Sequence[Signal]], Awaitable[None]]


class TelemetrySource(Protocol):
    """Delivers signals, every poll (an empty delivery too: each one is the source's
    heartbeat on ``/healthz``)."""

    name: str
    poll_interval: float
    """Seconds between deliveries: the source counts as stalled after a few of them."""

    async def run(self, sink: SignalSink) -> None:
        """Produce signals until cancelled (polling or watching)."""
        ...


class Clock(Protocol):
    """healer's one notion of time: ``healer.adapters.clock.SystemClock`` in the daemon,
    ``ManualClock`` in tests. The core never reads it: it is handed ``now`` as data."""

    def now(self) -> float:
        """Wall time, seconds since the epoch."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` of this clock's time."""
        ...
