"""What the node agent publishes about its node: the ``GPUHealthy`` condition and GPU Events.

The pure half decides *what* to write:

* :func:`build_condition` turns an :class:`~healer.agent.findings.Assessment` into the condition
  (status ``True`` when healthy, else ``False`` with the worst finding's reason and a message
  naming each affected GPU's index, UUID and XID, ending in the machine-readable block of
  every GPU's index, UUID and serial, affected ones marked: :mod:`healer.core.gpu_identity`).
  ``lastTransitionTime`` carries over from the previous condition unless the status or the
  reason changed; ``lastHeartbeatTime`` is now.
* :func:`should_write` says when: at once when status, reason or message changed, else when the
  heartbeat is due (``--heartbeat``, :data:`DEFAULT_HEARTBEAT` = 30 s): an unchanged condition
  is re-published with only ``lastHeartbeatTime`` moved, so the controller can tell a live
  agent from a dead one. The controller judges the condition stale once its heartbeat is older
  than the rule's ``staleAfter`` (default 5 heartbeats, 2m30s; keep it above 5 times ``--heartbeat``
  when you raise the heartbeat): unknown, alerting, never disruptive.
* :func:`status_patch` is the strategic-merge patch of the Node's status: ``conditions`` merge by
  ``type``, so the patch touches this one condition and every other (``Ready``...) survives.
* :func:`event_key`, :func:`event_reason`, :func:`event_note`, :func:`event_type`: an Event per
  NVML event (an XID occurrence is ``GPUXid``), idempotent by a key naming the node, the GPU,
  the XID and the event's time; repeats of one GPU's XID (:func:`series_key`) fold into one
  Event's ``series`` on a back-off (:mod:`healer.adapters.kube.events`), and the writes are
  bounded per node (:data:`EVENT_WRITE_BURST`, :data:`EVENT_WRITE_EVERY`).

The I/O half: :class:`ConditionWriter` (read the condition once, patch ``nodes/status``) and
:class:`EventSink` (a bounded queue of Events, flushed through
:class:`~healer.adapters.kube.events.KubeEvents`). Neither ever writes anything else: the agent
never cordons, drains, taints or labels.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from healer.adapters.kube.events import BudgetSpent, KubeEvents
from healer.adapters.kube.lite import LiteClient
from healer.agent.findings import Assessment, EventKind, GpuEvent
from healer.core.gpu_identity import GpuIdentity, with_block
from healer.core.timefmt import parse_rfc3339, rfc3339
from healer.core.vocabulary import AGENT_FIELD_MANAGER, GPU_CONDITION
from healer.core.xid import XidCatalog
from healer.errors import PermanentError

#: Seconds between two writes of an unchanged condition (``healer agent --heartbeat``'s
#: default; the controller's default heartbeat window for ``GPUHealthy`` is 5 of them).
DEFAULT_HEARTBEAT = 30.0

#: Event reasons (``events.k8s.io/v1`` ``reason``), by what NVML reported.
XID_EVENT_REASON = "GPUXid"
_EVENT_REASONS: Mapping[EventKind, str] = {
    EventKind.XID: XID_EVENT_REASON,
    EventKind.GPU_LOST: "GPULost",
    EventKind.GPU_UNAVAILABLE: "GPULost",
    EventKind.DOUBLE_BIT_ECC: "GPUEccError",
    EventKind.SINGLE_BIT_ECC: "GPUEccError",
    EventKind.SINGLE_BIT_ECC_STORM: "GPUEccError",
    EventKind.DRAM_RETIREMENT: "GPUMemoryRetirement",
    EventKind.DRAM_RETIREMENT_FAILURE: "GPUMemoryRetirement",
}
_WARNING_KINDS = frozenset({EventKind.GPU_LOST, EventKind.GPU_UNAVAILABLE,
                            EventKind.DOUBLE_BIT_ECC, EventKind.SINGLE_BIT_ECC_STORM,
                            EventKind.DRAM_RETIREMENT_FAILURE})
#: the ``action`` of the agent's Events
EVENT_ACTION = "Detected"


# ---------------------------------------------------------------------------------------------
# time in the API's format


# ---------------------------------------------------------------------------------------------
# the condition


@dataclass(frozen=True, slots=True)
class Condition:
    """The ``GPUHealthy`` node condition. Times are seconds since the epoch (whole seconds
    once they have been through the API)."""

    status: str
    reason: str
    message: str
    heartbeat: float
    transition: float
    type: str = GPU_CONDITION

    def same_state(self, other: Condition | None) -> bool:
        """Same status and reason (what decides ``lastTransitionTime``)."""
        return other is not None and (self.status, self.reason) == (other.status, other.reason)

    def same_content(self, other: Condition | None) -> bool:
        """Same status, reason and message (times aside)."""
        return self.same_state(other) and other is not None and self.message == other.message

    def to_api(self) -> dict[str, Any]:
        return {"type": self.type, "status": self.status, "reason": self.reason,
                "message": self.message, "lastHeartbeatTime": rfc3339(self.heartbeat),
                "lastTransitionTime": rfc3339(self.transition)}

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> Condition | None:
        """A condition as the API serves it; None if it is not a well-formed GPUHealthy."""
        if raw.get("type") != GPU_CONDITION:
            return None
        transition = parse_rfc3339(raw.get("lastTransitionTime"))
        heartbeat = parse_rfc3339(raw.get("lastHeartbeatTime"))
        if transition is None:
            return None
        return cls(status=str(raw.get("status") or ""), reason=str(raw.get("reason") or ""),
                   message=str(raw.get("message") or ""),
                   heartbeat=transition if heartbeat is None else heartbeat,
                   transition=transition)


def find_condition(node: Mapping[str, Any]) -> Condition | None:
    """The GPUHealthy condition of a Node dict (None when it has none)."""
    for raw in (node.get("status") or {}).get("conditions") or []:
        if isinstance(raw, Mapping) and raw.get("type") == GPU_CONDITION:
            return Condition.from_api(raw)
    return None


def build_condition(assessment: Assessment, previous: Condition | None,
                    now: float) -> Condition:
    """The condition for ``assessment`` at ``now``.

    ``lastTransitionTime`` is the previous one's when status and reason are unchanged (a new
    message alone is no transition), else ``now``; ``lastHeartbeatTime`` is always ``now``.
    """
    status, reason = assessment.status, assessment.reason.value
    message = condition_message(assessment)
    cond = Condition(status=status, reason=reason, message=message, heartbeat=now,
                     transition=now)
    if previous is not None and cond.same_state(previous):
        cond = Condition(status=status, reason=reason, message=message,
                         heartbeat=now, transition=previous.transition)
    return cond


def condition_message(assessment: Assessment) -> str:
    """The assessment's message, then the machine-readable block naming every GPU read (index,
    UUID, serial; those with a finding marked): :mod:`healer.core.gpu_identity`."""
    if not assessment.gpus:
        return assessment.message
    return with_block(assessment.message,
                      (GpuIdentity(g.gpu, affected=not g.healthy) for g in assessment.gpus))


def should_write(cond: Condition, last: Condition | None, heartbeat: float) -> bool:
    """Write now: nothing written yet, the content changed, or the heartbeat is due."""
    if last is None or not cond.same_content(last):
        return True
    return cond.heartbeat - last.heartbeat >= heartbeat


def next_write_in(last: Condition | None, heartbeat: float, now: float) -> float:
    """Seconds until the heartbeat is due (0 when nothing was written yet)."""
    if last is None:
        return 0.0
    return max(0.0, last.heartbeat + heartbeat - now)


def status_patch(cond: Condition) -> dict[str, Any]:
    """The strategic-merge patch of the Node's status that sets this one condition."""
    return {"status": {"conditions": [cond.to_api()]}}


