"""The node agent's NVML side: :class:`NvmlReader`, the one object the agent holds.

It opens NVML, enumerates the GPUs, reads their health counters on demand and runs the event
watcher; the work is done by three modules, each with one role:

* :mod:`healer.agent.nvml_calls` — the typed layer over ``pynvml`` (error codes, messages);
* :mod:`healer.agent.nvml_counters` — one GPU's identity and counters into the findings' types;
* :mod:`healer.agent.nvml_events` — the event watcher thread and its asyncio form.

Errors:

* the library missing or NVML failing to initialise raises :class:`healer.errors.ConfigError`
  with what failed, the NVML error and a hint;
* ``NVML_ERROR_NOT_SUPPORTED`` (and FUNCTION_NOT_FOUND on older drivers) reads as ``None``;
* ``NVML_ERROR_GPU_IS_LOST`` marks that GPU's reading ``lost``; the other GPUs are still read.

Events: :meth:`NvmlReader.start_events` runs ``nvmlEventSetWait_v2`` in one dedicated thread
with a short timeout, so an event reaches the callback as soon as NVML has it (the timeout only
bounds how long :meth:`NvmlReader.stop` waits). :meth:`NvmlReader.events` is the asyncio form.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any

import pynvml

from healer.agent.findings import GpuEvent, GpuInfo, GpuReading
from healer.agent.nvml_calls import (
    FUNCTION_NOT_FOUND,
    GPU_IS_LOST,
    HINT,
    INVALID_ARGUMENT,
    LIBRARY_NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    TIMEOUT,
    UNKNOWN,
    describe,
    error_code,
    error_name,
    init_message,
)
from healer.agent.nvml_counters import (
    CLOCKS_EVENT_REASONS,
    decode_clocks_event_reasons,
    identify,
    read_gpu,
)
from healer.agent.nvml_events import (
    DEFAULT_EVENT_TYPES,
    NvmlEventWatcher,
    decode_event_kind,
    watch_events,
)
from healer.errors import ConfigError

__all__ = [
    "CLOCKS_EVENT_REASONS", "DEFAULT_EVENT_TYPES", "FUNCTION_NOT_FOUND", "GPU_IS_LOST", "HINT",
    "INVALID_ARGUMENT", "LIBRARY_NOT_FOUND", "NOT_SUPPORTED", "SUCCESS", "TIMEOUT", "UNKNOWN",
    "NvmlReader", "decode_clocks_event_reasons", "decode_event_kind", "describe", "error_code",
    "error_name",
]

log = logging.getLogger(__name__)


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
        self._clock = clock
        self._opened = False
        self._driver = ""
        self._gpus: tuple[GpuInfo, ...] = ()
        self._handles: list[Any] = []
        self._watcher = NvmlEventWatcher(wait_timeout_ms=wait_timeout_ms,
                                         event_types=event_types, clock=clock)

    # -- life cycle ----------------------------------------------------------------------------

    def open(self) -> NvmlReader:
        """Initialise NVML and enumerate the GPUs. Raises ConfigError when NVML is unusable."""
        if self._opened:
            return self
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise ConfigError(init_message(e)) from e
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
            info, handle = identify(index)
            gpus.append(info)
            handles.append(handle)
        self._gpus = tuple(gpus)
        self._handles = handles
        self._watcher.use(self._gpus, handles)
        self._opened = True
        log.info("NVML %s: %d GPUs", self._driver, count)
        return self

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
    def wait_timeout_ms(self) -> int:
        """How long one ``nvmlEventSetWait_v2`` waits (bounds how long a stop waits)."""
        return self._watcher.wait_timeout_ms

    @wait_timeout_ms.setter
    def wait_timeout_ms(self, value: int) -> None:
        self._watcher.wait_timeout_ms = value

    @property
    def event_types(self) -> int:
        """The NVML event types the watcher registers for (masked by what each GPU supports)."""
        return self._watcher.event_types

    @event_types.setter
    def event_types(self, value: int) -> None:
        self._watcher.event_types = value

    @property
    def driver_version(self) -> str:
        return self._driver

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._gpus

    @property
    def watching(self) -> bool:
        """True while the event watcher thread runs."""
        return self._watcher.watching

    @property
    def registered(self) -> dict[int, int]:
        """GPU index -> the event mask the watcher registered for it."""
        return self._watcher.registered

    def read(self) -> list[GpuReading]:
        """Read every GPU's counters now. A lost GPU reads ``lost=True``; the rest still read."""
        if not self._opened:
            raise RuntimeError("NvmlReader.read() before open()")
        return [read_gpu(info, handle, self._clock())
                for info, handle in zip(self._gpus, self._handles, strict=True)]

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
        self._watcher.start(callback, on_stop=on_stop)

    def stop_events(self, timeout: float | None = None) -> bool:
        """Stop the watcher thread; True when it ended within ``timeout`` (default: the wait
        timeout plus 2 s) and the event set was freed."""
        return self._watcher.stop(timeout)

    def events(self) -> AsyncIterator[GpuEvent]:
        """The watcher's events in asyncio (the callback hops over with call_soon_threadsafe).

        Starts the watcher; ends when it stops (``stop``/``stop_events``); leaving the loop
        (``aclose``, or ``contextlib.aclosing``) stops the watcher. Raises TransientError if the
        watcher died of an unexpected error.
        """
        return watch_events(self.start_events, self.stop_events,
                            lambda: self._watcher.watch_error)
