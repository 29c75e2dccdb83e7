"""Series labels → node and GPU, and sample values, without an object per sample."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from healer.adapters.prometheus.promql import DEFAULT_HOST_LABELS
from healer.core.model import GpuRef

_INF = float("inf")


#: The longest node name (Kubernetes allows 253 characters); a longer host label names no node.
MAX_NODE_NAME = 253


def node_name(labels: Mapping[str, str],
              host_labels: Sequence[str] = DEFAULT_HOST_LABELS) -> str | None:
    """The node of a series: the first non-empty host label (``Hostname`` or ``hostname``)
    of at most ``MAX_NODE_NAME`` characters."""
    for lb in host_labels:
        v = labels.get(lb)
        if v and isinstance(v, str):
            v = v.strip()
            if v and len(v) <= MAX_NODE_NAME:
                return v
    return None


def gpu_ref(labels: Mapping[str, str]) -> GpuRef | None:
    """The GPU of a series (``gpu`` index, ``UUID``/``uuid``, serial label); None if none."""
    return _make_ref(labels.get("gpu"), labels.get("UUID") or labels.get("uuid"),
                     labels.get("DCGM_FI_DEV_SERIAL"))


def _make_ref(index_text: Any, uuid: Any, serial: Any) -> GpuRef | None:
    index_text = index_text.strip() if isinstance(index_text, str) else ""
    uuid = uuid.strip() if isinstance(uuid, str) else ""
    if not index_text and not uuid:
        return None
    try:
        index = int(index_text) if index_text else -1
    except ValueError:
        index = -1
    return GpuRef(index, uuid, serial.strip() if isinstance(serial, str) else "")


class GpuCache:
    """One :class:`GpuRef` per (index, UUID, serial) label tuple, reused across polls."""

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: dict[tuple[Any, Any, Any], GpuRef | None] = {}

    def __call__(self, labels: Mapping[str, Any]) -> GpuRef | None:
        get = labels.get
        key = (get("gpu"), get("UUID") or get("uuid"), get("DCGM_FI_DEV_SERIAL"))
        try:
            return self._refs[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable label value (a malformed answer)
            return _make_ref(*key)
        if len(self._refs) > 1_000_000:  # GPUs come and go over months: never unbounded
            self._refs.clear()
        ref = self._refs[key] = _make_ref(*key)
        return ref


def reading(raw: Any) -> tuple[float, float] | None:
    """``[time, "value"]`` → (time, value); None unless both are finite numbers."""
    try:
        t, v = float(raw[0]), float(raw[1])
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    if -_INF < v < _INF and -_INF < t < _INF:
        return t, v
    return None


def sample(entry: Any) -> tuple[float, float] | None:
    """The one finite sample of an instant-vector entry, or None."""
    raw = entry.get("value") if isinstance(entry, dict) else None
    if not isinstance(raw, list | tuple) or len(raw) != 2:
        return None
    return reading(raw)


def samples(entry: Any) -> list[tuple[float, float]]:
    """The finite samples of a range-vector entry (malformed points are skipped)."""
    raw = entry.get("values") if isinstance(entry, dict) else None
    if not isinstance(raw, list | tuple):
        return []
    out: list[tuple[float, float]] = []
    for point in raw:
        one = reading(point)
        if one is not None:
            out.append(one)
    return out


def labels_of(entry: Any) -> dict[str, Any] | None:
    """An entry's ``metric`` label map; None if the entry is not shaped like one."""
    if not isinstance(entry, dict):
        return None
    labels = entry.get("metric")
    if labels is None:
        return {}
    return labels if isinstance(labels, dict) else None
