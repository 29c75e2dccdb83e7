"""Spare validation's decisions (core.spare_validation) and its policy block (FleetGuardrails
spec.spareValidation): readiness for a claim, the periodic plan, thresholds per GPU model, the
annotations' round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healer.core.spare_validation import (
    PeriodicPlan,
    Readiness,
    SpareCheck,
    SpareState,
    SpareValidation,
    ValidationResult,
    ValidationRun,
    bandwidth_table,
    plan_periodic,
    readiness,
)
from healer.errors import PolicyError
from healer.policy.load import load_policy_set

NOW = 1_767_600_000.0
HOUR = 3600.0
BOTH = (SpareCheck.DCGM_DIAG, SpareCheck.NCCL_LOOPBACK)
ON = SpareValidation(enabled=True, max_age=12 * HOUR, interval=6 * HOUR, checks=BOTH,
                     on_claim=True, max_parallel=2)
NO_ON_CLAIM = SpareValidation(enabled=True, max_age=12 * HOUR, interval=6 * HOUR, checks=BOTH,
                              on_claim=False)


def passed(age: float, checks: tuple[str, ...] = BOTH) -> ValidationResult:
    return ValidationResult(True, NOW - age, checks, "ok")


def failed(age: float, ran: bool = True) -> ValidationResult:
    return ValidationResult(False, NOW - age, BOTH, "nccl-loopback: bus bandwidth 300 GB/s",
                            ran)


RUN = ValidationRun("20260105t080000z", NOW - 60, tuple(BOTH))


@pytest.mark.parametrize(("result", "run", "policy", "want"), [
    (None, None, SpareValidation(), Readiness.CLAIMABLE),  # validation off: as before
    (failed(0), None, SpareValidation(), Readiness.CLAIMABLE),
    (passed(HOUR), None, ON, Readiness.CLAIMABLE),  # recent and passed
    (passed(12 * HOUR), None, ON, Readiness.CLAIMABLE),  # exactly maxAge is still recent
    (passed(12 * HOUR + 1), None, ON, Readiness.VALIDATE),  # stale: validate first
    (passed(HOUR, ("dcgm-diag",)), None, ON, Readiness.VALIDATE),  # a check it never ran
    (None, None, ON, Readiness.VALIDATE),  # never validated
    (None, None, NO_ON_CLAIM, Readiness.SKIP),  # ... and no validation on claim: not this one
    (passed(13 * HOUR), None, NO_ON_CLAIM, Readiness.SKIP),
    (failed(HOUR), None, ON, Readiness.FAILED),
    (failed(100 * HOUR), None, ON, Readiness.FAILED),  # failed stays failed (repair clears it)
    (failed(HOUR, ran=False), None, ON, Readiness.FAILED),  # could not run: not claimed either
    (None, RUN, ON, Readiness.VALIDATING),
    (passed(HOUR), RUN, ON, Readiness.VALIDATING),  # a run in progress is waited for
])
def test_readiness(result: ValidationResult | None, run: ValidationRun | None,
                   policy: SpareValidation, want: Readiness) -> None:
    assert readiness(result, run, policy, NOW) is want


@pytest.mark.parametrize(("model", "want"), [
    ("NVIDIA H100 80GB HBM3", 350.0),
    ("NVIDIA-H100-80GB-HBM3", 350.0),  # as GPU feature discovery writes it
    ("nvidia-h100-80gb-hbm3", 350.0),
    ("NVIDIA-H200", 380.0),
    ("NVIDIA-A100-SXM4-80GB", 100.0),  # not named: the default
    ("", 100.0),  # no gpu.product label: the default
])
def test_bus_bandwidth_threshold_per_model(model: str, want: float) -> None:
    policy = SpareValidation(enabled=True, bus_bandwidth_gbps=bandwidth_table(
        {"NVIDIA H100 80GB HBM3": 350, "NVIDIA H200": 380, "default": 100}))
    assert policy.bus_bandwidth_threshold(model) == want
    assert SpareValidation(bus_bandwidth_gbps=bandwidth_table({"NVIDIA H200": 1})
                           ).bus_bandwidth_threshold("NVIDIA-H100") is None


def test_periodic_plan_polls_runs_and_starts_the_oldest_due_first() -> None:
    spares = [SpareState("fresh", passed(HOUR), None),
              SpareState("old", passed(7 * HOUR), None),
              SpareState("never", None, None),
              SpareState("older", passed(9 * HOUR), None),
              SpareState("broken", failed(HOUR), None),
              SpareState("not-run-lately", failed(HOUR, ran=False), None)]
    assert plan_periodic(spares, ON, NOW) == PeriodicPlan((), ("never", "older"))
    not_run = [SpareState("not-run", failed(7 * HOUR, ran=False), None),
               SpareState("broken", failed(7 * HOUR), None)]
    assert plan_periodic(not_run, ON, NOW) == PeriodicPlan((), ("not-run",))  # tried again
    busy = [*spares, SpareState("running", None, RUN)]
    assert plan_periodic(busy, ON, NOW) == PeriodicPlan(("running",), ("never",))
    assert plan_periodic(spares, SpareValidation(), NOW) == PeriodicPlan((), ())


states = st.builds(
    SpareState, name=st.text("abcdef", min_size=1, max_size=6),
    result=st.none() | st.builds(ValidationResult, passed=st.booleans(),
                                 at=st.floats(NOW - 30 * HOUR, NOW), checks=st.just(BOTH),
                                 ran=st.booleans()),
    run=st.none() | st.just(RUN))


@given(st.lists(states, max_size=40, unique_by=lambda s: s.name),
       st.integers(min_value=1, max_value=8))
def test_periodic_plan_is_bounded(spares: list[SpareState], max_parallel: int) -> None:
    policy = SpareValidation(enabled=True, max_age=12 * HOUR, interval=6 * HOUR, checks=BOTH,
                             max_parallel=max_parallel)
    plan = plan_periodic(spares, policy, NOW)
    running = {s.name for s in spares if s.run is not None}
    assert set(plan.poll) == running
    assert len(plan.start) <= max(0, max_parallel - len(running))
    for name in plan.start:
        s = next(x for x in spares if x.name == name)
        assert s.run is None
        assert s.result is None or s.result.passed or not s.result.ran


@given(st.booleans(), st.integers(0, 4_000_000_000), st.text(max_size=1200),
       st.lists(st.sampled_from(["dcgm-diag", "nccl-loopback"]), max_size=2), st.booleans())
def test_annotations_round_trip(ok: bool, at: int, detail: str, checks: list[str],
                                ran: bool) -> None:
    r = ValidationResult(ok, float(at), tuple(checks), detail, ran)
    back = ValidationResult.from_annotation(r.to_annotation())
    assert back == ValidationResult(ok, float(at), tuple(checks), detail[:1000], ran)
    run = ValidationRun.start(float(at), checks or ["dcgm-diag"])
    assert ValidationRun.from_annotation(run.to_annotation()) == run


@pytest.mark.parametrize("text", [None, "", "{", "[]", '{"result": "maybe"}',
                                  '{"result": "passed", "at": "yesterday", "checks": []}',
                                  '{"result": "passed", "at": "2026-01-01T00:00:00Z"}'])
def test_an_unreadable_result_is_no_result(text: str | None) -> None:
    assert ValidationResult.from_annotation(text) is None
    assert ValidationRun.from_annotation(text) is None


FLEET = """apiVersion: healer.io/v1alpha1
kind: FleetGuardrails
metadata: {name: fleet}
spec:
  spareValidation:
