"""The node agent's NVML side: enumerate GPUs, read their health counters, watch NVML events.

:class:`NvmlReader` wraps ``pynvml`` (nvidia-ml-py), which loads ``libnvidia-ml.so.1`` through
ctypes. Its calls are untyped; every one goes through a typed helper here. Errors:

* the library missing or NVML failing to initialise raises :class:`healer.errors.ConfigError`
  with what failed, the NVML error and a hint;
* ``NVML_ERROR_NOT_SUPPORTED`` (and FUNCTION_NOT_FOUND on older drivers) reads as ``None``;
* ``NVML_ERROR_GPU_IS_LOST`` marks that GPU's reading ``lost``; the other GPUs are still read.

Events: :meth:`NvmlReader.start_events` runs ``nvmlEventSetWait_v2`` in one dedicated thread
with a short timeout, so an event reaches the callback as soon as NVML has it (the timeout only
bounds how long :meth:`NvmlReader.stop` waits). :meth:`NvmlReader.events` is the asyncio form.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any

import pynvml

from healer.agent.findings import (
    EccCounts,
    EventKind,
    GpuEvent,
    GpuInfo,
    GpuReading,
    NvlinkCounters,
    RemappedRows,
    RetiredPages,
)
from healer.errors import ConfigError, TransientError

log = logging.getLogger(__name__)

HINT = ("is the NVIDIA driver installed and loaded on this node, and are its libraries and the "
        "device plugin's /dev/nvidia* mounted into this container (NVIDIA container runtime)?")

#: Event types the watcher registers for (masked by what each GPU supports).
DEFAULT_EVENT_TYPES = (pynvml.nvmlEventTypeXidCriticalError
                       | pynvml.nvmlEventTypeDoubleBitEccError
                       | pynvml.nvmlEventTypeSingleBitEccErrorStorm
                       | pynvml.nvmlEventTypeDramRetirementFailure
                       | pynvml.nvmlEventTypeGpuUnavailableError)

_EVENT_KINDS: dict[int, EventKind] = {
    int(pynvml.nvmlEventTypeXidCriticalError): EventKind.XID,
    int(pynvml.nvmlEventTypeSingleBitEccError): EventKind.SINGLE_BIT_ECC,
    int(pynvml.nvmlEventTypeDoubleBitEccError): EventKind.DOUBLE_BIT_ECC,
    int(pynvml.nvmlEventTypeSingleBitEccErrorStorm): EventKind.SINGLE_BIT_ECC_STORM,
    int(pynvml.nvmlEventTypeDramRetirementEvent): EventKind.DRAM_RETIREMENT,
    int(pynvml.nvmlEventTypeDramRetirementFailure): EventKind.DRAM_RETIREMENT_FAILURE,
    int(pynvml.nvmlEventTypeGpuUnavailableError): EventKind.GPU_UNAVAILABLE,
}

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

_ERROR_NAMES: dict[int, str] = {}
for _name, _value in sorted(vars(pynvml).items()):
    if _name.startswith("NVML_ERROR_") and isinstance(_value, int):
        _ERROR_NAMES.setdefault(_value, _name)

SUCCESS = int(pynvml.NVML_SUCCESS)
NOT_SUPPORTED = int(pynvml.NVML_ERROR_NOT_SUPPORTED)
FUNCTION_NOT_FOUND = int(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
INVALID_ARGUMENT = int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
GPU_IS_LOST = int(pynvml.NVML_ERROR_GPU_IS_LOST)
TIMEOUT = int(pynvml.NVML_ERROR_TIMEOUT)
LIBRARY_NOT_FOUND = int(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
UNKNOWN = int(pynvml.NVML_ERROR_UNKNOWN)
_NOT_AVAILABLE = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND})


def error_code(err: BaseException) -> int:
    """The NVML return code carried by a ``pynvml.NVMLError``."""
    value = getattr(err, "value", UNKNOWN)
    return value if isinstance(value, int) else UNKNOWN


def error_name(code: int) -> str:
    return _ERROR_NAMES.get(code, f"NVML error {code}")


def describe(err: BaseException) -> str:
    """``NVML_ERROR_GPU_IS_LOST (GPU is lost)``."""
    code = error_code(err)
    try:
        text = str(err)
    except Exception:  # pynvml's __str__ calls into the library for unknown codes
        text = ""
    return f"{error_name(code)} ({text})" if text else error_name(code)


def decode_clocks_event_reasons(mask: int) -> frozenset[str]:
    return frozenset(name for name, bit in CLOCKS_EVENT_REASONS.items() if mask & bit)


def decode_event_kind(event_type: int) -> EventKind:
    return _EVENT_KINDS.get(event_type, EventKind.OTHER)


def _address(handle: Any) -> int:
    value = ctypes.cast(handle, ctypes.c_void_p).value
    return int(value) if value is not None else 0


class _GpuLost(Exception):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _Device:
    """Calls on one device handle: NOT_SUPPORTED → None, GPU_IS_LOST → _GpuLost, else noted."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.errors: list[str] = []

    def call(self, what: str, *fns: Callable[..., Any], args: tuple[Any, ...] = ()) -> Any:
        """The first of ``fns`` that exists in the library; ``None`` if none answers."""
        for fn in fns:
            try:
                return fn(self.handle, *args)
            except pynvml.NVMLError as e:
                code = error_code(e)
                if code == GPU_IS_LOST:
                    raise _GpuLost(what) from e
                if code == FUNCTION_NOT_FOUND:
                    continue
                if code != NOT_SUPPORTED:
                    self.errors.append(f"{what}: {describe(e)}")
                return None
        return None

    def int_(self, what: str, *fns: Callable[..., Any], args: tuple[Any, ...] = ()) -> int | None:
        value = self.call(what, *fns, args=args)
        return None if value is None else int(value)


