"""Reading one GPU through NVML: its identity (:class:`GpuInfo`) and its health counters
(:class:`GpuReading`), translated from NVML's fields into the findings' types.

Every call goes through :class:`healer.agent.nvml_calls.DeviceCalls`, so a counter the GPU does
not support reads ``None``, another error is noted on the reading, and a lost GPU reads
``lost=True`` (the other GPUs are still read by the caller).
"""

from __future__ import annotations

import logging
from typing import Any

import pynvml

from healer.agent.findings import (
    EccCounts,
    GpuInfo,
    GpuReading,
    NvlinkCounters,
    RemappedRows,
    RetiredPages,
)
from healer.agent.nvml_calls import (
    FUNCTION_NOT_FOUND,
    GPU_IS_LOST,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    DeviceCalls,
    GpuLost,
    describe,
    error_code,
    error_name,
    nvml_function,
    text,
)

log = logging.getLogger("healer.agent.nvml")

#: nvmlClocksEventReason* bits and the names a reading reports them by.
CLOCKS_EVENT_REASONS: dict[str, int] = {
    "GpuIdle": 0x1,
    "ApplicationsClocksSetting": 0x2,
    "SwPowerCap": 0x4,
    "HwSlowdown": 0x8,
    "SyncBoost": 0x10,
    "SwThermalSlowdown": 0x20,
    "HwThermalSlowdown": 0x40,
    "HwPowerBrakeSlowdown": 0x80,
    "DisplayClockSetting": 0x100,
}

_NVLINK_COUNTERS: tuple[tuple[str, int], ...] = (
    ("replay", int(pynvml.NVML_NVLINK_ERROR_DL_REPLAY)),
    ("recovery", int(pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)),
    ("crc_flit", int(pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)),
    ("crc_data", int(pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)),
    ("ecc_data", int(pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA)),
)


def decode_clocks_event_reasons(mask: int) -> frozenset[str]:
    return frozenset(name for name, bit in CLOCKS_EVENT_REASONS.items() if mask & bit)


def identify(index: int) -> tuple[GpuInfo, Any]:
    """GPU ``index``'s identity and NVML handle (``None`` when NVML gives no handle)."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as e:
        log.warning("GPU %d: no NVML handle: %s", index, describe(e))
        return GpuInfo(index=index), None
    dev = DeviceCalls(handle)
    try:
        uuid = dev.call("uuid", nvml_function("nvmlDeviceGetUUID"))
        serial = dev.call("serial", nvml_function("nvmlDeviceGetSerial"))
        name = dev.call("name", nvml_function("nvmlDeviceGetName"))
        pci = dev.call("pci", nvml_function("nvmlDeviceGetPciInfo_v3"),
                       nvml_function("nvmlDeviceGetPciInfo"))
    except GpuLost:
        return GpuInfo(index=index), handle
    bus_id = "" if pci is None else text(pci.busId)
    return GpuInfo(index=index, uuid=text(uuid), serial=text(serial), pci_bus_id=bus_id,
                   name=text(name)), handle


def read_gpu(info: GpuInfo, handle: Any, at: float) -> GpuReading:
    """One GPU's counters now (``at``); a lost GPU reads ``lost=True``."""
    if handle is None:
        return GpuReading(gpu=info, at=at, errors=("no NVML handle",))
    dev = DeviceCalls(handle)
    try:
        return _read_device(info, dev, at)
    except GpuLost as lost:
        return GpuReading(gpu=info, at=at, lost=True,
                          errors=(*dev.errors, f"{lost.what}: {error_name(GPU_IS_LOST)}"))