%s
"""


def _load(tmp_path: Path, block: str) -> SpareValidation:
    f = tmp_path / "fleet.yaml"
    f.write_text(FLEET % block)
    return load_policy_set([f]).fleet.spare_validation


def test_policy_block_compiles(tmp_path: Path) -> None:
    sv = _load(tmp_path, """    maxAge: 12h
    onClaim: false
    interval: 2h
    maxParallel: 3
    checks: [dcgm-diag, nccl-loopback]
    ncclBusBandwidthGBps: {"NVIDIA H100 80GB HBM3": 350, default: 100}""")
    assert sv == SpareValidation(enabled=True, max_age=12 * HOUR, on_claim=False,
                                 interval=2 * HOUR, checks=BOTH, max_parallel=3,
                                 bus_bandwidth_gbps=(("default", 100.0),
                                                     ("nvidia-h100-80gb-hbm3", 350.0)))
    assert _load(tmp_path, "    {}").enabled  # an empty block: on, with the defaults
    f = tmp_path / "fleet.yaml"
    f.write_text("apiVersion: healer.io/v1alpha1\nkind: FleetGuardrails\nmetadata: {name: f}\n")
    assert not load_policy_set([f]).fleet.spare_validation.enabled  # absent: off


@pytest.mark.parametrize(("block", "line", "field", "says"), [
    ("    maxAge: 1h\n    interval: 1h", 7, "spec.spareValidation.interval",
     "expected an interval shorter than maxAge (3600s), got 3600s"),
    ("    checks: [dcgm-diag, dcgm-diag]", 6, "spec.spareValidation.checks[1]",
     "check 'dcgm-diag' is listed twice"),
    ("    checks: [gpu-burn]", 6, "spec.spareValidation.checks[0]",
     "expected one of 'dcgm-diag' or 'nccl-loopback', got 'gpu-burn'"),
    ("    checks: [nccl-loopback]", 5, "spec.spareValidation.ncclBusBandwidthGBps",
     "expected a bus bandwidth threshold per GPU model"),
    ("    ncclBusBandwidthGBps: {default: 100}", 6, "spec.spareValidation.ncclBusBandwidthGBps",
     "thresholds are given but checks does not run nccl-loopback"),
    ("    checks: [nccl-loopback]\n    ncclBusBandwidthGBps: {default: 0}", 7,
     "spec.spareValidation.ncclBusBandwidthGBps.default", "expected a value > 0.0, got 0"),
    ("    checks: [nccl-loopback]\n    ncclBusBandwidthGBps:\n      NVIDIA H200: 380\n"
     "      NVIDIA-H200: 390", 9, "spec.spareValidation.ncclBusBandwidthGBps.NVIDIA-H200",
     "GPU model 'NVIDIA-H200' is the same model as 'NVIDIA H200'"),
    ("    maxParallel: 0", 6, "spec.spareValidation.maxParallel", "expected a value ≥ 1, got 0"),
])
def test_policy_block_refused_with_line_and_field(tmp_path: Path, block: str, line: int,
                                                  field: str, says: str) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text(FLEET % block)
    with pytest.raises(PolicyError) as err:
        load_policy_set([f])
    problems = [(p.file, p.line, p.field) for p in err.value.problems if says in p.message]
    assert problems == [(str(f), line, field)], "\n".join(map(str, err.value.problems))
