"""What the node agent reads from NVML, and the pure classification of it into findings.

The first half is the data the agent produces (:class:`GpuReading` from polling counters,
:class:`GpuEvent` from NVML's event set); :mod:`healer.agent.nvml` fills it in, tests build it
by hand. The second half, :func:`assess`, turns readings and recent events into one
:class:`Assessment` per node: a finding per affected GPU, the node's worst finding, and the
``status``/``reason``/``message`` of the ``GPUHealthy`` node condition.

Nothing here does I/O or reads a clock: ``now`` is passed in. XID severities come from the
XID catalog (:mod:`healer.policy.catalog`); no XID code is named in this module.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from healer.core.model import GpuRef, Severity
from healer.core.vocabulary import GPU_CONDITION
from healer.core.xid import XidCatalog

#: NVLink error counters read per link (NVML_NVLINK_ERROR_DL_*), in NVML's order.
NVLINK_KINDS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")

#: Clocks-event (throttle) reasons that mean the GPU is slowing itself down for heat.
THERMAL_REASONS = frozenset({"HwThermalSlowdown", "SwThermalSlowdown"})


# ---------------------------------------------------------------------------------------------
# What the agent reads


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU's identity as NVML enumerates it. Unknown strings are empty."""

    index: int
    uuid: str = ""
    serial: str = ""
    pci_bus_id: str = ""
    name: str = ""

    def ref(self) -> GpuRef:
        return GpuRef(index=self.index, uuid=self.uuid, serial=self.serial)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "serial": self.serial,
                "pciBusId": self.pci_bus_id, "name": self.name}


@dataclass(frozen=True, slots=True)
class EccCounts:
    """Total ECC error counts; ``None`` where NVML does not report them (ECC off, unsupported)."""

    volatile_corrected: int | None = None
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None
    aggregate_uncorrected: int | None = None


@dataclass(frozen=True, slots=True)
class RetiredPages:
    """Dynamic page retirement (pre-Ampere): pages retired per cause, and a pending retirement."""

    multiple_single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """Row remapping (Ampere and newer)."""

    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True, slots=True)