# ---------------------------------------------------------------------------------------------
# Events


def event_key(node: str, ev: GpuEvent) -> str:
    """The idempotency key of the Event for ``ev``: node, GPU, XID (or kind) and event time.

    The same NVML event emitted twice (a retry after an API outage) is the same Event.
    """
    gpu = ev.uuid or f"index-{ev.index}"
    what = f"xid-{ev.xid}" if ev.kind is EventKind.XID else ev.kind.value
    return f"agent/{node}/{gpu}/{what}/{round(ev.at * 1e6)}"


def series_key(node: str, ev: GpuEvent) -> str:
    """What a repeat of ``ev`` is the same as: the node, the GPU and the XID (or kind). A
    crash loop's XIDs on one GPU fold into one Event's ``series``."""
    gpu = ev.uuid or f"index-{ev.index}"
    what = f"xid-{ev.xid}" if ev.kind is EventKind.XID else ev.kind.value
    return f"agent/{node}/{gpu}/{what}"


#: The agent's bound on its Event writes per node (creates and series updates together):
#: this many at once, then one more every :data:`EVENT_WRITE_EVERY` seconds. Beyond it,
#: occurrences are still counted (metrics, the series' count) and the Events wait.
EVENT_WRITE_BURST = 20
EVENT_WRITE_EVERY = 30.0


def event_reason(ev: GpuEvent) -> str:
    return _EVENT_REASONS.get(ev.kind, "GPUEvent")


def event_type(ev: GpuEvent, catalog: XidCatalog) -> str:
    """``Warning`` for a node fault (an XID the catalog gives a severity, a lost GPU...)."""
    if ev.kind is EventKind.XID:
        entry = None if ev.xid is None else catalog.get(ev.xid)
        return "Warning" if entry is not None and entry.severity is not None else "Normal"
    return "Warning" if ev.kind in _WARNING_KINDS else "Normal"


