"""Spare validation, acted out: runs a spare's checks, keeps the result on the Node, and takes a
spare that fails out of the pool.

The decisions are the core's (:mod:`healer.core.spare_validation`, :mod:`healer.core.spare_checks`);
this adapter does what they say through the ports:

* :meth:`SpareValidator.start` writes the run (``SPARE_VALIDATION_RUN``) on the spare *before*
  its first Job starts; :meth:`SpareValidator.advance` runs the run's checks in order, one Job
  each (named after the spare, the run and the check, so a restarted leader finds the same
  Jobs), and when the last has finished writes the result (``SPARE_VALIDATION``) and clears the
  run, in one patch.
* A spare that fails gets ``SPARE_FAILED_LABEL`` (the spare label someone else set stays; the
  spare taint keeps work away), an Event ``SpareFailedValidation`` naming the check and the
  figure, and goes to repair through the repair hand-off (the ``RepairHook`` port). A check
  that could not run at all (its Job ended with no report: admission refused its pod, it never
  started before its deadline) says nothing about the hardware: the spare is out of the pool
  (its result failed, ``ran`` false), an Event ``SpareValidationNotRun`` says why, nothing goes
  to repair, and the periodic loop tries again after ``interval``.
* :meth:`SpareValidator.for_claim` is what a claim asks of one candidate;
  :meth:`SpareValidator.periodic_round` is one round of the periodic loop
  (:mod:`healer.runtime.spare_validation`), which also returns a failed spare whose repair
  passed to the pool (unvalidated: it is validated again before a claim takes it).

The Jobs themselves are behind :class:`CheckJobs` (``healer.adapters.kube.check_jobs``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from healer.core.model import NodeView
from healer.core.spare_checks import CheckOutcome, judge
from healer.core.spare_validation import (
    PeriodicPlan,
    Readiness,
    SpareState,
    SpareValidation,
    ValidationResult,
    ValidationRun,
    plan_periodic,
    readiness,
)
from healer.core.vocabulary import (
    CLAIMED_BY,
    REPAIR_INCIDENT,
    REPAIR_LABEL,
    REPAIR_RESULT,
    SPARE_FAILED_LABEL,
    SPARE_VALIDATION,
    SPARE_VALIDATION_RUN,
)
from healer.ports import Clock, EventRecorder, HookKind, HookSpec, NodeAPI, RepairHook

#: The node label GPU feature discovery sets to the GPU model (``NVIDIA-H100-80GB-HBM3``).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
#: Prefix of the repair incident a failed spare is handed to repair under.
SPARE_REPAIR_PREFIX = "spare-"


@dataclass(frozen=True, slots=True)
class CheckReport:
    """A finished check Job: its container's exit code and termination message (None/"" when
    no container ran, e.g. the Job hit its deadline; ``detail`` then says why)."""

    exit_code: int | None
    message: str = ""
    detail: str = ""
    dcgm_json: str | None = None  # a dcgm-diag report's JSON, decoded


class CheckJobs(Protocol):
    async def run(self, node: str, run: str, check: str, *, model: str,
                  deadline: float) -> CheckReport | None:
        """Start (once) or read the Job running ``check`` of ``run`` on ``node``; None while it
        runs."""
        ...


def spare_state(view: NodeView) -> SpareState:
    return SpareState(view.name,
                      ValidationResult.from_annotation(view.annotations.get(SPARE_VALIDATION)),
                      ValidationRun.from_annotation(view.annotations.get(SPARE_VALIDATION_RUN)))


def is_failed_spare(view: NodeView) -> bool:
    """Out of the pool: labelled failed, or its last validation failed."""
    if view.labels.get(SPARE_FAILED_LABEL):
        return True
    result = ValidationResult.from_annotation(view.annotations.get(SPARE_VALIDATION))
    return result is not None and not result.passed


class SpareValidator:
    def __init__(self, nodes: NodeAPI, events: EventRecorder, repair: RepairHook,
                 jobs: CheckJobs, *, settings: Callable[[], SpareValidation],
                 clock: Clock) -> None:
        self.nodes = nodes
        self.events = events
        self.repair = repair
        self.jobs = jobs
        self.settings = settings
        self.clock = clock
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def enabled(self) -> bool:
        return self.settings().enabled

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    # -- one spare ---------------------------------------------------------------------------

    async def start(self, name: str) -> ValidationRun:
        """Name a run on the spare (intent, before any Job), unless one is already named."""
        async with self._lock(name):
            view = await self.nodes.get(name)
            run = ValidationRun.from_annotation(view.annotations.get(SPARE_VALIDATION_RUN))
            if run is None:
                policy = self.settings()
                run = ValidationRun.start(self.clock.now(), [c.value for c in policy.checks])
                await self.nodes.patch_metadata(
                    name, annotations={SPARE_VALIDATION_RUN: run.to_annotation()})
        await self.advance(name)
        return run

    async def advance(self, name: str) -> ValidationResult | None:
        """Run the spare's named run on by one step: the result when it has just finished (or
        None while a check still runs, or when no run is named)."""
        async with self._lock(name):
            view = await self.nodes.get(name)
            run = ValidationRun.from_annotation(view.annotations.get(SPARE_VALIDATION_RUN))
            if run is None:
                return None
            policy = self.settings()
            model = view.labels.get(GPU_PRODUCT_LABEL, "")
            outcomes: list[CheckOutcome] = []
            ran = True
            for check in run.checks:
                report = await self.jobs.run(name, run.run, check, model=model,
                                             deadline=policy.deadline)
                if report is None:
                    return None
                outcomes.append(_outcome(check, report, model, policy))
                if not outcomes[-1].passed:
                    ran = report.exit_code is not None or bool(report.message)
                    break
            passed = all(o.passed for o in outcomes)
            detail = "; ".join(f"{o.check}: {o.detail}" for o in outcomes)
            result = ValidationResult(passed, self.clock.now(), run.checks, detail, ran)
            await self.nodes.patch_metadata(
                name, labels={SPARE_FAILED_LABEL: None if passed or not ran else "true"},
                annotations={SPARE_VALIDATION: result.to_annotation(),
                             SPARE_VALIDATION_RUN: None})
        if not passed and ran:
            await self._fail_out(name, run, outcomes[-1])
        elif not passed:
            await self.events.emit(
                key=f"spare-validation-not-run/{name}/{run.run}", node=name, type="Warning",
                reason="SpareValidationNotRun",
                note=f"{outcomes[-1].check} could not run on warm spare {name}: "
                     f"{outcomes[-1].detail}; the spare is out of the pool (not sent to "
                     f"repair) until a later run passes")
        return result

    async def _fail_out(self, name: str, run: ValidationRun, failed: CheckOutcome) -> None:
        figure = f" ({failed.figure})" if failed.figure else ""
        await self.events.emit(
            key=f"spare-failed-validation/{name}/{run.run}", node=name, type="Warning",
            reason="SpareFailedValidation",
            note=f"warm spare {name} failed {failed.check}{figure}: {failed.detail}; it left "
                 "the spare pool and was handed to repair")
        await self.repair.hand_off(f"{SPARE_REPAIR_PREFIX}{name}-{run.run}", name,
                                   HookSpec(HookKind.NONE))

    async def for_claim(self, spare: NodeView, *, may_start: bool) -> Readiness:
        """May a claim take ``spare`` now? A run in progress is advanced; with ``onClaim`` and
        no recent result a run is started when ``may_start`` (VALIDATING until it ends), else
        the answer is VALIDATE."""
        policy = self.settings()
        state = spare_state(spare)
        ready = readiness(state.result, state.run, policy, self.clock.now())
        if ready is Readiness.VALIDATING:
            result = await self.advance(spare.name)
            if result is None:
                return Readiness.VALIDATING
            return Readiness.CLAIMABLE if result.passed else Readiness.FAILED
        if ready is Readiness.VALIDATE:
            if not may_start:
                return Readiness.VALIDATE
            await self.start(spare.name)
            state = spare_state(await self.nodes.get(spare.name))
            return readiness(state.result, state.run, policy, self.clock.now())
        return ready

    # -- the pool ----------------------------------------------------------------------------

    async def periodic_round(self, spares: Sequence[NodeView]) -> PeriodicPlan:
        """One round over the spare pool: advance every run in progress, start the due idle
        spares (at most ``maxParallel`` runs at once), return repaired spares to the pool."""
        policy = self.settings()
        idle: list[SpareState] = []
        for v in spares:
            if v.labels.get(SPARE_FAILED_LABEL):  # in repair: back once repaired
                await self._return_if_repaired(v)
            elif not v.annotations.get(CLAIMED_BY):  # (a check that could not run: retried)
                idle.append(spare_state(v))
        plan = plan_periodic(idle, policy, self.clock.now())
        for name in plan.poll:
            await self.advance(name)
        for name in plan.start:
            await self.start(name)
        return plan

    async def _return_if_repaired(self, view: NodeView) -> None:
        incident = view.annotations.get(REPAIR_INCIDENT, "")
        if (not incident.startswith(SPARE_REPAIR_PREFIX)
                or view.annotations.get(REPAIR_RESULT, "").strip().lower() != "passed"):
            return
        await self.nodes.patch_metadata(
            view.name, labels={SPARE_FAILED_LABEL: None, REPAIR_LABEL: None},
            annotations={SPARE_VALIDATION: None, SPARE_VALIDATION_RUN: None,
                         REPAIR_RESULT: None, REPAIR_INCIDENT: None})
        await self.events.emit(
            key=f"spare-repaired/{view.name}/{incident}", node=view.name,
            reason="SpareRepaired",
            note=f"warm spare {view.name} was repaired ({incident}); it is back in the pool "
                 "and is validated again before a claim takes it")


def _outcome(check: str, report: CheckReport, model: str,
             policy: SpareValidation) -> CheckOutcome:
    if report.exit_code is None and not report.message:
        return CheckOutcome(check, False, report.detail or f"{check} Job produced no result")
    return judge(check, report.exit_code if report.exit_code is not None else 1,
                 report.message or None, report.dcgm_json, model, policy)