class NvlinkCounters:
    """NVLink error counters summed per kind over the active links (``None``: not reported)."""

    active_links: int
    replay: int | None = None
    recovery: int | None = None
    crc_flit: int | None = None
    crc_data: int | None = None
    ecc_data: int | None = None

    def by_kind(self) -> dict[str, int]:
        """The reported kinds, in :data:`NVLINK_KINDS` order."""
        values = (self.replay, self.recovery, self.crc_flit, self.crc_data, self.ecc_data)
        return {k: v for k, v in zip(NVLINK_KINDS, values, strict=True) if v is not None}


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU's counters at one instant. ``None`` = not available on this GPU (NOT_SUPPORTED).

    ``lost`` is set when NVML answered ``NVML_ERROR_GPU_IS_LOST``; the counters are then absent.
    ``errors`` lists the calls that failed for another reason (the values are unknown, which is
    not the same as bad).
    """

    gpu: GpuInfo
    at: float
    lost: bool = False
    ecc: EccCounts = field(default_factory=EccCounts)
    retired_pages: RetiredPages | None = None
    remapped_rows: RemappedRows | None = None
    nvlink: NvlinkCounters | None = None
    pcie_replays: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    clocks_event_reasons: frozenset[str] | None = None
    errors: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        def plain(obj: Any) -> Any:
            if obj is None:
                return None
            return {k: getattr(obj, k) for k in obj.__slots__}

        return {
            "gpu": self.gpu.to_dict(),
            "at": self.at,
            "lost": self.lost,
            "ecc": plain(self.ecc),
            "retiredPages": plain(self.retired_pages),
            "remappedRows": plain(self.remapped_rows),
            "nvlink": plain(self.nvlink),
            "pcieReplays": self.pcie_replays,
            "temperatureC": self.temperature_c,
            "powerW": self.power_w,
            "clocksEventReasons": (None if self.clocks_event_reasons is None
                                   else sorted(self.clocks_event_reasons)),
            "errors": list(self.errors),
        }


class EventKind(enum.StrEnum):
    """What an NVML event reports (from its ``eventType`` bit)."""

    XID = "xid"
    SINGLE_BIT_ECC = "single-bit-ecc"
    DOUBLE_BIT_ECC = "double-bit-ecc"
    SINGLE_BIT_ECC_STORM = "single-bit-ecc-storm"
    DRAM_RETIREMENT = "dram-retirement"
    DRAM_RETIREMENT_FAILURE = "dram-retirement-failure"
    GPU_UNAVAILABLE = "gpu-unavailable"
    #: not an NVML event type: nvmlEventSetWait answered NVML_ERROR_GPU_IS_LOST for this GPU
    GPU_LOST = "gpu-lost"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """One event from NVML's event set, as delivered to the watcher's callback.

    ``index``/``uuid`` name the GPU (-1/"" when NVML could not say which); ``xid`` is the XID
    code for XID events (``eventData``), else ``None``; ``at`` is when the agent received it.
    """

    index: int
    uuid: str
    kind: EventKind
    event_type: int
    at: float
    xid: int | None = None
    data: int = 0
    serial: str = ""

    def ref(self) -> GpuRef:
        return GpuRef(index=self.index, uuid=self.uuid, serial=self.serial)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "serial": self.serial,
                "kind": self.kind.value, "eventType": self.event_type, "xid": self.xid,
                "data": self.data, "at": self.at}


# ---------------------------------------------------------------------------------------------
# Findings


class Reason(enum.StrEnum):
    """The ``reason`` of the GPUHealthy condition. Declared worst first."""

    GPU_LOST = "GpuLost"
    XID_FATAL = "XidFatal"
    ECC_UNCORRECTABLE = "EccUncorrectable"
    ROW_REMAP_FAILURE = "RowRemapFailure"
    XID_DEGRADING = "XidDegrading"
    ROW_REMAP_PENDING = "RowRemapPending"
    ECC_CORRECTABLE_STORM = "EccCorrectableStorm"
    NVLINK_ERRORS = "NvlinkErrors"
    PCIE_REPLAYS = "PcieReplays"
    THERMAL_THROTTLE = "ThermalThrottle"
    HEALTHY = "Healthy"

    @property
    def severity(self) -> Severity | None:
        return _SEVERITY.get(self)

    @property
    def rank(self) -> int:
        """0 for the worst reason; :attr:`HEALTHY` ranks last."""
        return _RANK[self]


_SEVERITY: Mapping[Reason, Severity] = {
    Reason.GPU_LOST: Severity.FAILED,
    Reason.XID_FATAL: Severity.FAILED,
    Reason.ECC_UNCORRECTABLE: Severity.FAILED,
    Reason.ROW_REMAP_FAILURE: Severity.FAILED,
    Reason.XID_DEGRADING: Severity.DEGRADING,
    Reason.ROW_REMAP_PENDING: Severity.DEGRADING,
    Reason.ECC_CORRECTABLE_STORM: Severity.DEGRADING,
    Reason.NVLINK_ERRORS: Severity.DEGRADING,
    Reason.PCIE_REPLAYS: Severity.DEGRADING,
    Reason.THERMAL_THROTTLE: Severity.DEGRADING,
}
_RANK: Mapping[Reason, int] = {r: i for i, r in enumerate(Reason)}

_EVENT_REASONS: Mapping[EventKind, tuple[Reason, str]] = {
    EventKind.GPU_LOST: (Reason.GPU_LOST, "GPU is lost (NVML_ERROR_GPU_IS_LOST)"),
    EventKind.GPU_UNAVAILABLE: (Reason.GPU_LOST, "GPU unavailable (NVML event)"),
    EventKind.DOUBLE_BIT_ECC: (Reason.ECC_UNCORRECTABLE, "double-bit ECC error (NVML event)"),
    EventKind.DRAM_RETIREMENT_FAILURE: (Reason.ROW_REMAP_FAILURE,
                                        "row remap/page retirement failed (NVML event)"),
    EventKind.SINGLE_BIT_ECC_STORM: (Reason.ECC_CORRECTABLE_STORM,
                                     "single-bit ECC error storm (NVML event)"),
}


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Limits above which a counter becomes a finding. Counters are totals since driver load.

    ``event_window_s``: events older than this (relative to ``now``) no longer count.
    ``message_max_chars``: the condition message is cut to this length (Events allow 1024).
    """

    ecc_corrected_max: int = 1000
    nvlink_errors_max: int = 100
    pcie_replays_max: int = 100
    event_window_s: float = 3600.0
    message_max_chars: int = 1024

    def __post_init__(self) -> None:
        for name in ("ecc_corrected_max", "nvlink_errors_max", "pcie_replays_max",
                     "event_window_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"Thresholds.{name} must be >= 0")
        if self.message_max_chars < 80:
            raise ValueError("Thresholds.message_max_chars must be >= 80")


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong with one GPU. ``detail`` says what, for the condition message."""

    reason: Reason
    gpu: GpuRef
    detail: str
    xid: int | None = None
    count: int = 1

    @property
    def severity(self) -> Severity | None:
        return self.reason.severity

    def to_dict(self) -> dict[str, Any]:
        sev = self.severity
        return {"reason": self.reason.value, "severity": None if sev is None else sev.label,
                "gpu": self.gpu.to_dict(), "detail": self.detail, "xid": self.xid,
                "count": self.count}


@dataclass(frozen=True, slots=True)
class GpuAssessment:
    """The findings for one GPU, worst first (empty: healthy)."""

    gpu: GpuRef
    findings: tuple[Finding, ...] = ()

    @property
    def worst(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    @property
    def reason(self) -> Reason:
        return self.findings[0].reason if self.findings else Reason.HEALTHY

    @property
    def healthy(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu.to_dict(), "reason": self.reason.value,
                "findings": [f.to_dict() for f in self.findings]}


@dataclass(frozen=True, slots=True)
class Assessment:
    """A node's GPU health at one instant: what the GPUHealthy condition says."""

    at: float
    gpus: tuple[GpuAssessment, ...]
    worst: Finding | None
    message: str

    @property
    def reason(self) -> Reason:
        return Reason.HEALTHY if self.worst is None else self.worst.reason

    @property
    def severity(self) -> Severity | None:
        return None if self.worst is None else self.worst.severity

    @property
    def healthy(self) -> bool:
        return self.worst is None

    @property
    def status(self) -> str:
        """The condition status: ``"True"`` when healthy, ``"False"`` otherwise."""
        return "True" if self.worst is None else "False"

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for g in self.gpus for f in g.findings)

    def gpu(self, index: int) -> GpuAssessment | None:
        for g in self.gpus:
            if g.gpu.index == index:
                return g
        return None

    def to_dict(self) -> dict[str, Any]:
        sev = self.severity
        return {"type": GPU_CONDITION, "status": self.status, "reason": self.reason.value,
                "severity": None if sev is None else sev.label, "message": self.message,
                "at": self.at, "gpus": [g.to_dict() for g in self.gpus]}


