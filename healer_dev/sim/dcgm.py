"""A DCGM-exporter **simulator**: dcgm-exporter's metric names and labels, with scripted faults.

This is not dcgm-exporter. It serves ``/metrics`` in the Prometheus text format the way
dcgm-exporter 4.x does (one exporter per node, every series labelled ``gpu``, ``UUID``,
``pci_bus_id``, ``device``, ``modelName``, the host label and ``DCGM_FI_DRIVER_VERSION``, plus
``hpc_job`` when a GPU is mapped to Slurm jobs) so that a real Prometheus can scrape a fake GPU
fleet and the telemetry adapters can be tested end to end without a GPU.

The model is a pure function of the fault list and the time:

* :class:`DcgmSim` holds the fleet (:class:`NodeSpec`) and the faults (:class:`Fault`); it reads
  time only through the ``clock`` it was given, so a fake clock makes every render exact.
  :meth:`DcgmSim.render` is the ``/metrics`` body of one node at one instant.
* Counters only grow: a growth fault adds ``count`` at its start and ``rate`` per second while it
  is active, and the counter keeps its value after the fault ends (clearing a fault freezes the
  counter, like the real device). Gauge faults (row-remap pending/failure, temperature) hold only
  while active.
* XIDs follow dcgm-exporter: ``DCGM_FI_DEV_XID_ERRORS`` holds the **last** XID only (with the
  ``err_code``/``err_msg`` labels, so its series changes when the code changes) and keeps it
  after the fault; ``DCGM_EXP_XID_ERRORS_COUNT{xid=...}`` counts occurrences per XID within a
  sliding window (``window_size_in_ms``), and a GPU with none in the window has one series
  without ``xid`` valued 0.
* A GPU that disappears loses all of its series; an exporter that goes away answers HTTP 503 or
  refuses connections (its listening socket is closed) and comes back on the same port.

Faults are injected through the Python API (:meth:`DcgmSim.inject` and the helpers such as
:meth:`DcgmSim.xid`) or over HTTP (:mod:`healer_dev.sim.dcgm_server`, which serves this model).
"""

from __future__ import annotations

import enum
import hashlib
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from healer.policy.catalog import default_catalog

Clock = Callable[[], float]

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_DRIVER = "535.129.03"
DEFAULT_XID_WINDOW = 300.0  # dcgm-exporter --xid-count-window-size default (300000 ms)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: H100 SXM bus numbers of the 8 GPUs in a DGX/HGX chassis (more GPUs continue from 0xe0).
_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")

# NVML clock event reasons (nvmlClocksEventReason*)
CLOCKS_GPU_IDLE = 0x1
CLOCKS_SW_POWER_CAP = 0x4
CLOCKS_SW_THERMAL = 0x20
CLOCKS_HW_THERMAL = 0x40
CLOCKS_HW_POWER_BRAKE = 0x80


class M:
    """The dcgm-exporter metric names the simulator serves."""

    GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
    POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
    GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
    XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
    ECC_SBE_VOL = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
    ECC_DBE_VOL = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
    ECC_SBE_AGG = "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"
    ECC_DBE_AGG = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"
    RETIRED_SBE = "DCGM_FI_DEV_RETIRED_SBE"
    RETIRED_DBE = "DCGM_FI_DEV_RETIRED_DBE"
    RETIRED_PENDING = "DCGM_FI_DEV_RETIRED_PENDING"
    CORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
    UNCORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
    ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
    ROW_REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
    NVLINK_CRC_FLIT = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
    NVLINK_CRC_DATA = "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"
    NVLINK_REPLAY = "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"
    NVLINK_RECOVERY = "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"
    PCIE_REPLAY = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
    THERMAL_VIOLATION = "DCGM_FI_DEV_THERMAL_VIOLATION"
    POWER_VIOLATION = "DCGM_FI_DEV_POWER_VIOLATION"
    CLOCKS_EVENT_REASONS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
    XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"


