"""Warm spares stay healthy while they wait: the pure half of spare validation.

A spare is validated (the policy's checks, each a Job on the spare: ``dcgm-diag``,
``nccl-loopback``) before it is claimed and periodically while idle. Its last result is kept on
the spare Node (annotation ``SPARE_VALIDATION``) and a run in progress is named there before its
first Job starts (``SPARE_VALIDATION_RUN``), so a restarted leader neither forgets a result nor
starts a second run. This module decides, from those two annotations, the fleet's
``spareValidation`` settings and ``now`` (passed in):

* :func:`readiness` — may a claim take this spare (recent and passed), must it be validated
  first (none or stale, ``onClaim``), skipped (none or stale, no ``onClaim``), waited for (a run
  in progress), or never (its last validation failed)?
* :func:`plan_periodic` — which idle spares the periodic loop polls and which it starts, at most
  ``maxParallel`` runs at a time, oldest result first.

How one check's output is judged is :mod:`healer.core.spare_checks`.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from healer.core.timefmt import parse_rfc3339, rfc3339

#: The key of ``ncclBusBandwidthGBps`` that applies to a GPU model the policy does not name.
DEFAULT_MODEL = "default"
#: At most this many characters of detail are kept in the annotation.
DETAIL_LIMIT = 1000


class SpareCheck(enum.StrEnum):
    """A validation a spare can run; each is a Job template shipped in ``deploy/validation``."""

    DCGM_DIAG = "dcgm-diag"  # dcgmi diag -r 2: exit code and the JSON's per-test results
    NCCL_LOOPBACK = "nccl-loopback"  # all_reduce_perf on every GPU of the node: bus bandwidth


def model_key(model: str) -> str:
    """GPU model names compare as GPU feature discovery writes them in ``nvidia.com/gpu.product``
    (``NVIDIA-H100-80GB-HBM3``): spaces and underscores are dashes, case does not matter."""
    return re.sub(r"[\s_]+", "-", model.strip()).lower()


@dataclass(frozen=True, slots=True)
class SpareValidation:
    """The compiled ``spareValidation`` block of FleetGuardrails (disabled when absent)."""

    enabled: bool = False
    max_age: float = 86400.0  # a result older than this is not recent
    on_claim: bool = True  # no recent result: validate the candidate on claim (else skip it)
    interval: float = 21600.0  # idle spares are validated this often
    checks: tuple[SpareCheck, ...] = (SpareCheck.DCGM_DIAG,)
    #: (model_key, GB/s) of ncclBusBandwidthGBps, DEFAULT_MODEL included when given
    bus_bandwidth_gbps: tuple[tuple[str, float], ...] = ()
    max_parallel: int = 2  # periodic runs at once
    deadline: float = 1800.0  # each Job's activeDeadlineSeconds
    source: str = field(default="", compare=False)

    def bus_bandwidth_threshold(self, model: str) -> float | None:
        """The minimum all-reduce bus bandwidth (GB/s) for GPU ``model``: its own entry, else
        the ``default`` entry, else None (no threshold: the check fails, naming the model)."""
        table = dict(self.bus_bandwidth_gbps)
        if model and model_key(model) in table:
            return table[model_key(model)]
        return table.get(DEFAULT_MODEL)


def _load(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """A spare's last validation, as kept in its ``SPARE_VALIDATION`` annotation."""

    passed: bool
    at: float
    checks: tuple[str, ...]
    detail: str = ""
    #: False: a check could not run at all (its Job ended with no report: not scheduled,
    #: refused by admission, past its deadline before starting); the spare is out of the pool
    #: but not sent to repair, and the periodic loop tries again after ``interval``
    ran: bool = True

    def to_annotation(self) -> str:
        return json.dumps({"result": "passed" if self.passed else "failed",
                           "at": rfc3339(self.at), "checks": list(self.checks),
                           "detail": self.detail[:DETAIL_LIMIT], "ran": self.ran},
                          sort_keys=True)

    @classmethod
    def from_annotation(cls, text: str | None) -> ValidationResult | None:
        """The result, or None when there is none or it cannot be read (an unreadable result
        is no result: the spare is validated again, never trusted)."""
        doc = _load(text)
        if doc is None or doc.get("result") not in ("passed", "failed"):
            return None
        at = parse_rfc3339(doc.get("at"))
        checks = doc.get("checks")
        if at is None or not isinstance(checks, list):
            return None
        return cls(doc["result"] == "passed", at, tuple(str(c) for c in checks),
                   str(doc.get("detail") or ""), doc.get("ran") is not False)


