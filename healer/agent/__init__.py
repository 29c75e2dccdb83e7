"""The node agent (``healer agent``, a DaemonSet): NVML readings and events → GPU health.

:mod:`healer.agent.nvml` reads NVML (pynvml; its helpers are ``nvml_calls``, ``nvml_counters``
and ``nvml_events``); :mod:`healer.agent.findings` is the pure classification of what it read
into the ``GPUHealthy`` condition's status, reason and message.
"""

from healer.agent.findings import (
    Assessment,
    EccCounts,
    EventKind,
    Finding,
    GpuAssessment,
    GpuEvent,
    GpuInfo,
    GpuReading,
    NvlinkCounters,
    Reason,
    RemappedRows,
    RetiredPages,
    Thresholds,
    assess,
)
from healer.agent.nvml import NvmlReader

__all__ = [
    "Assessment",
    "EccCounts",
    "EventKind",
    "Finding",
    "GpuAssessment",
    "GpuEvent",
    "GpuInfo",
    "GpuReading",
    "NvlinkCounters",
    "NvmlReader",
    "Reason",
    "RemappedRows",
    "RetiredPages",
    "Thresholds",
    "assess",
]
