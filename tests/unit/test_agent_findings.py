"""The agent's pure classification: readings + events → GPUHealthy status, reason, message."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from healer.agent.findings import (
    EccCounts,
    EventKind,
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
from healer.core.model import Severity
from healer.core.vocabulary import GPU_CONDITION
from healer.policy.catalog import default_catalog

NOW = 1_700_000_000.0
CATALOG = default_catalog()
TH = Thresholds()


def gpu(i: int) -> GpuInfo:
    return GpuInfo(index=i, uuid=f"GPU-{i:04d}", serial=f"S{i}", pci_bus_id=f"0000:{i:02X}:00.0",
                   name="NVIDIA H100 80GB HBM3")


def reading(i: int, **kw: Any) -> GpuReading:
    base: dict[str, Any] = {
        "ecc": EccCounts(0, 0, 0, 0),
        "retired_pages": RetiredPages(0, 0, False),
        "remapped_rows": RemappedRows(0, 0, False, False),
        "nvlink": NvlinkCounters(18, 0, 0, 0, 0, 0),
        "pcie_replays": 0,
        "temperature_c": 45,
        "power_w": 120.0,
        "clocks_event_reasons": frozenset(),
    }
    base.update(kw)
    return GpuReading(gpu=gpu(i), at=NOW, **base)


def xid(i: int, code: int, at: float = NOW - 5) -> GpuEvent:
    return GpuEvent(index=i, uuid=f"GPU-{i:04d}", kind=EventKind.XID, event_type=0x8, at=at,
                    xid=code, data=code)


def event(i: int, kind: EventKind, at: float = NOW - 5) -> GpuEvent:
    return GpuEvent(index=i, uuid=f"GPU-{i:04d}", kind=kind, event_type=0, at=at)


def fatal_xid() -> int:
    return 79


def degrading_xid() -> int:
    return min(CATALOG.group("degrading"))


def benign_xid() -> int:
    return min(c for c, e in CATALOG.entries.items() if e.severity is None)


# (id, readings, events, node reason, {gpu index: reason of that GPU})
CASES: list[tuple[str, list[GpuReading], list[GpuEvent], Reason, dict[int, Reason]]] = [
    ("all healthy", [reading(0), reading(1)], [], Reason.HEALTHY,
     {0: Reason.HEALTHY, 1: Reason.HEALTHY}),
    ("xid 79 is fatal", [reading(0), reading(1)], [xid(1, fatal_xid())], Reason.XID_FATAL,
     {0: Reason.HEALTHY, 1: Reason.XID_FATAL}),
    ("degrading xid", [reading(0)], [xid(0, degrading_xid())], Reason.XID_DEGRADING,
     {0: Reason.XID_DEGRADING}),
    ("application xid is no node fault", [reading(0)], [xid(0, benign_xid())], Reason.HEALTHY,
     {0: Reason.HEALTHY}),
    ("xid unknown to the catalog", [reading(0)], [xid(0, 999)], Reason.HEALTHY,
     {0: Reason.HEALTHY}),
    ("xid older than the window", [reading(0)], [xid(0, fatal_xid(), NOW - 3601)],
     Reason.HEALTHY, {0: Reason.HEALTHY}),
    ("lost gpu", [reading(0), GpuReading(gpu=gpu(1), at=NOW, lost=True)], [], Reason.GPU_LOST,
     {0: Reason.HEALTHY, 1: Reason.GPU_LOST}),
    ("lost beats xid", [reading(0), GpuReading(gpu=gpu(1), at=NOW, lost=True)],
     [xid(0, fatal_xid()), xid(1, fatal_xid())], Reason.GPU_LOST,
     {0: Reason.XID_FATAL, 1: Reason.GPU_LOST}),
    ("gpu-lost event", [reading(0)], [event(0, EventKind.GPU_LOST)], Reason.GPU_LOST,
     {0: Reason.GPU_LOST}),
    ("ecc uncorrectable", [reading(0, ecc=EccCounts(0, 1, 0, 1))], [],
     Reason.ECC_UNCORRECTABLE, {0: Reason.ECC_UNCORRECTABLE}),
    ("aggregate-only uncorrectable is history", [reading(0, ecc=EccCounts(0, 0, 0, 3))], [],
     Reason.HEALTHY, {0: Reason.HEALTHY}),
    ("double-bit event", [reading(0)], [event(0, EventKind.DOUBLE_BIT_ECC)],
     Reason.ECC_UNCORRECTABLE, {0: Reason.ECC_UNCORRECTABLE}),
    ("row remap failure", [reading(0, remapped_rows=RemappedRows(0, 3, False, True))], [],
     Reason.ROW_REMAP_FAILURE, {0: Reason.ROW_REMAP_FAILURE}),
    ("row remap pending", [reading(0, remapped_rows=RemappedRows(0, 1, True, False))], [],
     Reason.ROW_REMAP_PENDING, {0: Reason.ROW_REMAP_PENDING}),
    ("page retirement pending", [reading(0, retired_pages=RetiredPages(0, 1, True))], [],
     Reason.ROW_REMAP_PENDING, {0: Reason.ROW_REMAP_PENDING}),
    ("corrected at threshold", [reading(0, ecc=EccCounts(1000, 0, 1000, 0))], [],
     Reason.HEALTHY, {0: Reason.HEALTHY}),
    ("corrected storm", [reading(0, ecc=EccCounts(1001, 0, 1001, 0))], [],
     Reason.ECC_CORRECTABLE_STORM, {0: Reason.ECC_CORRECTABLE_STORM}),
    ("sbe storm event", [reading(0)], [event(0, EventKind.SINGLE_BIT_ECC_STORM)],
     Reason.ECC_CORRECTABLE_STORM, {0: Reason.ECC_CORRECTABLE_STORM}),
    ("nvlink at threshold", [reading(0, nvlink=NvlinkCounters(18, crc_flit=100))], [],
     Reason.HEALTHY, {0: Reason.HEALTHY}),
    ("nvlink over threshold", [reading(0, nvlink=NvlinkCounters(18, crc_flit=101))], [],
     Reason.NVLINK_ERRORS, {0: Reason.NVLINK_ERRORS}),
    ("pcie replays", [reading(0, pcie_replays=101)], [], Reason.PCIE_REPLAYS,
     {0: Reason.PCIE_REPLAYS}),
    ("hw thermal slowdown", [reading(0, clocks_event_reasons=frozenset({"HwThermalSlowdown"}))],
     [], Reason.THERMAL_THROTTLE, {0: Reason.THERMAL_THROTTLE}),
    ("sw thermal slowdown", [reading(0, clocks_event_reasons=frozenset({"SwThermalSlowdown"}))],
     [], Reason.THERMAL_THROTTLE, {0: Reason.THERMAL_THROTTLE}),
    ("power capping is not thermal", [reading(0, clocks_event_reasons=frozenset(
        {"SwPowerCap", "GpuIdle"}))], [], Reason.HEALTHY, {0: Reason.HEALTHY}),
    ("not available is not bad", [GpuReading(gpu=gpu(0), at=NOW)], [], Reason.HEALTHY,
     {0: Reason.HEALTHY}),
    ("failed beats degrading across gpus",
     [reading(0, pcie_replays=500), reading(1, remapped_rows=RemappedRows(0, 0, False, True))],
     [], Reason.ROW_REMAP_FAILURE, {0: Reason.PCIE_REPLAYS, 1: Reason.ROW_REMAP_FAILURE}),
    ("event for a gpu without a reading", [reading(0)], [xid(3, fatal_xid())],
     Reason.XID_FATAL, {0: Reason.HEALTHY, 3: Reason.XID_FATAL}),
]


@pytest.mark.parametrize(("readings", "events", "node_reason", "per_gpu"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_classification(readings: list[GpuReading], events: list[GpuEvent], node_reason: Reason,
                        per_gpu: dict[int, Reason]) -> None:
    a = assess(readings, events, CATALOG, TH, NOW)
    assert a.reason is node_reason
    assert {g.gpu.index: g.reason for g in a.gpus} == per_gpu
    assert a.status == ("True" if node_reason is Reason.HEALTHY else "False")
    assert a.healthy is (node_reason is Reason.HEALTHY)
    assert a.severity is node_reason.severity
    assert a.to_dict()["type"] == GPU_CONDITION


def test_every_catalog_xid_follows_its_catalog_severity() -> None:
    for code, entry in CATALOG.entries.items():
        a = assess([reading(0)], [xid(0, code)], CATALOG, TH, NOW)
        expected = {Severity.FAILED: Reason.XID_FATAL, Severity.DEGRADING: Reason.XID_DEGRADING,
                    None: Reason.HEALTHY}[entry.severity]
        assert a.reason is expected, code
        if expected is not Reason.HEALTHY:
            assert a.worst is not None
            assert a.worst.xid == code
            assert f"XID {code} {entry.mnemonic}" in a.message


def test_reason_names_and_severities() -> None:
    assert [r.value for r in Reason] == [
        "GpuLost", "XidFatal", "EccUncorrectable", "RowRemapFailure", "XidDegrading",
        "RowRemapPending", "EccCorrectableStorm", "NvlinkErrors", "PcieReplays",
        "ThermalThrottle", "Healthy"]
    failed = {r for r in Reason if r.severity is Severity.FAILED}
    assert failed == {Reason.GPU_LOST, Reason.XID_FATAL, Reason.ECC_UNCORRECTABLE,
                      Reason.ROW_REMAP_FAILURE}
    assert Reason.HEALTHY.severity is None


def test_message_names_each_affected_gpu_with_index_uuid_and_xid() -> None:
    a = assess([reading(0), reading(1), reading(2, remapped_rows=RemappedRows(0, 1, True, False))],
               [xid(1, fatal_xid())], CATALOG, TH, NOW)
    assert a.message == ("GPU 1 GPU-0001: XID 79 GPU_HAS_FALLEN_OFF_THE_BUS; "
                         "GPU 2 GPU-0002: row remap pending (a GPU reset applies it)")
    assert "GPU 0" not in a.message


def test_repeated_xids_are_counted_and_distinct_codes_kept_apart() -> None:
    events = [xid(0, fatal_xid()), xid(0, fatal_xid()), xid(0, 48)]
    a = assess([reading(0)], events, CATALOG, TH, NOW)
    g = a.gpu(0)
    assert g is not None
    assert [(f.reason, f.xid, f.count) for f in g.findings] == [
        (Reason.XID_FATAL, 48, 1), (Reason.XID_FATAL, 79, 2)]
    assert "XID 79 GPU_HAS_FALLEN_OFF_THE_BUS x2" in a.message


def test_findings_on_one_gpu_are_ordered_worst_first() -> None:
    r = reading(0, pcie_replays=500, ecc=EccCounts(0, 2, 0, 2),
                clocks_event_reasons=frozenset({"HwThermalSlowdown"}))
    a = assess([r], [xid(0, degrading_xid())], CATALOG, TH, NOW)
    g = a.gpu(0)
    assert g is not None
    assert [f.reason for f in g.findings] == [
        Reason.ECC_UNCORRECTABLE, Reason.XID_DEGRADING, Reason.PCIE_REPLAYS,
        Reason.THERMAL_THROTTLE]


def test_nvlink_finding_names_the_kinds_over_the_threshold() -> None:
    r = reading(0, nvlink=NvlinkCounters(18, replay=5, crc_flit=250, crc_data=101))
    a = assess([r], [], CATALOG, TH, NOW)
    assert a.message == "GPU 0 GPU-0000: NVLink errors crc_flit=250 crc_data=101 (> 100)"


def test_thresholds_are_configurable() -> None:
    r = reading(0, pcie_replays=20, ecc=EccCounts(50, 0, 50, 0),
                nvlink=NvlinkCounters(4, replay=11))
    assert assess([r], [], CATALOG, TH, NOW).healthy
    th = Thresholds(ecc_corrected_max=10, nvlink_errors_max=10, pcie_replays_max=10)
    g = assess([r], [], CATALOG, th, NOW).gpu(0)
    assert g is not None
    assert {f.reason for f in g.findings} == {
        Reason.ECC_CORRECTABLE_STORM, Reason.NVLINK_ERRORS, Reason.PCIE_REPLAYS}


def test_event_window_is_configurable() -> None:
    ev = [xid(0, fatal_xid(), NOW - 120)]
    assert assess([reading(0)], ev, CATALOG, TH, NOW).reason is Reason.XID_FATAL
    assert assess([reading(0)], ev, CATALOG, Thresholds(event_window_s=60), NOW).healthy


def test_events_match_readings_by_uuid_then_index() -> None:
    moved = GpuEvent(index=7, uuid="GPU-0001", kind=EventKind.XID, event_type=8, at=NOW, xid=79)
    nameless = GpuEvent(index=0, uuid="", kind=EventKind.XID, event_type=8, at=NOW, xid=48)
    a = assess([reading(0), reading(1)], [moved, nameless], CATALOG, TH, NOW)
    assert {g.gpu.index: g.reason for g in a.gpus} == {0: Reason.XID_FATAL, 1: Reason.XID_FATAL}
    assert len(a.gpus) == 2


def test_lost_gpu_without_identity_is_still_named() -> None:
    a = assess([GpuReading(gpu=GpuInfo(index=4), at=NOW, lost=True)], [], CATALOG, TH, NOW)
    assert a.message == "GPU 4 uuid-unknown: GPU is lost (NVML_ERROR_GPU_IS_LOST)"


@pytest.mark.parametrize("limit", [80, 200, 1024])
def test_message_is_capped(limit: int) -> None:
    readings = [GpuReading(gpu=GpuInfo(index=i, uuid=f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}"),
                           at=NOW, lost=True) for i in range(64)]
    a = assess(readings, [], CATALOG, Thresholds(message_max_chars=limit), NOW)
    assert len(a.message) <= limit
    assert a.message.startswith("GPU 0 GPU-00000000")
    assert "more GPUs)" in a.message


def test_one_huge_entry_is_cut() -> None:
    events = [xid(0, code) for code in sorted(CATALOG.group("fatal"))]
    a = assess([reading(0)], events, CATALOG, Thresholds(message_max_chars=80), NOW)
    assert len(a.message) == 80
    assert a.message.endswith("…")


@pytest.mark.parametrize(("readings", "message"), [
    ([reading(0)], "1 GPU healthy"),
    ([reading(i) for i in range(8)], "8 GPUs healthy"),
    ([], "no GPUs found"),
])
def test_healthy_message(readings: list[GpuReading], message: str) -> None:
    a = assess(readings, [], CATALOG, TH, NOW)
    assert (a.status, a.reason, a.message) == ("True", Reason.HEALTHY, message)


def test_assessment_and_inputs_are_frozen() -> None:
    a = assess([reading(0)], [xid(0, fatal_xid())], CATALOG, TH, NOW)
    for obj in (a, a.gpus[0], a.worst, TH, reading(0), xid(0, 79), gpu(0)):
        name = dataclasses.fields(obj)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, None)


@pytest.mark.parametrize("kw", [{"ecc_corrected_max": -1}, {"nvlink_errors_max": -1},
                                {"pcie_replays_max": -1}, {"event_window_s": -1.0},
                                {"message_max_chars": 10}])
def test_thresholds_are_validated(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="Thresholds"):
        Thresholds(**kw)


def test_assess_does_not_depend_on_input_order() -> None:
    readings = [reading(2, pcie_replays=500), reading(0), reading(1, ecc=EccCounts(0, 1, 0, 1))]
    events = [xid(0, degrading_xid()), xid(2, fatal_xid())]
    a = assess(readings, events, CATALOG, TH, NOW)
    b = assess(list(reversed(readings)), list(reversed(events)), CATALOG, TH, NOW)
    assert a == b
    assert [g.gpu.index for g in a.gpus] == [0, 1, 2]


def test_a_lost_reading_and_a_lost_event_make_one_finding() -> None:
    a = assess([GpuReading(gpu=gpu(1), at=NOW, lost=True)], [event(1, EventKind.GPU_LOST)],
               CATALOG, TH, NOW)
    assert a.message == "GPU 1 GPU-0001: GPU is lost (NVML_ERROR_GPU_IS_LOST)"
    assert len(a.findings) == 1


@pytest.mark.parametrize(("kind", "reason", "detail"), [
    (EventKind.DOUBLE_BIT_ECC, Reason.ECC_UNCORRECTABLE, "double-bit ECC error (NVML event)"),
    (EventKind.DRAM_RETIREMENT_FAILURE, Reason.ROW_REMAP_FAILURE,
     "row remap/page retirement failed (NVML event)"),
    (EventKind.GPU_UNAVAILABLE, Reason.GPU_LOST, "GPU unavailable (NVML event)"),
    (EventKind.SINGLE_BIT_ECC, Reason.HEALTHY, ""),
    (EventKind.DRAM_RETIREMENT, Reason.HEALTHY, ""),
    (EventKind.OTHER, Reason.HEALTHY, ""),
])
def test_non_xid_events(kind: EventKind, reason: Reason, detail: str) -> None:
    a = assess([reading(0)], [event(0, kind)], CATALOG, TH, NOW)
    assert a.reason is reason
    if detail:
        assert a.message == f"GPU 0 GPU-0000: {detail}"
