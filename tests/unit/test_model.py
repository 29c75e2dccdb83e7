"""The persisted record: exact round-trip through plain dicts, versioned."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healer.core.model import (
    LEDGER_OUTCOMES,
    RECORD_FORMAT_VERSION,
    GpuRef,
    Guardrail,
    GuardrailBlock,
    HealthState,
    Incident,
    NodeRecord,
    RecordOutcome,
    Severity,
    Signal,
    SignalKind,
    StepOutcome,
    StepRecord,
    TransitionRecord,
)
from healer.core.modes import Mode
from healer.core.phases import Phase

times = st.floats(min_value=0, max_value=4e9, allow_nan=False, allow_infinity=False)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20)
text = st.text(max_size=40)

gpus = st.builds(GpuRef, index=st.integers(-1, 15), uuid=text, serial=text)
signals = st.builds(Signal, node=st.just("n"), source=names, kind=st.sampled_from(SignalKind),
                    key=names, value=st.floats(allow_nan=False, allow_infinity=False),
                    observed_at=times, gpu=st.none() | gpus,
                    detail=st.dictionaries(names, text, max_size=2).map(
                        lambda d: tuple(sorted(d.items()))))
incidents = st.builds(Incident, id=names, node=st.just("n"), opened_at=times,
                      severity=st.sampled_from(Severity), rules=st.tuples(names, names),
                      gpus=st.lists(gpus, max_size=3).map(tuple), summary=text,
                      evidence=st.lists(signals, max_size=3).map(tuple))
steps = st.builds(StepRecord, step=names, started_at=times, attempts=st.integers(1, 9),
                  finished_at=st.none() | times,
                  outcome=st.none() | st.sampled_from(sorted(LEDGER_OUTCOMES)),
                  error=text, detail=text)
blocks = st.builds(GuardrailBlock, guardrail=st.sampled_from(Guardrail), message=text,
                   current=st.integers(0, 100).map(float), limit=st.integers(0, 100).map(float))
history = st.builds(TransitionRecord, at=times, source=st.sampled_from(Phase),
                    target=st.sampled_from(Phase), trigger=text)
#: A record's outcome and detail as the machine sets them: an escalation's reason is words,
#: never one of the outcomes' own values (on the wire the two share ``status.outcome``).
outcomes = (st.tuples(st.none() | st.sampled_from(RecordOutcome), st.just(""))
            | st.tuples(st.just(RecordOutcome.ESCALATED),
                        text.filter(lambda t: t not in set(RecordOutcome))))
records = st.builds(
    NodeRecord, node=names, incident=incidents, policy=names,
    phase=st.sampled_from(Phase), phase_since=times,
    mode=st.sampled_from(Mode),
    ledger=st.lists(steps, max_size=6).map(tuple),
    spare=names | st.just(""), slurm_node=names, verdict=st.sampled_from(
        HealthState), verdict_at=times,
    blocked=st.none() | blocks, paused=st.booleans(), repaired=st.booleans(),
    history=st.lists(history, max_size=5).map(tuple)).flatmap(
        lambda r: outcomes.map(lambda o: replace(r, outcome=o[0], outcome_detail=o[1])))


@given(records)
def test_record_round_trips_exactly_through_json(rec: NodeRecord) -> None:
    wire = json.loads(json.dumps(rec.to_dict()))
    assert NodeRecord.from_dict(wire) == rec


def test_format_version_is_written_and_checked() -> None:
    rec = NodeRecord("n", Incident("i", "n", 1.0, Severity.FAILED, ("r",)), "p", Phase.DRAINING,
                     1.0)
    d = rec.to_dict()
    assert d["formatVersion"] == RECORD_FORMAT_VERSION
    d["formatVersion"] = 99
    with pytest.raises(ValueError, match="formatVersion 99"):
        NodeRecord.from_dict(d)


def test_with_step_replaces_open_entry_and_appends_after_finish() -> None:
    rec = NodeRecord("n", Incident("i", "n", 1.0, Severity.FAILED, ("r",)), "p", Phase.DRAINING,
                     1.0)
    rec = rec.with_step(StepRecord("drain", 1.0))
    rec = rec.with_step(StepRecord("drain", 1.0, attempts=2))
    assert len(rec.ledger) == 1
    assert rec.ledger[0].attempts == 2
    rec = rec.with_step(StepRecord("drain", 1.0, 2, 2.0, StepOutcome.DONE))
    rec = rec.with_step(StepRecord("drain", 3.0))
    assert [s.done for s in rec.ledger] == [True, False]


def test_severity_parse_rejects_unknown() -> None:
    assert Severity.parse("Failed") is Severity.FAILED
    with pytest.raises(ValueError, match="expected degrading or failed"):
        Severity.parse("fatal")


def test_a_noderemediation_from_a_newer_healer_is_refused_by_name() -> None:
    from healer.adapters.kube.crd import to_object
    from healer.adapters.kube.store import _stored
    from healer.errors import PermanentError

    rec = NodeRecord("n", Incident("i", "n", 1.0, Severity.FAILED, ("r",)), "p", Phase.DRAINING,
                     1.0)
    obj = to_object(rec, "n-20261122-0101")
    obj["metadata"]["resourceVersion"] = "7"
    assert _stored(obj).record == rec
    obj["status"]["formatVersion"] = RECORD_FORMAT_VERSION + 1
    with pytest.raises(PermanentError, match=r"NodeRemediation n-20261122-0101: .*formatVersion"):
        _stored(obj)