#: (name, Prometheus type, help), in the order they are rendered.
METRICS: tuple[tuple[str, str, str], ...] = (
    (M.GPU_TEMP, "gauge", "GPU temperature (in C)."),
    (M.POWER_USAGE, "gauge", "Power draw (in W)."),
    (M.GPU_UTIL, "gauge", "GPU utilization (in %)."),
    (M.XID_ERRORS, "gauge", "Value of the last XID error encountered."),
    (M.ECC_SBE_VOL, "counter", "Total number of single-bit volatile ECC errors."),
    (M.ECC_DBE_VOL, "counter", "Total number of double-bit volatile ECC errors."),
    (M.ECC_SBE_AGG, "counter", "Total number of single-bit persistent ECC errors."),
    (M.ECC_DBE_AGG, "counter", "Total number of double-bit persistent ECC errors."),
    (M.RETIRED_SBE, "counter", "Total number of retired pages due to single-bit errors."),
    (M.RETIRED_DBE, "counter", "Total number of retired pages due to double-bit errors."),
    (M.RETIRED_PENDING, "counter", "Total number of pages pending retirement."),
    (M.CORRECTABLE_REMAPPED_ROWS, "counter", "Number of remapped rows for correctable errors."),
    (M.UNCORRECTABLE_REMAPPED_ROWS, "counter",
     "Number of remapped rows for uncorrectable errors."),
    (M.ROW_REMAP_FAILURE, "gauge", "Whether remapping of rows has failed."),
    (M.ROW_REMAP_PENDING, "gauge", "Whether remapping of rows is pending."),
    (M.NVLINK_CRC_FLIT, "counter", "Total number of NVLink flow-control CRC errors."),
    (M.NVLINK_CRC_DATA, "counter", "Total number of NVLink data CRC errors."),
    (M.NVLINK_REPLAY, "counter", "Total number of NVLink retries."),
    (M.NVLINK_RECOVERY, "counter", "Total number of NVLink recovery errors."),
    (M.PCIE_REPLAY, "counter", "Total number of PCIe retries."),
    (M.THERMAL_VIOLATION, "counter", "Throttling duration due to thermal constraints (in ns)."),
    (M.POWER_VIOLATION, "counter", "Throttling duration due to power constraints (in ns)."),
    (M.CLOCKS_EVENT_REASONS, "gauge", "Current clock event reasons (bitmask)."),
    (M.XID_COUNT, "gauge", "Count of XID errors within the configured time window."),
)
METRIC_NAMES = frozenset(name for name, _, _ in METRICS)


# ---------------------------------------------------------------------------------------------
# The fleet


@dataclass(frozen=True, slots=True)
class GpuSpec:
    index: int
    uuid: str
    pci_bus_id: str
    model: str = DEFAULT_MODEL
    serial: str = ""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One simulated node and its exporter's configuration.

    ``host_label`` is ``Hostname`` (released dcgm-exporter) or ``hostname`` (newer builds);
    ``hpc_jobs`` maps a GPU index to the Slurm job ids of its ``hpc_job`` label (one copy of
    every series per job, like the exporter's HPC job mapping); ``xid_count`` enables the
    ``DCGM_EXP_XID_ERRORS_COUNT`` series; ``serial_label`` adds ``DCGM_FI_DEV_SERIAL`` as a
    label-type field.
    """

    name: str
    gpus: tuple[GpuSpec, ...]
    host_label: str = "Hostname"
    driver_version: str = DEFAULT_DRIVER
    hpc_jobs: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    xid_count: bool = True
    xid_window: float = DEFAULT_XID_WINDOW
    serial_label: bool = False

    def gpu(self, index: int) -> GpuSpec:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(f"{self.name} has no GPU {index}")


def gpu_uuid(node: str, index: int) -> str:
    """A deterministic GPU UUID (``GPU-`` + a UUID derived from the node name and index)."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{index}.healer-sim"))


