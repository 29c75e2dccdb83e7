"""The ``spareValidation`` block of FleetGuardrails, layer two: its cross-field rules, and its
compiled form (:class:`healer.core.spare_validation.SpareValidation`).

``interval`` must be shorter than ``maxAge`` (else an idle spare's result goes stale between
two runs and every claim waits for a validation), the checks are distinct, and
``ncclBusBandwidthGBps`` is given exactly when ``nccl-loopback`` runs, one entry per GPU model
(``NVIDIA H100 80GB HBM3`` and ``NVIDIA-H100-80GB-HBM3`` are one model).
"""

from __future__ import annotations

from typing import Protocol

from healer.core.spare_validation import (
    DEFAULT_MODEL,
    SpareCheck,
    SpareValidation,
    bandwidth_table,
    model_key,
)
from healer.policy import schema as s

Path = tuple[str | int, ...]


class IssueSink(Protocol):
    def __call__(self, path: Path, message: str) -> None: ...


def compile_spare_validation(spec: s.SpareValidationSpec | None, path: Path,
                             issue: IssueSink) -> SpareValidation:
    if spec is None:
        return SpareValidation()
    if spec.interval >= spec.max_age:
        issue((*path, "interval"), f"expected an interval shorter than maxAge "
                                   f"({spec.max_age:g}s), got {spec.interval:g}s: idle spares "
                                   "would go stale between two validations")
    for i, c in enumerate(spec.checks):
        if c in spec.checks[:i]:
            issue((*path, "checks", i), f"check {c!r} is listed twice")
    nccl = SpareCheck.NCCL_LOOPBACK.value in spec.checks
    thresholds = spec.nccl_bus_bandwidth_gbps
    if nccl and not thresholds:
        issue((*path, "ncclBusBandwidthGBps"),
              "expected a bus bandwidth threshold per GPU model (and a default) for the "
              "nccl-loopback check")
    if thresholds and not nccl:
        issue((*path, "ncclBusBandwidthGBps"),
              "thresholds are given but checks does not run nccl-loopback")
    seen: dict[str, str] = {}
    for model in thresholds:
        key = DEFAULT_MODEL if model == DEFAULT_MODEL else model_key(model)
        if key in seen:
            issue((*path, "ncclBusBandwidthGBps", model),
                  f"GPU model {model!r} is the same model as {seen[key]!r}")
        seen.setdefault(key, model)
    return SpareValidation(enabled=True, max_age=spec.max_age, on_claim=spec.on_claim,
                           interval=spec.interval,
                           checks=tuple(SpareCheck(c) for c in dict.fromkeys(spec.checks)),
                           bus_bandwidth_gbps=bandwidth_table(thresholds),
                           max_parallel=spec.max_parallel, deadline=spec.deadline)
