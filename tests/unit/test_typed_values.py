"""Closed sets travel as enums across the core, never as strings (issue 24, item 2).

Two kinds of check: the annotations of the fields that carry a closed set name its enum (a
field turned back into ``str`` fails here, whatever mypy lets through at a call site), and a
value off the set raises where the wire form is read, while every member round-trips
byte-identically (objects written before the types existed still read).
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from healer.core.actions import CHECKPOINT_HOOKS, REPAIR_HOOKS, Checkpoint, HookKind, MarkRepair
from healer.core.budget import BudgetView, GuardrailUsage, SlurmView
from healer.core.machine.triggers import StepResult
from healer.core.model import (
    LEDGER_OUTCOMES,
    Guardrail,
    GuardrailBlock,
    NodeRecord,
    RecordOutcome,
    Signal,
    SlurmFinding,
    StepKey,
    StepOutcome,
    StepRecord,
    TransitionRecord,
)
from healer.core.phases import Phase
from healer.core.rules import CheckpointStep, RepairStep
from healer.core.slurm_signals import finding_of, finding_signal
from healer.core.topology import placement_of
from healer.policy.load import load_policy_set
from healer.policy.schema import CheckpointSpec, RepairSpec
from healer.ports import HookResult, HookSpec
from healer.ports import StepOutcome as PortsStepOutcome
from tests.builders import policy_steps, policy_yaml, record


def _enum_in(hint: Any) -> type[enum.Enum] | None:
    """The enum a field's annotation names (``X`` or ``X | None``), else None."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint
    for arg in typing.get_args(hint):
        found = _enum_in(arg)
        if found is not None:
            return found
    return None


@pytest.mark.parametrize(("cls", "field", "expected"), [
    (GuardrailBlock, "guardrail", Guardrail),
    (BudgetView, "slurm_view", SlurmView),
    (GuardrailUsage, "slurm", SlurmView),
    (StepRecord, "outcome", StepOutcome),
    (StepResult, "status", StepOutcome),
    (HookResult, "outcome", StepOutcome),
    (NodeRecord, "outcome", RecordOutcome),
    (HookSpec, "kind", HookKind),
    (Checkpoint, "hook", HookKind),
    (MarkRepair, "hook", HookKind),
    (CheckpointStep, "hook", HookKind),
    (RepairStep, "hook", HookKind),
    (TransitionRecord, "source", Phase),
    (TransitionRecord, "target", Phase),
])
def test_closed_sets_are_typed_as_their_enum(cls: type, field: str,
                                             expected: type[enum.Enum]) -> None:
    hints = typing.get_type_hints(cls)
    assert _enum_in(hints[field]) is expected, f"{cls.__name__}.{field}: {hints[field]}"


def test_the_machine_reads_step_data_by_a_closed_set_of_keys() -> None:
    assert typing.get_type_hints(StepResult.get)["key"] is StepKey
    assert typing.get_type_hints(placement_of)["get"] == Callable[[StepKey], str]
    r = StepResult("claim-spare", StepOutcome.DONE, data=(("spare", "s1"), ("extra", "x")))
    assert r.get(StepKey.SPARE) == "s1"  # the wire keys are the enum's values


def test_one_step_outcome_type() -> None:
    """The adapters' answer, the machine's trigger and the ledger share one type."""
    assert PortsStepOutcome is StepOutcome
    assert typing.get_type_hints(StepResult)["status"] is StepOutcome


@pytest.mark.parametrize("block", [GuardrailBlock(g, f"held by {g}", 1, 2) for g in Guardrail])
def test_a_block_round_trips_on_the_wire(block: GuardrailBlock) -> None:
    d = block.to_dict()
    assert type(d["guardrail"]) is str or isinstance(d["guardrail"], Guardrail)
    assert d["guardrail"] == block.guardrail.value
    back = GuardrailBlock.from_dict(d)
    assert back == block
    assert back.guardrail is block.guardrail


def test_a_block_with_an_unknown_guardrail_does_not_read() -> None:
    with pytest.raises(ValueError, match="max-everything"):
        GuardrailBlock.from_dict({"guardrail": "max-everything", "message": "?"})


def test_capacity_guardrails() -> None:
    assert {g for g in Guardrail if g.counts_capacity} == {
        Guardrail.MAX_UNAVAILABLE, Guardrail.FAILURE_DOMAIN, Guardrail.SLURM_UNKNOWN}