def make_node(name: str, gpus: int = 8, *, host_label: str = "Hostname",
              model: str = DEFAULT_MODEL, driver_version: str = DEFAULT_DRIVER,
              hpc_jobs: Mapping[int, Sequence[str]] | None = None, xid_count: bool = True,
              xid_window: float = DEFAULT_XID_WINDOW, serial_label: bool = False) -> NodeSpec:
    """A node with ``gpus`` GPUs, deterministic UUIDs, PCI bus ids and serials."""
    if host_label not in ("Hostname", "hostname"):
        raise ValueError(f"host_label must be Hostname or hostname, not {host_label!r}")
    specs = []
    for i in range(gpus):
        bus = _BUSES[i] if i < len(_BUSES) else f"{0xE0 + i - len(_BUSES):02x}"
        digest = hashlib.sha256(f"{name}/{i}".encode()).hexdigest()
        serial = str(int(digest[:12], 16) % 10**13).rjust(13, "1")
        specs.append(GpuSpec(i, gpu_uuid(name, i), f"00000000:{bus}:00.0", model, serial))
    jobs = {int(k): tuple(str(j) for j in v) for k, v in (hpc_jobs or {}).items()}
    return NodeSpec(name, tuple(specs), host_label, driver_version, jobs, xid_count, xid_window,
                    serial_label)


def make_fleet(count: int, gpus: int = 8, *, prefix: str = "gpu-",
               host_label: str = "Hostname") -> list[NodeSpec]:
    """``count`` nodes named ``{prefix}0`` ... with ``gpus`` GPUs each."""
    return [make_node(f"{prefix}{i}", gpus, host_label=host_label) for i in range(count)]


# ---------------------------------------------------------------------------------------------
# Faults


class FaultKind(enum.Enum):
    XID = "xid"  # code, count occurrences spaced by interval
    ECC_SBE = "ecc_sbe"  # single-bit ECC errors: count at start + rate/s
    ECC_DBE = "ecc_dbe"  # double-bit ECC errors (also uncorrectable remapped rows)
    ROW_REMAP_PENDING = "row_remap_pending"  # gauge 1 while active
    ROW_REMAP_FAILURE = "row_remap_failure"  # gauge 1 while active
    NVLINK_CRC = "nvlink_crc"  # NVLink CRC flit + data errors
    NVLINK_REPLAY = "nvlink_replay"  # NVLink replay + recovery errors
    PCIE_REPLAY = "pcie_replay"
    THERMAL = "thermal"  # temperature = value, thermal violation grows at rate ns/s
    POWER = "power"  # power capping: power violation grows at rate ns/s
    GPU_GONE = "gpu_gone"  # the GPU's series vanish while active
    EXPORTER_DOWN = "exporter_down"  # mode "503" or "refused" while active
    SET = "set"  # gauge ``metric`` = value while active
    GROW = "grow"  # counter ``metric`` += count at start + rate/s


