"""The NVML event watcher: one dedicated thread waiting on an NVML event set, and its asyncio form.

:class:`NvmlEventWatcher` runs ``nvmlEventSetWait_v2`` with a short timeout, so an event reaches
the callback as soon as NVML has it (the timeout only bounds how long a stop waits). An event is
translated into a :class:`GpuEvent` (which GPU, which kind, the XID). When the wait reports
NVML_ERROR_GPU_IS_LOST the GPUs are probed, each newly lost one is delivered once as an
:attr:`EventKind.GPU_LOST` event, and the event set is rebuilt without it.
:class:`healer.agent.nvml.NvmlReader` owns one watcher and hands it the GPUs it enumerated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pynvml

from healer.agent.findings import EventKind, GpuEvent, GpuInfo
from healer.agent.nvml_calls import (
    GPU_IS_LOST,
    HINT,
    TIMEOUT,
    UNKNOWN,
    describe,
    error_code,
    handle_address,
)
from healer.errors import ConfigError, TransientError

log = logging.getLogger("healer.agent.nvml")

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


def decode_event_kind(event_type: int) -> EventKind:
    return _EVENT_KINDS.get(event_type, EventKind.OTHER)


class NvmlEventWatcher:
    """Watches NVML events on the GPUs given to :meth:`use`, in one thread at a time."""

    def __init__(self, *, wait_timeout_ms: int, event_types: int,
                 clock: Callable[[], float]) -> None:
        self.wait_timeout_ms = wait_timeout_ms
        self.event_types = event_types
        self._clock = clock
        self._lock = threading.Lock()
        self._gpus: tuple[GpuInfo, ...] = ()
        self._handles: list[Any] = []
        self._by_address: dict[int, int] = {}
        self._lost_reported: set[int] = set()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._stop_lock = threading.Lock()
        self._event_set: Any = None
        self.watch_error: BaseException | None = None
        self.registered: dict[int, int] = {}  # GPU index -> event mask registered for it

    def use(self, gpus: tuple[GpuInfo, ...], handles: list[Any]) -> None:
        """The GPUs (and their NVML handles, ``None`` where there is none) to watch."""
        self._gpus = gpus
        self._handles = handles
        for info, handle in zip(gpus, handles, strict=True):
            if handle is not None:
                self._by_address[handle_address(handle)] = info.index

    @property
    def watching(self) -> bool:
        """True while the watcher thread runs."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def start(self, callback: Callable[[GpuEvent], None], *,
              on_stop: Callable[[], None] | None = None) -> None:
        """Register :attr:`event_types` on every reachable GPU and start the thread."""
        if self._thread is not None:
            raise RuntimeError("the NVML event watcher is already running")
        event_set = self._new_event_set()
        self._event_set = event_set
        self._stopping.clear()
        self.watch_error = None
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
                    free_event_set(event_set)
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
            free_event_set(old)

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
            self.watch_error = e
            log.exception("the NVML event watcher stopped")
        finally:
            if on_stop is not None:
                on_stop()

    def _decode(self, data: Any) -> GpuEvent:
        at = self._clock()
        index = self._by_address.get(handle_address(data.device), -1)
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

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the thread; True when it ended within ``timeout`` (default: the wait timeout
        plus 2 s) and the event set was freed."""
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
                free_event_set(self._event_set)
                self._event_set = None
            return True


async def watch_events(start: Callable[..., None],
                       stop: Callable[[], bool],
                       watch_error: Callable[[], BaseException | None]) -> AsyncIterator[GpuEvent]:
    """A watcher's events in asyncio (the callback hops over with call_soon_threadsafe).

    ``start(callback, on_stop=...)`` starts the watcher; the iterator ends when it stops;
    leaving the loop calls ``stop`` (in a thread). Raises TransientError if the watcher died
    of an unexpected error (``watch_error()``).
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[GpuEvent | None] = asyncio.Queue()

    def put(ev: GpuEvent | None) -> None:
        # RuntimeError: the loop is closed, nobody is listening any more
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(queue.put_nowait, ev)

    start(put, on_stop=lambda: put(None))
    try:
        while (ev := await queue.get()) is not None:
            yield ev
        err = watch_error()
        if err is not None:
            raise TransientError(f"the NVML event watcher stopped: {err!r}") from err
    finally:
        await asyncio.to_thread(stop)


def free_event_set(event_set: Any) -> None:
    try:
        pynvml.nvmlEventSetFree(event_set)
    except pynvml.NVMLError as e:
        log.warning("nvmlEventSetFree: %s", describe(e))