@pytest.mark.parametrize(("outcome", "word"), [
    (StepOutcome.DONE, "ok"), (StepOutcome.FAILED, "failed"),
    (StepOutcome.TIMEOUT, "timeout"), (StepOutcome.SKIPPED, "skipped")])
def test_ledger_outcomes_keep_their_words(outcome: StepOutcome, word: str) -> None:
    """A ledger written before the step outcomes became one type reads the same, and is
    written back byte-identically."""
    entry = {"step": "drain", "startedAt": 1.0, "attempts": 1, "finishedAt": 2.0,
             "outcome": word}
    rec = StepRecord.from_dict(entry)
    assert rec.outcome is outcome
    assert rec.to_dict() == entry


@pytest.mark.parametrize("word", ["done", "pending", "retry", "unavailable", "OK", ""])
def test_a_ledger_outcome_off_the_set_does_not_read(word: str) -> None:
    with pytest.raises(ValueError, match="not a ledger outcome"):
        StepRecord.from_dict({"step": "drain", "startedAt": 1.0, "outcome": word})


@pytest.mark.parametrize("bad", ["failed", StepOutcome.PENDING, StepOutcome.RETRY])
def test_a_ledger_entry_takes_only_a_finished_step_outcome(bad: Any) -> None:
    with pytest.raises(ValueError, match="does not end a ledger step"):
        StepRecord("drain", 1.0, finished_at=2.0, outcome=bad)


def test_a_block_takes_only_a_guardrail() -> None:
    with pytest.raises(TypeError, match="must be a Guardrail"):
        GuardrailBlock("breaker", "a string crept back")  # type: ignore[arg-type]


def test_only_finished_outcomes_are_ledger_outcomes() -> None:
    assert {o for o in StepOutcome if o not in LEDGER_OUTCOMES} == {
        StepOutcome.PENDING, StepOutcome.RETRY, StepOutcome.UNAVAILABLE}


@pytest.mark.parametrize("cls", [Guardrail, SlurmView, StepOutcome, RecordOutcome, HookKind])
def test_a_bad_value_raises(cls: type[enum.Enum]) -> None:
    with pytest.raises(ValueError, match="no-such-value"):
        cls("no-such-value")


def test_a_slurm_finding_travels_typed_and_is_not_parsed_back() -> None:
    found = SlurmFinding((("DOWN", 5.0), ("DRAIN", 7.0)), "NHC: GPU 3, ECC=1", 7.0, "root", "t")
    signal = finding_signal("n1", found, 9.0)
    assert signal.finding is found
    assert finding_of(signal) is found  # the same object: no round trip through the text
    # on the wire only the detail travels; a signal read back from it is parsed, once
    wire = Signal.from_dict("n1", signal.to_dict())
    assert wire.finding is None
    assert finding_of(wire) == found
    assert wire == signal


def _closed(outcome: RecordOutcome | None, detail: str = "") -> NodeRecord:
    return record(Phase.ESCALATED if outcome is RecordOutcome.ESCALATED else Phase.DONE,
                  outcome=outcome, outcome_detail=detail)


def test_record_outcomes_keep_their_words() -> None:
    """Every word a record's ``status.outcome`` was ever written with, before the type."""
    assert {o.value for o in RecordOutcome} == {
        "done", "replaced", "repaired", "recovered", "cancelled", "escalated", "node deleted"}


@pytest.mark.parametrize("outcome", [None, *RecordOutcome])
def test_a_record_outcome_round_trips_byte_identically(outcome: RecordOutcome | None) -> None:
    rec = _closed(outcome)
    wire = rec.to_dict()
    assert wire["outcome"] == ("" if outcome is None else outcome.value)
    assert type(wire["outcome"]) is str  # the wire holds plain text, not the enum
    back = NodeRecord.from_dict(wire)
    assert back == rec
    assert back.outcome is outcome
    assert back.to_dict() == wire


def test_an_escalation_writes_its_reason_and_reads_it_back_as_detail() -> None:
    reason = "step drain failed: slurmctld said no"
    rec = _closed(RecordOutcome.ESCALATED, reason)
    wire = rec.to_dict()
    assert wire["outcome"] == reason  # as written before the type: the reason, not a word
    back = NodeRecord.from_dict(wire)
    assert (back.outcome, back.outcome_detail) == (RecordOutcome.ESCALATED, reason)
    assert back.outcome_text == reason
    # an escalation without a reason is written as the word
    assert _closed(RecordOutcome.ESCALATED).to_dict()["outcome"] == "escalated"