def _reading_findings(r: GpuReading, th: Thresholds) -> list[Finding]:
    ref = r.gpu.ref()
    if r.lost:
        return [Finding(Reason.GPU_LOST, ref, "GPU is lost (NVML_ERROR_GPU_IS_LOST)")]
    out: list[Finding] = []

    def add(reason: Reason, detail: str) -> None:
        out.append(Finding(reason, ref, detail))

    ecc = r.ecc
    if ecc.volatile_uncorrected:
        add(Reason.ECC_UNCORRECTABLE,
            f"{ecc.volatile_uncorrected} uncorrectable ECC errors since the driver loaded")
    rows = r.remapped_rows
    if rows is not None and rows.failure:
        add(Reason.ROW_REMAP_FAILURE, "row remapping failed")
    if rows is not None and rows.pending:
        add(Reason.ROW_REMAP_PENDING, "row remap pending (a GPU reset applies it)")
    pages = r.retired_pages
    if pages is not None and pages.pending:
        add(Reason.ROW_REMAP_PENDING, "page retirement pending (a GPU reset applies it)")
    if ecc.volatile_corrected is not None and ecc.volatile_corrected > th.ecc_corrected_max:
        add(Reason.ECC_CORRECTABLE_STORM,
            f"{ecc.volatile_corrected} corrected ECC errors (> {th.ecc_corrected_max})")
    if r.nvlink is not None:
        over = {k: v for k, v in r.nvlink.by_kind().items() if v > th.nvlink_errors_max}
        if over:
            counts = " ".join(f"{k}={v}" for k, v in over.items())
            add(Reason.NVLINK_ERRORS, f"NVLink errors {counts} (> {th.nvlink_errors_max})")
    if r.pcie_replays is not None and r.pcie_replays > th.pcie_replays_max:
        add(Reason.PCIE_REPLAYS, f"{r.pcie_replays} PCIe replays (> {th.pcie_replays_max})")
    thermal = sorted((r.clocks_event_reasons or frozenset()) & THERMAL_REASONS)
    if thermal:
        temp = "" if r.temperature_c is None else f" at {r.temperature_c} C"
        add(Reason.THERMAL_THROTTLE, f"thermal slowdown {'+'.join(thermal)}{temp}")
    return out