def _gpu_name(ev: GpuEvent) -> str:
    index = ev.index if ev.index >= 0 else "?"
    serial = f" (serial {ev.serial})" if ev.serial else ""
    return f"GPU {index} {ev.uuid or 'uuid-unknown'}{serial}"


def event_note(ev: GpuEvent, catalog: XidCatalog) -> str:
    """``XID 79 GPU_HAS_FALLEN_OFF_THE_BUS on GPU 2 GPU-... at ...: <meaning> [failed]``."""
    when = rfc3339(ev.at, micros=True)
    if ev.kind is EventKind.XID:
        entry = None if ev.xid is None else catalog.get(ev.xid)
        if entry is None:
            return f"XID {ev.xid} (not in healer's XID catalog) on {_gpu_name(ev)} at {when}"
        sev = "not a node fault" if entry.severity is None else entry.severity.label
        return (f"XID {ev.xid} {entry.mnemonic} on {_gpu_name(ev)} at {when}: "
                f"{entry.meaning} [{sev}; NVIDIA: {entry.action.value}]")
    return f"NVML {ev.kind.value} event (type {ev.event_type:#x}) on {_gpu_name(ev)} at {when}"


# ---------------------------------------------------------------------------------------------
# I/O


class ConditionWriter:
    """Reads and writes this node's GPUHealthy condition (``get nodes``, ``patch
    nodes/status``). Errors are healer's own (TransientError when the API server is away)."""

    def __init__(self, api: LiteClient, node: str, *, attempts: int = 2) -> None:
        self.api = api
        self.node = node
        self.attempts = attempts

    async def current(self) -> Condition | None:
        """The condition the node carries now (to keep its transition time across restarts)."""
        obj = await self.api.request("GET", f"/api/v1/nodes/{self.node}",
                                     what=f"get node {self.node}", attempts=self.attempts)
        return find_condition(obj)

    async def write(self, cond: Condition) -> None:
        await self.api.request(
            "PATCH", f"/api/v1/nodes/{self.node}/status?fieldManager={AGENT_FIELD_MANAGER}",
            status_patch(cond), content_type="application/strategic-merge-patch+json",
            what=f"patch node {self.node} status {cond.type}", attempts=self.attempts)


@dataclass(frozen=True, slots=True)
class EmitOutcome:
    emitted: int = 0
    dropped: int = 0


class EventSink:
    """Events about NVML events, queued (bounded) and flushed in order through KubeEvents.

    A flush stops at the first transient failure (the event stays queued for the next flush);
    an event the API refuses for good (403, 422) is dropped and reported to ``on_drop``.
    """

    def __init__(self, events: KubeEvents, node: str, catalog: XidCatalog, *,
                 max_pending: int = 1000) -> None:
        self.events = events
        self.node = node
        self.catalog = catalog
        self.pending: collections.deque[GpuEvent] = collections.deque(maxlen=max_pending)
        self.overflowed = 0
        #: called with each event emitted (and its reason), and each dropped (and why)
        self.on_emit: Callable[[GpuEvent, str], None] | None = None
        self.on_drop: Callable[[GpuEvent, str], None] | None = None

    def add(self, ev: GpuEvent) -> None:
        if len(self.pending) == self.pending.maxlen:
            self.overflowed += 1
            if self.on_drop is not None:
                self.on_drop(self.pending[0], "queue full")
        self.pending.append(ev)

    async def flush(self) -> EmitOutcome:
        emitted = dropped = 0
        while self.pending:
            ev = self.pending[0]
            try:
                await self.events.emit(key=event_key(self.node, ev), node=self.node,
                                       reason=event_reason(ev), note=event_note(ev, self.catalog),
                                       type=event_type(ev, self.catalog), action=EVENT_ACTION,
                                       series=series_key(self.node, ev))
            except BudgetSpent:
                break  # the per-node bound: this one and the rest wait (still counted)
            except PermanentError as e:
                self.pending.popleft()
                dropped += 1
                if self.on_drop is not None:
                    self.on_drop(ev, str(e))
                continue
            self.pending.popleft()
            emitted += 1
            if self.on_emit is not None:
                self.on_emit(ev, event_reason(ev))
        try:
            await self.events.flush_series()
        except PermanentError as e:  # refused for good: the series' later counts are lost
            if self.on_drop is not None and self.pending:
                self.on_drop(self.pending[0], f"series update: {e}")
        return EmitOutcome(emitted, dropped)

    def next_flush_in(self) -> float | None:
        """Seconds until a series update is due (None: none pending)."""
        return self.events.next_series_due()