_GROWTH: Mapping[FaultKind, tuple[tuple[str, float], ...]] = {
    FaultKind.ECC_SBE: ((M.ECC_SBE_VOL, 1.0), (M.ECC_SBE_AGG, 1.0)),
    FaultKind.ECC_DBE: ((M.ECC_DBE_VOL, 1.0), (M.ECC_DBE_AGG, 1.0),
                        (M.UNCORRECTABLE_REMAPPED_ROWS, 1.0)),
    FaultKind.NVLINK_CRC: ((M.NVLINK_CRC_FLIT, 1.0), (M.NVLINK_CRC_DATA, 1.0)),
    FaultKind.NVLINK_REPLAY: ((M.NVLINK_REPLAY, 1.0), (M.NVLINK_RECOVERY, 1.0)),
    FaultKind.PCIE_REPLAY: ((M.PCIE_REPLAY, 1.0),),
    FaultKind.THERMAL: ((M.THERMAL_VIOLATION, 1.0),),
    FaultKind.POWER: ((M.POWER_VIOLATION, 1.0),),
}
EXPORTER_MODES = ("503", "refused")


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault on one node (``gpu=None``: every GPU of the node).

    ``at`` is the clock time it starts (None when injected: now); it is active during
    ``[at, at + duration)`` (``duration=None``: until cleared). ``end`` is set by
    :meth:`DcgmSim.clear`.
    """

    kind: FaultKind
    node: str
    gpu: int | None = None
    at: float | None = None
    duration: float | None = None
    code: int = 0
    count: float = 0.0
    interval: float = 0.0
    rate: float = 0.0
    value: float = 0.0
    metric: str = ""
    mode: str = "503"
    id: str = ""
    end: float | None = None

    @property
    def start(self) -> float:
        return 0.0 if self.at is None else self.at

    @property
    def stop(self) -> float | None:
        """When the fault ends (None: not yet scheduled to end)."""
        ends = [t for t in (self.end, None if self.duration is None else
                            self.start + self.duration) if t is not None]
        return min(ends) if ends else None

    def active(self, t: float) -> bool:
        stop = self.stop
        return self.start <= t and (stop is None or t < stop)

    def applies_to(self, gpu: int) -> bool:
        return self.gpu is None or self.gpu == gpu

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind"] = self.kind.value
        return d

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, node: str | None = None) -> Fault:
        """Parse a JSON fault; ``node`` is the default node. Raises ValueError when invalid.

        An ``after`` field (seconds from now) is accepted and left to the caller
        (:func:`after_of`), since only the simulator knows what "now" is.
        """
        if not isinstance(data, Mapping):
            raise ValueError("a fault is a JSON object")
        known = {f.name for f in fields(cls)} - {"id", "end"}
        unknown = set(data) - known - {"after"}
        if unknown:
            raise ValueError(f"unknown fault field(s): {', '.join(sorted(unknown))}")
        try:
            kind = FaultKind(data["kind"])
        except KeyError:
            raise ValueError("a fault needs a kind") from None
        except ValueError:
            kinds = ", ".join(k.value for k in FaultKind)
            raise ValueError(f"unknown fault kind {data['kind']!r} (one of {kinds})") from None
        target = data.get("node", node)
        if not isinstance(target, str) or not target:
            raise ValueError("a fault needs a node")

        def num(name: str, default: float | None) -> float | None:
            v = data.get(name, default)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{name} must be a number")
            return float(v)

        gpu = data.get("gpu")
        if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int)):
            raise ValueError("gpu must be an integer GPU index")
        at = num("at", None)
        if at is not None and data.get("after") is not None:
            raise ValueError("give at or after, not both")
        f = cls(kind=kind, node=target, gpu=gpu, at=at, duration=num("duration", None),
                code=int(num("code", 0) or 0), count=num("count", 0.0) or 0.0,
                interval=num("interval", 0.0) or 0.0, rate=num("rate", 0.0) or 0.0,
                value=num("value", 0.0) or 0.0, metric=str(data.get("metric", "")),
                mode=str(data.get("mode", "503")))
        f.validate()
        return f

    def validate(self) -> None:
        if self.kind is FaultKind.XID and self.code <= 0:
            raise ValueError("an xid fault needs a positive code")
        if self.kind is FaultKind.EXPORTER_DOWN and self.mode not in EXPORTER_MODES:
            raise ValueError(f"mode must be one of {', '.join(EXPORTER_MODES)}")
        if self.kind in (FaultKind.SET, FaultKind.GROW) and self.metric not in METRIC_NAMES:
            raise ValueError(f"unknown metric {self.metric!r}")
        if self.kind in (FaultKind.SET, FaultKind.GROW) and self.metric == M.XID_COUNT:
            raise ValueError("use an xid fault for XIDs")
        if self.count < 0 or self.rate < 0 or self.interval < 0:
            raise ValueError("count, rate and interval must not be negative")
        if self.duration is not None and self.duration < 0:
            raise ValueError("duration must not be negative")

    def xid_times(self) -> list[float]:
        n = max(int(self.count), 1)
        return [self.start + i * self.interval for i in range(n)]

    def grown(self, t: float) -> float:
        """How much a growth fault has added by time ``t``."""
        if t < self.start:
            return 0.0
        stop = self.stop
        until = t if stop is None else min(t, stop)
        return self.count + self.rate * max(until - self.start, 0.0)


def after_of(data: Mapping[str, Any]) -> float | None:
    """The ``after`` field of a JSON fault (seconds from now), or None."""
    v = data.get("after")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise ValueError("after must be a non-negative number of seconds")
    return float(v)


# ---------------------------------------------------------------------------------------------
# The simulator


@dataclass(frozen=True, slots=True)
class GpuState:
    """Every metric of one GPU at one instant (as rendered)."""

    values: Mapping[str, float]
    last_xid: int
    xid_counts: Mapping[int, int]
    present: bool


class DcgmSim:
    """The simulated fleet's telemetry as a pure function of the faults and the clock.

    Thread-safe: faults may be injected from any thread while exporters render.
    """

    def __init__(self, nodes: Iterable[NodeSpec], *, clock: Clock = time.time,
                 faults: Iterable[Fault] = ()) -> None:
        self.nodes: dict[str, NodeSpec] = {}
        for n in nodes:
            if n.name in self.nodes:
                raise ValueError(f"duplicate node {n.name}")
            self.nodes[n.name] = n
        self.clock = clock
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._seq = 0
        self._listeners: list[Callable[[], None]] = []
        self._xid_text = {c: e.meaning for c, e in default_catalog().entries.items()}
        #: more of the node's series, (node, t) → exposition text (healer_dev.sim.infiniband)
        self.collectors: list[Callable[[str, float], str]] = []
        for f in faults:
            self.inject(f)

    # -- faults ---------------------------------------------------------------------------

    def inject(self, fault: Fault, *, after: float | None = None) -> Fault:
        """Add ``fault``; it starts at ``fault.at``, or ``after`` seconds from now, or now.

        Returns the fault as stored (with its ``id`` and absolute ``at``).
        """
        if fault.node not in self.nodes:
            raise ValueError(f"unknown node {fault.node!r}")
        if fault.gpu is not None:
            self.nodes[fault.node].gpu(fault.gpu)  # raises KeyError for a wrong index
        fault.validate()
        at = fault.at
        if at is None:
            at = self.clock() + (after or 0.0)
        with self._lock:
            self._seq += 1
            stored = replace(fault, at=at, id=fault.id or f"f{self._seq}")
            self._faults.append(stored)
        self._notify()
        return stored

    def clear(self, fault_id: str | None = None, *, node: str | None = None) -> list[Fault]:
        """End a fault (or every fault, or every fault of ``node``) now; returns those ended.

        Counters keep what they grew; gauges and outages return to normal.
        """
        now = self.clock()
        ended: list[Fault] = []
        with self._lock:
            for i, f in enumerate(self._faults):
                if fault_id is not None and f.id != fault_id:
                    continue
                if node is not None and f.node != node:
                    continue
                stop = f.stop
                if stop is not None and stop <= now:
                    continue
                if f.start > now:  # not started yet: it never happens
                    self._faults[i] = replace(f, end=f.start)
                else:
                    self._faults[i] = replace(f, end=now)
                ended.append(self._faults[i])
        if fault_id is not None and not ended and not any(f.id == fault_id for f in self.faults):
            raise KeyError(fault_id)
        self._notify()
        return ended

    @property
    def faults(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the injecting thread) whenever the fault list changes."""
        self._listeners.append(callback)

    def _notify(self) -> None:
        for cb in list(self._listeners):
            cb()

    # convenience constructors ------------------------------------------------------------

    def xid(self, node: str, gpu: int, code: int, count: int = 1, *, interval: float = 0.0,
            at: float | None = None, after: float | None = None) -> Fault:
        """``count`` occurrences of XID ``code``, ``interval`` seconds apart."""
        return self.inject(Fault(FaultKind.XID, node, gpu, at, code=code, count=count,
                                 interval=interval), after=after)

    def ecc_sbe(self, node: str, gpu: int, count: float = 0.0, *, rate: float = 0.0,
                at: float | None = None, duration: float | None = None) -> Fault:
        return self.inject(Fault(FaultKind.ECC_SBE, node, gpu, at, duration, count=count,
                                 rate=rate))

    def ecc_dbe(self, node: str, gpu: int, count: float = 1.0, *, rate: float = 0.0,
                at: float | None = None, duration: float | None = None) -> Fault:
        return self.inject(Fault(FaultKind.ECC_DBE, node, gpu, at, duration, count=count,
                                 rate=rate))

    def row_remap_pending(self, node: str, gpu: int, *, at: float | None = None,
                          duration: float | None = None) -> Fault:
        return self.inject(Fault(FaultKind.ROW_REMAP_PENDING, node, gpu, at, duration))

    def row_remap_failure(self, node: str, gpu: int, *, at: float | None = None,
                          duration: float | None = None) -> Fault:
        return self.inject(Fault(FaultKind.ROW_REMAP_FAILURE, node, gpu, at, duration))

    def nvlink_errors(self, node: str, gpu: int, count: float = 0.0, *, rate: float = 0.0,
                      replay: bool = False, at: float | None = None,
                      duration: float | None = None) -> Fault:
        kind = FaultKind.NVLINK_REPLAY if replay else FaultKind.NVLINK_CRC
        return self.inject(Fault(kind, node, gpu, at, duration, count=count, rate=rate))

    def pcie_replay(self, node: str, gpu: int, count: float = 0.0, *, rate: float = 0.0,
                    at: float | None = None, duration: float | None = None) -> Fault:
        return self.inject(Fault(FaultKind.PCIE_REPLAY, node, gpu, at, duration, count=count,
                                 rate=rate))

    def thermal(self, node: str, gpu: int, temp: float = 95.0, *, rate: float = 5e8,
                at: float | None = None, duration: float | None = None) -> Fault:
        """Thermal throttling: ``temp`` °C, ``rate`` ns of thermal violation per second."""
        return self.inject(Fault(FaultKind.THERMAL, node, gpu, at, duration, value=temp,
                                 rate=rate))

    def power_throttle(self, node: str, gpu: int, *, rate: float = 5e8, at: float | None = None,
                       duration: float | None = None) -> Fault:
        return self.inject(Fault(FaultKind.POWER, node, gpu, at, duration, rate=rate))

    def gpu_gone(self, node: str, gpu: int | None, *, at: float | None = None,
                 duration: float | None = None) -> Fault:
        """The GPU's series vanish (``gpu=None``: every GPU; the exporter still answers)."""
        return self.inject(Fault(FaultKind.GPU_GONE, node, gpu, at, duration))

    def exporter_down(self, node: str, mode: str = "503", *, at: float | None = None,
                      duration: float | None = None) -> Fault:
        """The node's exporter answers 503 (``mode="503"``) or refuses connections."""
        return self.inject(Fault(FaultKind.EXPORTER_DOWN, node, None, at, duration, mode=mode))

    # -- state ----------------------------------------------------------------------------

    def exporter_state(self, node: str, t: float | None = None) -> str:
        """``up``, ``503`` or ``refused`` at time ``t`` (default: now)."""
        t = self.clock() if t is None else t
        state = "up"
        for f in self.faults:
            if f.node == node and f.kind is FaultKind.EXPORTER_DOWN and f.active(t):
                if f.mode == "refused":
                    return "refused"
                state = "503"
        return state

    def gpu_state(self, node: str, gpu: int, t: float | None = None) -> GpuState:
        t = self.clock() if t is None else t
        spec = self.nodes[node]
        return self._gpu_state(spec, spec.gpu(gpu), t, self._faults_of(node))

    def _faults_of(self, node: str) -> list[Fault]:
        return [f for f in self.faults if f.node == node]

    def _gpu_state(self, node: NodeSpec, gpu: GpuSpec, t: float,
                   faults: Sequence[Fault]) -> GpuState:
        busy = gpu.index in node.hpc_jobs
        v: dict[str, float] = dict.fromkeys(METRIC_NAMES, 0.0)
        v[M.GPU_TEMP] = 38.0 + gpu.index + (20.0 if busy else 0.0)
        v[M.POWER_USAGE] = 520.0 if busy else 72.0
        v[M.GPU_UTIL] = 97.0 if busy else 0.0
        reasons = 0 if busy else CLOCKS_GPU_IDLE
        present = True
        xids: list[tuple[float, int, int]] = []  # (time, order, code)
        for order, f in enumerate(faults):
            if not f.applies_to(gpu.index):
                continue
            active = f.active(t)
            match f.kind:
                case FaultKind.XID:
                    xids.extend((x, order, f.code) for x in f.xid_times() if x <= t)
                case FaultKind.ROW_REMAP_PENDING if active:
                    v[M.ROW_REMAP_PENDING] = 1.0
                case FaultKind.ROW_REMAP_FAILURE if active:
                    v[M.ROW_REMAP_FAILURE] = 1.0
                case FaultKind.GPU_GONE if active:
                    present = False
                case FaultKind.SET if active:
                    v[f.metric] = f.value
                case FaultKind.GROW:
                    v[f.metric] += f.grown(t)
                case _:
                    pass
            for metric, scale in _GROWTH.get(f.kind, ()):
                v[metric] += scale * f.grown(t)
            if f.kind is FaultKind.THERMAL and active:
                v[M.GPU_TEMP] = f.value or 95.0
                reasons = (reasons & ~CLOCKS_GPU_IDLE) | CLOCKS_SW_THERMAL | CLOCKS_HW_THERMAL
            if f.kind is FaultKind.POWER and active:
                reasons = (reasons & ~CLOCKS_GPU_IDLE) | CLOCKS_SW_POWER_CAP \
                    | CLOCKS_HW_POWER_BRAKE
        v[M.CLOCKS_EVENT_REASONS] = float(reasons)
        xids.sort()
        last = xids[-1][2] if xids else 0
        v[M.XID_ERRORS] = float(last)
        counts: dict[int, int] = {}
        for x, _, code in xids:
            if t - x < node.xid_window:
                counts[code] = counts.get(code, 0) + 1
        return GpuState(v, last, counts, present)

    # -- rendering ------------------------------------------------------------------------

    def render(self, node: str, t: float | None = None) -> str:
        """The ``/metrics`` body of ``node``'s exporter at time ``t`` (default: now)."""
        t = self.clock() if t is None else t
        spec = self.nodes[node]
        faults = self._faults_of(node)
        states = [(g, self._gpu_state(spec, g, t, faults)) for g in spec.gpus]
        states = [(g, s) for g, s in states if s.present]
        out: list[str] = []
        for name, typ, help_text in METRICS:
            lines: list[str] = []
            for g, s in states:
                if name == M.XID_COUNT:
                    if not spec.xid_count:
                        continue
                    window = {"window_size_in_ms": str(int(spec.xid_window * 1000))}
                    if not s.xid_counts:
                        lines.extend(self._series(name, spec, g, window, 0.0))
                    for code, n in sorted(s.xid_counts.items()):
                        lines.extend(self._series(name, spec, g, {**window, "xid": str(code)},
                                                  float(n)))
                elif name == M.XID_ERRORS:
                    text = "No Error" if s.last_xid == 0 else \
                        self._xid_text.get(s.last_xid, "Unknown Error")
                    lines.extend(self._series(name, spec, g, {"err_code": str(s.last_xid),
                                                              "err_msg": text},
                                              s.values[name]))
                else:
                    lines.extend(self._series(name, spec, g, {}, s.values[name]))
            if lines:
                out.append(f"# HELP {name} {help_text}")
                out.append(f"# TYPE {name} {typ}")
                out.extend(lines)
        extra = "".join(collect(node, t) for collect in self.collectors)
        return ("\n".join(out) + "\n" if out else "") + extra

    @staticmethod
    def _series(name: str, node: NodeSpec, gpu: GpuSpec, attrs: Mapping[str, str],
                value: float) -> list[str]:
        labels: list[tuple[str, str]] = [
            ("gpu", str(gpu.index)), ("UUID", gpu.uuid), ("pci_bus_id", gpu.pci_bus_id),
            ("device", f"nvidia{gpu.index}"), ("modelName", gpu.model),
            (node.host_label, node.name), ("DCGM_FI_DRIVER_VERSION", node.driver_version),
        ]
        if node.serial_label:
            labels.append(("DCGM_FI_DEV_SERIAL", gpu.serial))
        labels.extend(attrs.items())
        jobs = node.hpc_jobs.get(gpu.index, ())
        rendered = [_fmt_value(value)]
        if not jobs:
            return [f"{name}{{{_fmt_labels(labels)}}} {rendered[0]}"]
        return [f"{name}{{{_fmt_labels([*labels, ('hpc_job', j)])}}} {rendered[0]}"
                for j in jobs]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt_labels(labels: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in labels)


def _fmt_value(value: float) -> str:
    if not math.isfinite(value):  # what a broken sensor makes the exporter write
        return "NaN" if value != value else ("+Inf" if value > 0 else "-Inf")
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))