@dataclass(frozen=True, slots=True)
class ValidationRun:
    """A run in progress (``SPARE_VALIDATION_RUN``): written before its first Job starts; its
    Jobs are named after ``run``, so they are found again after a restart."""

    run: str
    at: float
    checks: tuple[str, ...]

    def to_annotation(self) -> str:
        return json.dumps({"run": self.run, "at": rfc3339(self.at), "checks": list(self.checks)},
                          sort_keys=True)

    @classmethod
    def start(cls, now: float, checks: Sequence[str]) -> ValidationRun:
        """A run started at ``now``, named after it to the millisecond (a later run of the same
        spare never reuses an earlier run's Jobs)."""
        stamp = re.sub(r"[-:Z]", "", rfc3339(now)).lower()  # 20240501t120000
        return cls(f"{stamp}{int(now * 1000) % 1000:03d}z", now, tuple(checks))

    @classmethod
    def from_annotation(cls, text: str | None) -> ValidationRun | None:
        doc = _load(text)
        if doc is None or not isinstance(doc.get("run"), str) or not doc["run"]:
            return None
        at = parse_rfc3339(doc.get("at"))
        checks = doc.get("checks")
        if at is None or not isinstance(checks, list) or not checks:
            return None
        return cls(re.sub(r"[^a-z0-9]", "", doc["run"].lower())[:32] or "run", at,
                   tuple(str(c) for c in checks))


class Readiness(enum.Enum):
    CLAIMABLE = "claimable"  # a recent, passed validation (or validation is off)
    VALIDATE = "validate"  # none or stale: validate it before claiming (onClaim)
    SKIP = "skip"  # none or stale and no onClaim: not this spare
    VALIDATING = "validating"  # a run is in progress: wait for it
    FAILED = "failed"  # its last validation failed: never claimed (it goes to repair)


def is_recent(result: ValidationResult, policy: SpareValidation, now: float) -> bool:
    """Passed or not, ``result`` covers every check the policy runs and is at most ``maxAge``
    old."""
    return (set(policy.checks) <= set(result.checks)
            and now - result.at <= policy.max_age)


def readiness(result: ValidationResult | None, run: ValidationRun | None,
              policy: SpareValidation, now: float) -> Readiness:
    """What a claim may do with a spare (see the module docstring)."""
    if not policy.enabled:
        return Readiness.CLAIMABLE
    if run is not None:
        return Readiness.VALIDATING
    if result is not None and not result.passed:
        return Readiness.FAILED
    if result is not None and is_recent(result, policy, now):
        return Readiness.CLAIMABLE
    return Readiness.VALIDATE if policy.on_claim else Readiness.SKIP


@dataclass(frozen=True, slots=True)
class SpareState:
    """What the periodic loop knows of one idle spare."""

    name: str
    result: ValidationResult | None
    run: ValidationRun | None


@dataclass(frozen=True, slots=True)
class PeriodicPlan:
    poll: tuple[str, ...]  # runs in progress: read their Jobs
    start: tuple[str, ...]  # due: start a run


def due(state: SpareState, policy: SpareValidation, now: float) -> bool:
    """An idle spare is due when it has no run in progress and no passed result younger than
    ``interval`` covering every check (a failed spare waits for repair, not for a rerun; one
    whose checks could not run is tried again after ``interval``)."""
    if not policy.enabled or state.run is not None:
        return False
    r = state.result
    if r is None:
        return True
    if not r.passed:
        return not r.ran and now - r.at >= policy.interval
    return not set(policy.checks) <= set(r.checks) or now - r.at >= policy.interval


def plan_periodic(spares: Sequence[SpareState], policy: SpareValidation,
                  now: float) -> PeriodicPlan:
    """Poll every run in progress; start due spares (never validated first, then the oldest
    result) while fewer than ``maxParallel`` runs are in progress."""
    if not policy.enabled:
        return PeriodicPlan((), ())
    running = tuple(sorted(s.name for s in spares if s.run is not None))
    room = max(0, policy.max_parallel - len(running))
    waiting = sorted((s for s in spares if due(s, policy, now)),
                     key=lambda s: (s.result.at if s.result else float("-inf"), s.name))
    return PeriodicPlan(running, tuple(s.name for s in waiting[:room]))


def bandwidth_table(values: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """``ncclBusBandwidthGBps`` as :class:`SpareValidation` keeps it (model keys normalised)."""
    return tuple(sorted((DEFAULT_MODEL if k == DEFAULT_MODEL else model_key(k), float(v))
                        for k, v in values.items()))
