"""The typed, error-translating layer over ``pynvml`` that the rest of the agent's NVML side uses.

``pynvml`` (nvidia-ml-py) loads ``libnvidia-ml.so.1`` through ctypes and its calls are untyped;
every call the agent makes goes through a helper here. What an NVML return code means to the
agent is decided here too:

* ``NVML_ERROR_NOT_SUPPORTED`` (and FUNCTION_NOT_FOUND on older drivers) reads as ``None``;
* ``NVML_ERROR_GPU_IS_LOST`` raises :class:`GpuLost` (the caller marks that GPU lost);
* any other error is noted on the :class:`DeviceCalls` (``errors``) and reads as ``None``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml

HINT = ("is the NVIDIA driver installed and loaded on this node, and are its libraries and the "
        "device plugin's /dev/nvidia* mounted into this container (NVIDIA container runtime)?")

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


def handle_address(handle: Any) -> int:
    """The address behind an NVML device handle (how an event names its device)."""
    value = ctypes.cast(handle, ctypes.c_void_p).value
    return int(value) if value is not None else 0


class GpuLost(Exception):
    """An NVML call on one GPU returned NVML_ERROR_GPU_IS_LOST; ``what`` names the call."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class DeviceCalls:
    """Calls on one device handle: NOT_SUPPORTED → None, GPU_IS_LOST → GpuLost, else noted."""

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
                    raise GpuLost(what) from e
                if code == FUNCTION_NOT_FOUND:
                    continue
                if code != NOT_SUPPORTED:
                    self.errors.append(f"{what}: {describe(e)}")
                return None
        return None

    def int_(self, what: str, *fns: Callable[..., Any], args: tuple[Any, ...] = ()) -> int | None:
        value = self.call(what, *fns, args=args)
        return None if value is None else int(value)


def nvml_function(name: str) -> Callable[..., Any]:
    """A pynvml function by name; one missing from an older pynvml reads as FUNCTION_NOT_FOUND."""
    fn = getattr(pynvml, name, None)
    if fn is not None:
        return fn  # type: ignore[no-any-return]

    def missing(*_: Any) -> Any:
        raise pynvml.NVMLError(FUNCTION_NOT_FOUND)

    return missing


def text(value: Any) -> str:
    """An NVML string (bytes on some pynvml versions) as str; ``None`` as ``""``."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def init_message(err: BaseException) -> str:
    """What to tell the operator when ``nvmlInit`` failed."""
    code = error_code(err)
    cause = err.__context__  # pynvml raises inside `except OSError` around its CDLL call
    if code == LIBRARY_NOT_FOUND and (isinstance(cause, OSError) or pynvml.nvmlLib is None):
        why = f": {cause}" if isinstance(cause, OSError) else ""
        return (f"NVML initialisation failed: cannot load libnvidia-ml.so.1{why} "
                f"[{error_name(code)}]; {HINT}")
    return f"NVML initialisation failed: nvmlInit returned {describe(err)}; {HINT}"