def _event_finding(ev: GpuEvent, ref: GpuRef, catalog: XidCatalog) -> Finding | None:
    if ev.kind is EventKind.XID:
        if ev.xid is None:
            return None
        entry = catalog.get(ev.xid)
        if entry is None or entry.severity is None:
            return None  # not a node fault (application, informational) or unknown to us
        reason = Reason.XID_FATAL if entry.severity is Severity.FAILED else Reason.XID_DEGRADING
        return Finding(reason, ref, f"XID {ev.xid} {entry.mnemonic}", xid=ev.xid)
    other = _EVENT_REASONS.get(ev.kind)
    if other is None:
        return None
    return Finding(other[0], ref, other[1])


def _merge(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """One finding per (reason, xid), worst first.

    Repeats of one XID add up (``count``, shown as ``x2``); other findings with the same reason
    (a lost reading and a lost event, say) keep each distinct detail once.
    """
    groups: dict[tuple[Reason, int | None], list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.reason, f.xid), []).append(f)
    merged: list[Finding] = []
    for (reason, code), group in groups.items():
        count = sum(f.count for f in group)
        detail = ", ".join(dict.fromkeys(f.detail for f in group))
        if code is not None and count > 1:
            detail = f"{detail} x{count}"
        merged.append(Finding(reason, group[0].gpu, detail, code, count))
    return tuple(sorted(merged, key=lambda f: (f.reason.rank, f.xid or 0)))


def _gpu_line(g: GpuAssessment) -> str:
    ref = g.gpu
    who = f"GPU {ref.index if ref.index >= 0 else '?'} {ref.uuid or 'uuid-unknown'}"
    return f"{who}: " + ", ".join(f.detail for f in g.findings)


def _cap(parts: list[str], limit: int) -> str:
    """Join the per-GPU parts; drop trailing GPUs (saying how many) to stay within ``limit``."""
    text = "; ".join(parts)
    if len(text) <= limit:
        return text
    for n in range(len(parts) - 1, 0, -1):
        text = "; ".join(parts[:n]) + f"; (+{len(parts) - n} more GPUs)"
        if len(text) <= limit:
            return text
    suffix = f" (+{len(parts) - 1} more GPUs)" if len(parts) > 1 else ""
    return parts[0][: limit - len(suffix) - 1] + "…" + suffix


def assess(readings: Iterable[GpuReading], events: Iterable[GpuEvent], catalog: XidCatalog,
           thresholds: Thresholds, now: float) -> Assessment:
    """Classify one node's GPUs.

    ``readings`` are the latest counters per GPU; ``events`` the events the watcher delivered
    (those older than ``thresholds.event_window_s`` before ``now`` are ignored). Events are
    matched to readings by UUID, else by index; an event for a GPU with no reading still counts.
    """
    order: list[str] = []
    refs: dict[str, GpuRef] = {}
    found: dict[str, list[Finding]] = {}

    def key_of(index: int, uuid: str) -> str:
        if uuid and f"uuid:{uuid}" in refs:
            return f"uuid:{uuid}"
        if index >= 0:
            for k, ref in refs.items():
                if ref.index == index and not (ref.uuid and uuid):
                    return k
        return f"uuid:{uuid}" if uuid else f"index:{index}"

    def slot(key: str, ref: GpuRef) -> list[Finding]:
        if key not in refs:
            refs[key] = ref
            order.append(key)
            found[key] = []
        return found[key]

    for r in readings:
        key = key_of(r.gpu.index, r.gpu.uuid)
        slot(key, r.gpu.ref()).extend(_reading_findings(r, thresholds))

    cutoff = now - thresholds.event_window_s
    for ev in events:
        if ev.at < cutoff:
            continue
        key = key_of(ev.index, ev.uuid)
        ref = refs.get(key, ev.ref())
        finding = _event_finding(ev, ref, catalog)
        bucket = slot(key, ref)
        if finding is not None:
            bucket.append(finding)

    gpus = tuple(sorted((GpuAssessment(refs[k], _merge(found[k])) for k in order),
                        key=lambda g: (g.gpu.index, g.gpu.uuid)))
    affected = sorted((g for g in gpus if g.findings),
                      key=lambda g: (g.reason.rank, g.gpu.index, g.gpu.uuid))
    worst = affected[0].worst if affected else None
    if affected:
        message = _cap([_gpu_line(g) for g in affected], thresholds.message_max_chars)
    elif gpus:
        message = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} healthy"
    else:
        message = "no GPUs found"
    return Assessment(at=now, gpus=gpus, worst=worst, message=message)