def _fn(name: str) -> Callable[..., Any]:
    """A pynvml function by name; one missing from an older pynvml reads as FUNCTION_NOT_FOUND."""
    fn = getattr(pynvml, name, None)
    if fn is not None:
        return fn  # type: ignore[no-any-return]

    def missing(*_: Any) -> Any:
        raise pynvml.NVMLError(FUNCTION_NOT_FOUND)

    return missing


class NvmlReader:
    """NVML for the node agent.

    ::

        reader = NvmlReader().open()        # ConfigError if NVML is missing or fails to start
        readings = reader.read()            # list[GpuReading], one per GPU, on demand
        reader.start_events(callback)       # callback(GpuEvent) from the watcher thread
        ...
        reader.stop()                       # stop the watcher (bounded join), shut NVML down

    or ``async for event in reader.events(): ...`` in asyncio. ``read`` may be called from any
    thread while the watcher runs (NVML is thread-safe); run it in ``asyncio.to_thread``.
    """

    def __init__(self, *, wait_timeout_ms: int = 250,
                 event_types: int = DEFAULT_EVENT_TYPES,
                 clock: Callable[[], float] = time.time) -> None:
        if wait_timeout_ms <= 0:
            raise ValueError("wait_timeout_ms must be > 0")
        self.wait_timeout_ms = wait_timeout_ms
        self.event_types = event_types
        self._clock = clock
        self._lock = threading.Lock()
        self._opened = False
        self._driver = ""
        self._gpus: tuple[GpuInfo, ...] = ()
        self._handles: list[Any] = []
        self._by_address: dict[int, int] = {}
        self._lost_reported: set[int] = set()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._stop_lock = threading.Lock()
        self._event_set: Any = None
        self._watch_error: BaseException | None = None
        self.registered: dict[int, int] = {}  # GPU index -> event mask registered for it

    # -- life cycle ----------------------------------------------------------------------------

    def open(self) -> NvmlReader:
        """Initialise NVML and enumerate the GPUs. Raises ConfigError when NVML is unusable."""
        if self._opened:
            return self
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise ConfigError(_init_message(e)) from e
        try:
            self._driver = str(pynvml.nvmlSystemGetDriverVersion())
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as e:
            self._shutdown_quietly()
            raise ConfigError(f"NVML started but could not count the GPUs: {describe(e)}; "
                              f"{HINT}") from e
        gpus: list[GpuInfo] = []
        handles: list[Any] = []
        for index in range(count):
            info, handle = self._identify(index)
            gpus.append(info)
            handles.append(handle)
            if handle is not None:
                self._by_address[_address(handle)] = index
        self._gpus = tuple(gpus)
        self._handles = handles
        self._opened = True
        log.info("NVML %s: %d GPUs", self._driver, count)
        return self

    def _identify(self, index: int) -> tuple[GpuInfo, Any]:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as e:
            log.warning("GPU %d: no NVML handle: %s", index, describe(e))
            return GpuInfo(index=index), None
        dev = _Device(handle)
        try:
            uuid = dev.call("uuid", _fn("nvmlDeviceGetUUID"))
            serial = dev.call("serial", _fn("nvmlDeviceGetSerial"))
            name = dev.call("name", _fn("nvmlDeviceGetName"))
            pci = dev.call("pci", _fn("nvmlDeviceGetPciInfo_v3"), _fn("nvmlDeviceGetPciInfo"))
        except _GpuLost:
            return GpuInfo(index=index), handle
        bus_id = "" if pci is None else _text(pci.busId)
        return GpuInfo(index=index, uuid=_text(uuid), serial=_text(serial), pci_bus_id=bus_id,
                       name=_text(name)), handle

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the watcher (join within ``timeout`` s) and shut NVML down. Idempotent.

        Returns False when the watcher thread did not end in time; NVML is then left
        initialised (freeing the event set under a thread still inside the wait is unsafe).
        """
        clean = self.stop_events(timeout)
        if clean and self._opened:
            self._opened = False
            self._shutdown_quietly()
        return clean

    def __enter__(self) -> NvmlReader:
        return self.open()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @staticmethod
    def _shutdown_quietly() -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as e:
            log.warning("nvmlShutdown: %s", describe(e))

    # -- enumeration and counters --------------------------------------------------------------

    @property
    def driver_version(self) -> str:
        return self._driver

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._gpus

    @property
    def watching(self) -> bool:
        """True while the event watcher thread runs."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def read(self) -> list[GpuReading]:
        """Read every GPU's counters now. A lost GPU reads ``lost=True``; the rest still read."""
        if not self._opened:
            raise RuntimeError("NvmlReader.read() before open()")
        return [self._read_one(info, handle) for info, handle in zip(self._gpus, self._handles,
                                                                      strict=True)]

    def _read_one(self, info: GpuInfo, handle: Any) -> GpuReading:
        at = self._clock()
        if handle is None:
            return GpuReading(gpu=info, at=at, errors=("no NVML handle",))
        dev = _Device(handle)
        try:
            return self._read_device(info, dev, at)
        except _GpuLost as lost:
            return GpuReading(gpu=info, at=at, lost=True,
                              errors=(*dev.errors, f"{lost.what}: {error_name(GPU_IS_LOST)}"))

    def _read_device(self, info: GpuInfo, dev: _Device, at: float) -> GpuReading:
        total_ecc = _fn("nvmlDeviceGetTotalEccErrors")
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
        retired = self._retired_pages(dev)
        rows = dev.call("remapped rows", _fn("nvmlDeviceGetRemappedRows"))
        remapped = None if rows is None else RemappedRows(
            correctable=int(rows[0]), uncorrectable=int(rows[1]), pending=bool(rows[2]),
            failure=bool(rows[3]))
        nvlink = self._nvlink(dev)
        pcie = dev.int_("pcie replays", _fn("nvmlDeviceGetPcieReplayCounter"))
        temp = dev.int_("temperature", _fn("nvmlDeviceGetTemperatureV"),
                        _fn("nvmlDeviceGetTemperature"), args=(int(pynvml.NVML_TEMPERATURE_GPU),))
        power_mw = dev.int_("power", _fn("nvmlDeviceGetPowerUsage"))
        reasons = dev.int_("clocks event reasons", _fn("nvmlDeviceGetCurrentClocksEventReasons"),
                           _fn("nvmlDeviceGetCurrentClocksThrottleReasons"))
        return GpuReading(
            gpu=info, at=at, ecc=ecc, retired_pages=retired, remapped_rows=remapped,
            nvlink=nvlink, pcie_replays=pcie, temperature_c=temp,
            power_w=None if power_mw is None else power_mw / 1000.0,
            clocks_event_reasons=None if reasons is None else decode_clocks_event_reasons(reasons),
            errors=tuple(dev.errors))

    @staticmethod
    def _retired_pages(dev: _Device) -> RetiredPages | None:
        get_pages = _fn("nvmlDeviceGetRetiredPages")
        sbe = dev.call("retired pages (multiple SBE)", get_pages, args=(
            int(pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),))
        dbe = dev.call("retired pages (DBE)", get_pages, args=(
            int(pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),))
        pending = dev.int_("retired pages pending", _fn("nvmlDeviceGetRetiredPagesPendingStatus"))
        if sbe is None and dbe is None and pending is None:
            return None
        return RetiredPages(multiple_single_bit=None if sbe is None else len(sbe),
                            double_bit=None if dbe is None else len(dbe),
                            pending=None if pending is None else bool(pending))

    @staticmethod
    def _nvlink(dev: _Device) -> NvlinkCounters | None:
        state_fn = _fn("nvmlDeviceGetNvLinkState")
        counter_fn = _fn("nvmlDeviceGetNvLinkErrorCounter")
        present = 0
        active = 0
        sums: dict[str, int | None] = dict.fromkeys(name for name, _ in _NVLINK_COUNTERS)
        for link in range(int(pynvml.NVML_NVLINK_MAX_LINKS)):
            try:
                state = state_fn(dev.handle, link)
            except pynvml.NVMLError as e:
                code = error_code(e)
                if code == GPU_IS_LOST:
                    raise _GpuLost(f"nvlink {link} state") from e
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

    # -- events --------------------------------------------------------------------------------

    def start_events(self, callback: Callable[[GpuEvent], None], *,
                     on_stop: Callable[[], None] | None = None) -> None:
        """Watch NVML events in a dedicated thread; ``callback(event)`` runs in that thread.

        Registers :attr:`event_types` (masked by what each GPU supports) on every reachable
        GPU, then loops on ``nvmlEventSetWait_v2`` with :attr:`wait_timeout_ms`. When the wait
        reports NVML_ERROR_GPU_IS_LOST the GPUs are probed, each newly lost one is delivered
        as an :attr:`EventKind.GPU_LOST` event, and the event set is rebuilt without it (so the
        other GPUs' events keep coming). ``on_stop`` runs in the thread when it ends.
        """
        if not self._opened:
            raise RuntimeError("NvmlReader.start_events() before open()")
        if self._thread is not None:
            raise RuntimeError("the NVML event watcher is already running")
        event_set = self._new_event_set()
        self._event_set = event_set
        self._stopping.clear()
        self._watch_error = None
        self._thread = threading.Thread(target=self._watch, args=(callback, on_stop),
                                        name="nvml-events", daemon=True)
        self._thread.start()

    def _new_event_set(self) -> Any:
        """A new event set registered on every GPU not known to be lost. Raises ConfigError."""
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as e:
            raise ConfigError(f"nvmlEventSetCreate failed: {describe(e)}; {HINT}") from e
        registered: dict[int, int] = {}
        with self._lock:
            lost = set(self._lost_reported)
        for info, handle in zip(self._gpus, self._handles, strict=True):
            if handle is None or info.index in lost:
                continue
            try:
                supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
                mask = supported & self.event_types
                if mask:
                    pynvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                    registered[info.index] = mask
            except pynvml.NVMLError as e:
                if error_code(e) == UNKNOWN:  # NVML: the set must be freed after UNKNOWN here
                    _free_event_set(event_set)
                    raise ConfigError(f"registering NVML events for GPU {info.index} failed: "
                                      f"{describe(e)}") from e
                log.warning("GPU %d %s: no NVML events: %s", info.index, info.uuid,
                            describe(e))
        self.registered = registered
        return event_set

    def _replace_event_set(self) -> None:
        """From the watcher thread: swap in a new event set without the lost GPUs."""
        try:
            fresh = self._new_event_set()
        except ConfigError as e:
            log.warning("keeping the old NVML event set: %s", e)
            return
        old, self._event_set = self._event_set, fresh
        if old is not None:
            _free_event_set(old)

    def _watch(self, callback: Callable[[GpuEvent], None],
               on_stop: Callable[[], None] | None) -> None:
        failures = 0
        try:
            while not self._stopping.is_set():
                try:
                    data = pynvml.nvmlEventSetWait_v2(self._event_set, self.wait_timeout_ms)
                except pynvml.NVMLError as e:
                    code = error_code(e)
                    if code == TIMEOUT:
                        failures = 0
                        continue
                    if code == GPU_IS_LOST:
                        lost = self._probe_lost()
                        for ev in lost:
                            self._deliver(callback, ev)
                        if lost:
                            self._replace_event_set()
                            failures = 0
                            continue
                        log.warning("nvmlEventSetWait_v2 says a GPU is lost; no new one found")
                    else:
                        log.warning("nvmlEventSetWait_v2: %s", describe(e))
                    # back off so a wait that keeps failing at once does not spin
                    failures += 1
                    self._stopping.wait(min(self.wait_timeout_ms / 1000.0, 0.01 * 2 ** failures))
                    continue
                failures = 0
                self._deliver(callback, self._decode(data))
        except BaseException as e:  # the thread must not die silently
            self._watch_error = e
            log.exception("the NVML event watcher stopped")
        finally:
            if on_stop is not None:
                on_stop()

    def _decode(self, data: Any) -> GpuEvent:
        at = self._clock()
        index = self._by_address.get(_address(data.device), -1)
        if index < 0:
            try:
                index = int(pynvml.nvmlDeviceGetIndex(data.device))
            except pynvml.NVMLError:
                index = -1
        info = self._gpus[index] if 0 <= index < len(self._gpus) else GpuInfo(index=index)
        event_type = int(data.eventType)
        payload = int(data.eventData)
        kind = decode_event_kind(event_type)
        return GpuEvent(index=info.index, uuid=info.uuid, serial=info.serial, kind=kind,
                        event_type=event_type, at=at,
                        xid=payload if kind is EventKind.XID else None, data=payload)

    def _probe_lost(self) -> list[GpuEvent]:
        """After the wait said GPU_IS_LOST: which GPUs are lost now (each reported once)."""
        at = self._clock()
        lost: list[GpuEvent] = []
        for info, handle in zip(self._gpus, self._handles, strict=True):
            if handle is None:
                continue
            try:
                pynvml.nvmlDeviceGetUUID(handle)
                continue
            except pynvml.NVMLError as e:
                if error_code(e) != GPU_IS_LOST:
                    continue
            with self._lock:
                if info.index in self._lost_reported:
                    continue
                self._lost_reported.add(info.index)
            lost.append(GpuEvent(index=info.index, uuid=info.uuid, serial=info.serial,
                                 kind=EventKind.GPU_LOST, event_type=0, at=at))
        return lost

    @staticmethod
    def _deliver(callback: Callable[[GpuEvent], None], ev: GpuEvent) -> None:
        try:
            callback(ev)
        except Exception:
            log.exception("NVML event callback failed for %s", ev)

    def stop_events(self, timeout: float | None = None) -> bool:
        """Stop the watcher thread; True when it ended within ``timeout`` (default: the wait
        timeout plus 2 s) and the event set was freed."""
        with self._stop_lock:
            thread = self._thread
            if thread is None:
                return True
            self._stopping.set()
            deadline = self.wait_timeout_ms / 1000.0 + 2.0 if timeout is None else timeout
            if thread is not threading.current_thread():
                thread.join(deadline)
            if thread.is_alive():
                log.error("the NVML event watcher did not stop within %.1f s", deadline)
                return False
            self._thread = None
            if self._event_set is not None:
                _free_event_set(self._event_set)
                self._event_set = None
            return True

    async def events(self) -> AsyncIterator[GpuEvent]:
        """The watcher's events in asyncio (the callback hops over with call_soon_threadsafe).

        Starts the watcher; ends when it stops (``stop``/``stop_events``); leaving the loop
        (``aclose``, or ``contextlib.aclosing``) stops the watcher. Raises TransientError if the
        watcher died of an unexpected error.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[GpuEvent | None] = asyncio.Queue()

        def put(ev: GpuEvent | None) -> None:
            # RuntimeError: the loop is closed, nobody is listening any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, ev)

        self.start_events(put, on_stop=lambda: put(None))
        try:
            while (ev := await queue.get()) is not None:
                yield ev
            err = self._watch_error
            if err is not None:
                raise TransientError(f"the NVML event watcher stopped: {err!r}") from err
        finally:
            await asyncio.to_thread(self.stop_events)


def _free_event_set(event_set: Any) -> None:
    try:
        pynvml.nvmlEventSetFree(event_set)
    except pynvml.NVMLError as e:
        log.warning("nvmlEventSetFree: %s", describe(e))


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _init_message(err: BaseException) -> str:
    code = error_code(err)
    cause = err.__context__  # pynvml raises inside `except OSError` around its CDLL call
    if code == LIBRARY_NOT_FOUND and (isinstance(cause, OSError) or pynvml.nvmlLib is None):
        why = f": {cause}" if isinstance(cause, OSError) else ""
        return (f"NVML initialisation failed: cannot load libnvidia-ml.so.1{why} "
                f"[{error_name(code)}]; {HINT}")
    return f"NVML initialisation failed: nvmlInit returned {describe(err)}; {HINT}"