@pytest.mark.parametrize(("text", "outcome", "detail"), [
    ("", None, ""),
    ("recovered", RecordOutcome.RECOVERED, ""),
    ("node deleted", RecordOutcome.NODE_DELETED, ""),
    ("escalated", RecordOutcome.ESCALATED, ""),
    ("Recovered", RecordOutcome.ESCALATED, "Recovered"),  # not a word: an escalation's text
    ("deadline of phase Draining passed", RecordOutcome.ESCALATED,
     "deadline of phase Draining passed"),
])
def test_status_outcome_reads_a_word_as_itself_and_any_other_text_as_escalation(
        text: str, outcome: RecordOutcome | None, detail: str) -> None:
    assert NodeRecord.outcome_of(text) == (outcome, detail)
    wire = _closed(RecordOutcome.DONE).to_dict() | {"outcome": text}
    back = NodeRecord.from_dict(wire)
    assert (back.outcome, back.outcome_detail) == (outcome, detail)
    assert back.to_dict()["outcome"] == text


def test_a_record_takes_only_a_record_outcome() -> None:
    with pytest.raises(TypeError, match="must be a RecordOutcome"):
        dataclasses.replace(_closed(None), outcome="recovered")


@pytest.mark.parametrize("outcome", [o for o in RecordOutcome if o is not RecordOutcome.ESCALATED])
def test_only_an_escalation_carries_a_detail(outcome: RecordOutcome) -> None:
    with pytest.raises(ValueError, match="only with an escalation"):
        _closed(outcome, "why")


@pytest.mark.parametrize(("spec", "hooks"), [(CheckpointSpec, CHECKPOINT_HOOKS),
                                             (RepairSpec, REPAIR_HOOKS)])
def test_the_schema_allows_exactly_the_hooks_of_each_step(spec: type, hooks: tuple[HookKind, ...]
                                                         ) -> None:
    allowed = typing.get_args(typing.get_type_hints(spec)["hook"])
    assert list(allowed) == [h.value for h in hooks]  # the JSON schema's enum, in its order
    assert {h.value for h in HookKind} == {*CHECKPOINT_HOOKS, *REPAIR_HOOKS}


@pytest.mark.parametrize(("checkpoint", "repair"), [("slurm-signal", "none"), ("job", "job")])
def test_a_policy_hook_compiles_to_its_kind(tmp_path: Path, checkpoint: str, repair: str) -> None:
    steps = policy_steps(checkpoint={"enabled": True, "hook": checkpoint, "deadline": "5m",
                                     "jobTemplate": "healer-system/checkpoint-job"},
                         repair={"hook": repair, "jobTemplate": "healer-system/repair-job"})
    (tmp_path / "p.yaml").write_text(policy_yaml("t", name="p", steps=steps))
    (pol,) = load_policy_set([tmp_path]).policies
    assert pol.steps.checkpoint.hook is HookKind(checkpoint)
    assert pol.steps.repair.hook is HookKind(repair)


def test_a_hook_spec_takes_only_a_hook_kind() -> None:
    with pytest.raises(TypeError, match="must be a HookKind"):
        HookSpec("webhook")  # type: ignore[arg-type]
    assert HookSpec(HookKind.JOB, job_template="ns/cm").kind is HookKind.JOB


@pytest.mark.parametrize("phase", list(Phase))
def test_a_phase_change_round_trips_with_the_phase_names_on_the_wire(phase: Phase) -> None:
    entry = {"at": 1.0, "from": Phase.HEALTHY.value, "to": phase.value, "trigger": "verdict"}
    rec = TransitionRecord.from_dict(entry)
    assert (rec.source, rec.target) == (Phase.HEALTHY, phase)
    assert rec.to_dict() == entry
    assert all(type(v) is not Phase for v in rec.to_dict().values())


def test_a_phase_change_takes_only_phases() -> None:
    with pytest.raises(TypeError, match="must be Phases"):
        TransitionRecord(1.0, "Healthy", Phase.SUSPECT, "verdict")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Sick"):
        TransitionRecord.from_dict({"at": 1.0, "from": "Healthy", "to": "Sick", "trigger": "x"})
