"""core.outcomes: the figures of one incident from its record, and the fleet's summary.

Table-driven over hand-built records of each way an incident ends, plus hypothesis properties:
percentiles are values of the input and monotone (p50 <= p90 <= p99 <= max), and the fleet's
totals add up to its incidents'.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healer.core.model import (
    NodeRecord,
    Signal,
    SignalKind,
    StepOutcome,
    StepRecord,
    TransitionRecord,
)
from healer.core.modes import Mode
from healer.core.outcomes import (
    GPU_COUNT_LABEL,
    Closing,
    FoundNothing,
    Percentiles,
    incident_outcome,
    node_gpus,
    percentile,
    percentiles,
    summarize,
)
from healer.core.phases import Phase
from healer.core.vocabulary import StepName
from tests.builders import T0, node, record

HOUR = 3600.0


def ok(step: str, start: float, end: float) -> StepRecord:
    return StepRecord(step, T0 + start, 1, T0 + end, StepOutcome.DONE)


def suspected(at: float) -> tuple[TransitionRecord, ...]:
    return (TransitionRecord(T0 + at, Phase.HEALTHY, Phase.SUSPECT, "verdict"),
            TransitionRecord(T0, Phase.SUSPECT, Phase.FAILED, "verdict"))


def xid_at(at: float, node_name: str = "n1") -> Signal:
    return Signal(node_name, "prometheus", SignalKind.XID, "xid", 79.0, T0 + at)


def closed(phase: Phase, at: float, outcome: str, **kw: Any) -> NodeRecord:
    word, detail = NodeRecord.outcome_of(outcome)  # as status.outcome reads
    return record(phase, phase_since=T0 + at, outcome=word, outcome_detail=detail, **kw)


SWAP_LEDGER = (ok(StepName.DRAIN, 1, 2), ok(StepName.CORDON, 100, 101),
               ok(StepName.CLAIM_SPARE, 101, 103), ok(StepName.MOVE_WORKLOAD, 103, 200),
               ok(StepName.AWAIT_REPLACEMENT, 200, 400), ok(StepName.ANNOTATE_TOPOLOGY, 400, 402),
               ok(StepName.UNDRAIN, 402, 610), ok(StepName.MARK_REPAIR, 611, 612))
REPLACED = replace(closed(Phase.DONE, 5000, "replaced", spare="spare-1", ledger=SWAP_LEDGER),
                   history=suspected(-60))
REPLACED = replace(REPLACED, incident=replace(REPLACED.incident, evidence=(xid_at(-30),)))
REPAIRED = closed(Phase.DONE, 9000, "repaired", ledger=(
    ok(StepName.DRAIN, 10, 11), ok(StepName.CORDON, 50, 51), ok(StepName.MARK_REPAIR, 51, 52),
    ok(StepName.UNDRAIN, 7000, 7200), ok(StepName.UNCORDON, 7200, 7201)))
NO_FAULT = replace(REPAIRED, ledger=tuple(
    replace(s, detail="result=passed,repair-result=no-fault") if s.step == StepName.MARK_REPAIR
    else s for s in REPAIRED.ledger))
RECOVERED_EARLY = closed(Phase.DONE, 40, "recovered")
RECOVERED_LATE = closed(Phase.DONE, 55, "recovered", ledger=(
    ok(StepName.DRAIN, 1, 2), StepRecord(StepName.CORDON, T0 + 3, 1, T0 + 30,
                                         StepOutcome.SKIPPED, "superseded: recovered"),
    ok(StepName.UNDO_DRAIN, 30, 50), ok(StepName.UNCORDON, 30, 55)))
ESCALATED = closed(Phase.ESCALATED, 300, "jobs still running", ledger=(
    ok(StepName.DRAIN, 1, 2), StepRecord(StepName.ESCALATE, T0 + 300, 1, T0 + 301,
                                         StepOutcome.DONE)))
CANCELLED_UNDONE = closed(Phase.CANCELLED, 200, "cancelled", ledger=(
    ok(StepName.DRAIN, 0, 1), ok(StepName.UNDO_DRAIN, 200, 250), ok(StepName.UNCORDON, 200, 260)))
HELD = record(Phase.HELD_FOR_CAPACITY, phase_since=T0 + 100, ledger=(
    ok(StepName.DRAIN, 1, 2), ok(StepName.CORDON, 100, 101),
    StepRecord(StepName.CLAIM_SPARE, T0 + 101, 3, T0 + 102, StepOutcome.FAILED, "none")))
DRY_RUN = replace(REPLACED, mode=Mode.DRY_RUN)
CONDITION = replace(RECOVERED_EARLY, incident=replace(RECOVERED_EARLY.incident, evidence=(
    Signal("n1", "k8s", SignalKind.CONDITION, "GPUHealthy", T0 - 500, T0 - 5),)))
SLURM_FOUND = replace(RECOVERED_EARLY, incident=replace(RECOVERED_EARLY.incident, evidence=(
    Signal("n1", "slurm", SignalKind.SLURM, "state", T0 - 120, T0 - 2),)))
NOW = T0 + 10_000


@pytest.mark.parametrize(
    ("rec", "closing", "detect", "to_service", "to_replacement", "out", "still_out", "found"),
    [
        (REPLACED, Closing.REPLACED, 60.0, 610.0, 610.0, 609.0, False, None),
        (REPAIRED, Closing.REPAIRED, None, 7200.0, None, 7190.0, False, None),
        (NO_FAULT, Closing.REPAIRED, None, 7200.0, None, 7190.0, False,
         FoundNothing.REPAIR_FOUND_NO_FAULT),
        (RECOVERED_EARLY, Closing.RECOVERED, None, None, None, 0.0, False,
         FoundNothing.RECOVERED_BEFORE_DISRUPTION),
        (RECOVERED_LATE, Closing.RECOVERED, None, None, None, 54.0, False,
         FoundNothing.RECOVERED_AFTER_DRAIN),
        (ESCALATED, Closing.ESCALATED, None, None, None, 299.0, True, None),
        (CANCELLED_UNDONE, Closing.CANCELLED, None, None, None, 260.0, False, None),
        (HELD, Closing.OPEN, None, None, None, NOW - T0 - 1, True, None),
        (DRY_RUN, Closing.REPLACED, 60.0, None, None, 0.0, False, None),
        (CONDITION, Closing.RECOVERED, 500.0, None, None, 0.0, False,
         FoundNothing.RECOVERED_BEFORE_DISRUPTION),
        (SLURM_FOUND, Closing.RECOVERED, 120.0, None, None, 0.0, False,
         FoundNothing.RECOVERED_BEFORE_DISRUPTION),
    ],
    ids=["replaced", "repaired", "repair-found-no-fault", "recovered-early", "recovered-late",
         "escalated", "cancelled-undone", "held-open", "dry-run", "condition-evidence",
         "slurm-evidence"])
def test_incident_outcome(rec: NodeRecord, closing: Closing, detect: float | None,
                          to_service: float | None, to_replacement: float | None, out: float,
                          still_out: bool, found: FoundNothing | None) -> None:
    o = incident_outcome(rec, NOW, node_gpus=8)
    assert o.closing is closing
    assert o.detect == detect
    assert o.to_service == to_service
    assert o.to_replacement == to_replacement
    assert o.out_of_service == pytest.approx(out)
    assert o.still_out is still_out
    assert o.found_nothing is found
    assert o.gpu_hours_lost == pytest.approx(out * 8 / HOUR)
    assert o.finished is (closing is not Closing.OPEN)
    assert o.closed_at == (None if closing is Closing.OPEN else rec.phase_since)


def test_step_times_come_from_the_ledger() -> None:
    o = incident_outcome(REPLACED, NOW)
    assert [(s.step, s.seconds) for s in o.steps][:3] == [
        ("drain", 1.0), ("cordon", 1.0), ("claim-spare", 2.0)]
    assert {s.step: s.seconds for s in o.steps}["await-replacement"] == 200.0
    held = incident_outcome(HELD, NOW)
    assert ("claim-spare", 1.0, "failed") in [(s.step, s.seconds, s.outcome) for s in held.steps]


def test_suspect_records_are_not_incidents() -> None:
    fleet = summarize([record(Phase.SUSPECT), REPLACED], NOW, T0 - HOUR)
    assert [o.incident for o in fleet.incidents] == [REPLACED.incident.id]
    assert fleet.records == 2


@pytest.mark.parametrize(("labels", "expected"), [
    ({GPU_COUNT_LABEL: "4"}, 4), ({}, 8), ({GPU_COUNT_LABEL: "x"}, 8),
    ({GPU_COUNT_LABEL: "0"}, 8), ({GPU_COUNT_LABEL: "-2"}, 8)])
def test_node_gpus(labels: dict[str, str], expected: int) -> None:
    assert node_gpus(node("n1", labels=labels)) == expected
    assert node_gpus(None, default=2) == 2


def at(rec: NodeRecord, opened: float, nodename: str = "n1",
       serials: tuple[str, ...] = ()) -> NodeRecord:
    """``rec`` moved to open at ``T0 + opened`` on ``nodename`` (with those GPU serials)."""
    shift = opened

    def mv(s: StepRecord) -> StepRecord:
        return replace(s, started_at=s.started_at + shift,
                       finished_at=None if s.finished_at is None else s.finished_at + shift)

    inc = rec.incident
    gpus = tuple(replace(g, serial=s) for g, s in zip(inc.gpus * 4, serials, strict=False))
    inc = replace(inc, id=f"{nodename}-{opened:.0f}", node=nodename,
                  opened_at=inc.opened_at + shift, gpus=gpus or inc.gpus,
                  evidence=tuple(replace(
                      e, node=nodename, observed_at=e.observed_at + shift,
                      value=e.value + shift if e.kind is SignalKind.CONDITION else e.value)
                      for e in inc.evidence))
    return replace(rec, node=nodename, incident=inc, phase_since=rec.phase_since + shift,
                   ledger=tuple(mv(s) for s in rec.ledger),
                   history=tuple(replace(h, at=h.at + shift) for h in rec.history))


def test_fleet_summary() -> None:
    recs = [at(REPLACED, 0, "n1", ("A",)), at(RECOVERED_EARLY, 1000, "n2", ("B",)),
            at(RECOVERED_LATE, 2000, "n1", ("A",)), at(ESCALATED, 3000, "n3", ("C",)),
            at(HELD, 4000, "n2", ("B",)), at(REPAIRED, -10 * 86400, "n3", ("C",)),
            at(DRY_RUN, 4500, "n4", ("D",))]
    fleet = summarize(recs, T0 + 5000, since=T0 - HOUR, gpus_of=lambda n: 4)
    assert [o.node for o in fleet.incidents] == ["n1", "n2", "n1", "n3", "n2", "n4"]
    assert fleet.finished == 5
    assert fleet.closings == {"replaced": 2, "repaired": 0, "recovered": 2, "escalated": 1,
                              "cancelled": 0, "open": 1}
    assert fleet.found_nothing == {"recovered-before-disruption": 1,
                                   "recovered-after-drain": 1, "repair-found-no-fault": 0}
    assert fleet.false_positive_rate == pytest.approx(2 / 5)
    # out of service: 609 (replaced) + 54 (recovered late) + 299 (escalated) + 999 (held)
    assert fleet.node_hours_lost == pytest.approx((609 + 54 + 299 + 999) / HOUR)
    assert fleet.gpu_hours_lost == pytest.approx(4 * (609 + 54 + 299 + 999) / HOUR)
    assert fleet.to_replacement.count == 1  # the dry run is not counted
    assert fleet.to_replacement.p50 == 610.0
    assert fleet.steps["drain"].count == 4
    # n1: 0 → 2000, n2: 1000 → 4000, n3: 10 days before the window → 3000
    assert fleet.between_per_node.count == 3
    assert fleet.between_per_node.p50 == 3000.0
    assert fleet.between_per_node.max == 10 * 86400 + 3000
    assert [(r.key, r.incidents, r.shortest_gap) for r in fleet.repeat_nodes] == [
        ("n1", 2, 2000.0), ("n2", 2, 3000.0), ("n3", 2, 10 * 86400 + 3000.0)]
    assert [r.key for r in fleet.repeat_serials] == ["A", "B", "C"]
    assert fleet.oldest_opened_at == T0 - 10 * 86400
    d = fleet.to_dict()
    assert d["incidents"] == 6
    assert d["falsePositiveRate"] == 0.4
    assert d["perIncident"][0]["timeToReplacementSeconds"] == 610.0
    assert d["stepSeconds"]["drain"]["count"] == 4


def test_empty_fleet() -> None:
    fleet = summarize([], NOW, T0)
    assert fleet.false_positive_rate is None
    assert fleet.detect.count == 0
    assert fleet.detect.p50 is None
    assert fleet.to_dict()["falsePositiveRate"] is None


@pytest.mark.parametrize(("values", "p50", "p90", "p99"), [
    ([5.0], 5.0, 5.0, 5.0),
    ([1.0, 2.0], 1.0, 2.0, 2.0),
    ([float(i) for i in range(1, 101)], 50.0, 90.0, 99.0),
    ([3.0, 1.0, 2.0, float("nan"), float("inf")], 2.0, 3.0, 3.0),
])
def test_percentiles_nearest_rank(values: list[float], p50: float, p90: float,
                                  p99: float) -> None:
    p = percentiles(values)
    assert (p.p50, p.p90, p.p99) == (p50, p90, p99)


def known(p: Percentiles) -> tuple[float, float, float, float]:
    """p50, p90, p99 and max of a non-empty distribution (each must be there)."""
    assert p.p50 is not None
    assert p.p90 is not None
    assert p.p99 is not None
    assert p.max is not None
    return p.p50, p.p90, p.p99, p.max


finite = st.floats(min_value=0, max_value=1e7, allow_nan=False)


@given(st.lists(finite, min_size=1, max_size=200))
def test_percentiles_are_monotone_values_of_the_input(values: list[float]) -> None:
    p50, p90, p99, top = known(percentiles(values))
    assert min(values) <= p50 <= p90 <= p99 <= top == max(values)
    assert {p50, p90, p99} <= set(values)
    xs = sorted(values)
    assert [percentile(xs, q) for q in (1, 25, 50, 75, 100)] == sorted(
        percentile(xs, q) for q in (1, 25, 50, 75, 100))


TEMPLATES = [REPLACED, REPAIRED, RECOVERED_EARLY, RECOVERED_LATE, ESCALATED, CANCELLED_UNDONE,
             HELD, DRY_RUN, CONDITION, NO_FAULT, record(Phase.SUSPECT)]


@given(st.lists(st.tuples(st.sampled_from(range(len(TEMPLATES))),
                          st.floats(min_value=-30 * 86400, max_value=0, allow_nan=False),
                          st.sampled_from(["n1", "n2", "n3"]),
                          st.lists(st.sampled_from(["A", "B"]), max_size=2)),
                max_size=25),
       st.integers(min_value=1, max_value=16))
def test_fleet_totals_add_up(spec: list[tuple[int, float, str, list[str]]], gpus: int) -> None:
    recs = [at(TEMPLATES[i], off, n, tuple(s)) for i, off, n, s in spec]
    fleet = summarize(recs, NOW, since=T0 - 7 * 86400, gpus_of=lambda _n: gpus)
    assert sum(fleet.closings.values()) == len(fleet.incidents)
    assert fleet.finished == len(fleet.incidents) - fleet.closings["open"]
    assert sum(fleet.found_nothing.values()) == fleet.closings["recovered"] + sum(
        1 for o in fleet.incidents if o.found_nothing is FoundNothing.REPAIR_FOUND_NO_FAULT)
    assert fleet.found_nothing["repair-found-no-fault"] <= fleet.closings["repaired"]
    assert fleet.gpu_hours_lost == pytest.approx(sum(o.gpu_hours_lost for o in fleet.incidents))
    assert fleet.gpu_hours_lost == pytest.approx(fleet.node_hours_lost * gpus)
    assert all(o.out_of_service >= 0 and o.opened_at >= T0 - 7 * 86400
               for o in fleet.incidents)
    assert {o.detect for o in fleet.incidents} <= {None, 60.0, 500.0}  # as in the table
    rate = fleet.false_positive_rate
    assert rate is None or 0 <= rate <= 1
    for p in (fleet.detect, fleet.to_service, fleet.between_per_node, *fleet.steps.values()):
        if p.count:
            p50, p90, p99, top = known(p)
            assert p50 <= p90 <= p99 <= top