def _read_device(info: GpuInfo, dev: DeviceCalls, at: float) -> GpuReading:
    total_ecc = nvml_function("nvmlDeviceGetTotalEccErrors")
    corrected = int(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED)
    uncorrected = int(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
    volatile = int(pynvml.NVML_VOLATILE_ECC)
    aggregate = int(pynvml.NVML_AGGREGATE_ECC)
    ecc = EccCounts(
        volatile_corrected=dev.int_("ecc volatile corrected", total_ecc,
                                    args=(corrected, volatile)),
        volatile_uncorrected=dev.int_("ecc volatile uncorrected", total_ecc,
                                      args=(uncorrected, volatile)),
        aggregate_corrected=dev.int_("ecc aggregate corrected", total_ecc,
                                     args=(corrected, aggregate)),
        aggregate_uncorrected=dev.int_("ecc aggregate uncorrected", total_ecc,
                                       args=(uncorrected, aggregate)),
    )
    retired = _retired_pages(dev)
    rows = dev.call("remapped rows", nvml_function("nvmlDeviceGetRemappedRows"))
    remapped = None if rows is None else RemappedRows(
        correctable=int(rows[0]), uncorrectable=int(rows[1]), pending=bool(rows[2]),
        failure=bool(rows[3]))
    nvlink = _nvlink(dev)
    pcie = dev.int_("pcie replays", nvml_function("nvmlDeviceGetPcieReplayCounter"))
    temp = dev.int_("temperature", nvml_function("nvmlDeviceGetTemperatureV"),
                    nvml_function("nvmlDeviceGetTemperature"),
                    args=(int(pynvml.NVML_TEMPERATURE_GPU),))
    power_mw = dev.int_("power", nvml_function("nvmlDeviceGetPowerUsage"))
    reasons = dev.int_("clocks event reasons",
                       nvml_function("nvmlDeviceGetCurrentClocksEventReasons"),
                       nvml_function("nvmlDeviceGetCurrentClocksThrottleReasons"))
    return GpuReading(
        gpu=info, at=at, ecc=ecc, retired_pages=retired, remapped_rows=remapped,
        nvlink=nvlink, pcie_replays=pcie, temperature_c=temp,
        power_w=None if power_mw is None else power_mw / 1000.0,
        clocks_event_reasons=None if reasons is None else decode_clocks_event_reasons(reasons),
        errors=tuple(dev.errors))


def _retired_pages(dev: DeviceCalls) -> RetiredPages | None:
    get_pages = nvml_function("nvmlDeviceGetRetiredPages")
    sbe = dev.call("retired pages (multiple SBE)", get_pages, args=(
        int(pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),))
    dbe = dev.call("retired pages (DBE)", get_pages, args=(
        int(pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),))
    pending = dev.int_("retired pages pending",
                       nvml_function("nvmlDeviceGetRetiredPagesPendingStatus"))
    if sbe is None and dbe is None and pending is None:
        return None
    return RetiredPages(multiple_single_bit=None if sbe is None else len(sbe),
                        double_bit=None if dbe is None else len(dbe),
                        pending=None if pending is None else bool(pending))


def _nvlink(dev: DeviceCalls) -> NvlinkCounters | None:
    state_fn = nvml_function("nvmlDeviceGetNvLinkState")
    counter_fn = nvml_function("nvmlDeviceGetNvLinkErrorCounter")
    present = 0
    active = 0
    sums: dict[str, int | None] = dict.fromkeys(name for name, _ in _NVLINK_COUNTERS)
    for link in range(int(pynvml.NVML_NVLINK_MAX_LINKS)):
        try:
            state = state_fn(dev.handle, link)
        except pynvml.NVMLError as e:
            code = error_code(e)
            if code == GPU_IS_LOST:
                raise GpuLost(f"nvlink {link} state") from e
            if code in (NOT_SUPPORTED, INVALID_ARGUMENT, FUNCTION_NOT_FOUND):
                continue  # no such link (or no NVLink at all)
            dev.errors.append(f"nvlink {link} state: {describe(e)}")
            continue
        present += 1
        if not state:
            continue
        active += 1
        for name, counter in _NVLINK_COUNTERS:
            value = dev.int_(f"nvlink {link} {name}", counter_fn, args=(link, counter))
            if value is not None:
                sums[name] = (sums[name] or 0) + value
    if present == 0:
        return None
    return NvlinkCounters(active_links=active, replay=sums["replay"],
                          recovery=sums["recovery"], crc_flit=sums["crc_flit"],
                          crc_data=sums["crc_data"], ecc_data=sums["ecc_data"])
