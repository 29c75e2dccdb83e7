"""The transition table as a whole: complete, terminating, acyclic where it must be."""

from __future__ import annotations

from collections import defaultdict, deque

from healer.adapters.kube.crd import reason_of
from healer.core import rules as cp
from healer.core.actions import ClaimSpare, EmitEvent
from healer.core.machine import (
    IGNORED,
    TRANSITIONS,
    Decision,
    TriggerKind,
    held_reason,
    step,
)
from healer.core.machine.guards import ALWAYS
from healer.core.model import NodeRecord, Placement, StepOutcome
from healer.core.phases import TERMINAL, Phase
from tests.builders import T0, done_step, open_step, policies, policy, record, s_trigger, view


def _edges() -> dict[Phase, set[Phase]]:
    g: dict[Phase, set[Phase]] = defaultdict(set)
    for t in TRANSITIONS:
        if t.target is not None and t.target is not t.source:
            g[t.source].add(t.target)
    return g


def test_every_phase_trigger_pair_is_handled_or_explicitly_ignored() -> None:
    handled = {(t.source, t.trigger) for t in TRANSITIONS}
    for phase in Phase:
        for kind in TriggerKind:
            pair = (phase, kind)
            assert (pair in handled) != (pair in IGNORED), pair
            if pair in IGNORED:
                assert IGNORED[pair].strip(), f"{pair} is ignored without a reason"


def test_handled_external_triggers_end_with_an_unconditional_row() -> None:
    last: dict[tuple[Phase, TriggerKind], object] = {}
    for t in TRANSITIONS:
        last[(t.source, t.trigger)] = t.guard
    for (phase, kind), guard in last.items():
        if kind is TriggerKind.AUTO:
            continue  # an automatic continuation may legitimately not apply
        assert guard is ALWAYS, f"{phase.value}/{kind.value} can fall through every row"


def test_every_phase_can_reach_done_escalated_or_cancelled() -> None:
    g = _edges()
    for start in Phase:
        seen, todo = {start}, deque([start])
        while todo:
            for nxt in g[todo.popleft()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        if start is Phase.HEALTHY:
            continue  # healthy is the resting state; it reaches the others via a verdict
        assert seen & TERMINAL, f"{start.value} cannot finish"


def test_every_phase_is_reachable_from_healthy() -> None:
    g = _edges()
    seen, todo = {Phase.HEALTHY}, deque([Phase.HEALTHY])
    while todo:
        for nxt in g[todo.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(Phase)


def test_terminal_phases_have_no_outgoing_transitions() -> None:
    for t in TRANSITIONS:
        if t.source in TERMINAL:
            assert t.target is None, t


def test_auto_rows_have_no_cycle() -> None:
    g: dict[Phase, set[Phase]] = defaultdict(set)
    for t in TRANSITIONS:
        if t.trigger is TriggerKind.AUTO and t.target is not None:
            g[t.source].add(t.target)
    state: dict[Phase, int] = {}

    def visit(p: Phase) -> None:
        state[p] = 1
        for n in g[p]:
            assert state.get(n) != 1, f"AUTO cycle through {n.value}"
            if n not in state:
                visit(n)
        state[p] = 2

    for p in list(g):
        if p not in state:
            visit(p)


def test_swapping_is_entered_only_before_any_swap() -> None:
    sources = {t.source for t in TRANSITIONS if t.target is Phase.SWAPPING}
    assert sources == {Phase.CORDONED, Phase.HELD_FOR_CAPACITY, Phase.OUT_OF_SERVICE}
    # and neither of those is reachable once a swap happened
    after = {Phase.SWAPPING, Phase.ANNOTATING, Phase.VALIDATING, Phase.UNDRAINING, Phase.REPAIR}
    back = {t for t in TRANSITIONS if t.source in after and t.target in sources}
    assert not back


# -- where the spare comes from (issue 12: reported; requireSameDomain holds for capacity) ------

def _claimed(placed: dict[str, str], steps: cp.Steps | None = None) -> Decision:
    rec = record(Phase.CORDONED, ledger=(open_step("claim-spare"),))
    v = view(policies(policy(steps=steps)))
    return step(rec, s_trigger("claim-spare", StepOutcome.DONE, spare="s1", **placed), T0 + 5, v)


def _events(d: Decision) -> dict[str, EmitEvent]:
    return {a.reason: a for a in d.actions if isinstance(a, EmitEvent)}


def test_a_spare_from_another_domain_is_recorded_and_raises_an_event() -> None:
    d = _claimed({"match": "tier-1", "nodeDomain": "nvl-a", "spareDomain": "nvl-b",
                  "switch": "spine1"})
    assert d.record is not None
    assert d.phase is Phase.SWAPPING
    assert d.record.spare_placement == Placement("tier-1", "nvl-a", "nvl-b", "spine1")
    ev = _events(d)["SpareFromOtherDomain"]
    assert ev.type == "Warning"
    assert "NVLink domain nvl-b" in ev.note
    assert "n1 in nvl-a" in ev.note
    assert "tier-1 spine1" in ev.note
    # the record carries it to the NodeRemediation's status and back
    back = NodeRecord.from_dict(d.record.to_dict())
    assert back.spare_placement == d.record.spare_placement
    assert d.record.to_dict()["sparePlacement"] == {
        "level": "tier-1", "sameDomain": False, "nodeDomain": "nvl-a", "spareDomain": "nvl-b",
        "switch": "spine1"}


def test_a_spare_from_the_same_domain_raises_no_warning() -> None:
    d = _claimed({"match": "domain", "nodeDomain": "nvl-a", "spareDomain": "nvl-a"})
    assert d.record is not None
    assert d.record.spare_placement is not None
    assert d.record.spare_placement.same_domain
    ev = _events(d)
    assert "SpareFromOtherDomain" not in ev
    assert "n1's NVLink domain nvl-a" in ev["SpareClaimed"].note


def test_a_claim_without_placement_data_records_none() -> None:
    d = _claimed({})  # e.g. a dry run: no spare was really chosen
    assert d.record is not None
    assert d.record.spare_placement is None
    assert "SpareFromOtherDomain" not in _events(d)


def test_require_same_domain_reaches_the_claim_and_holds_for_capacity() -> None:
    steps = cp.Steps(swap=cp.SwapStep(require_same_domain=True))
    rec = record(Phase.CORDONED, ledger=(open_step("cordon"),))
    v = view(policies(policy(steps=steps)))
    d = step(rec, s_trigger("cordon", StepOutcome.DONE), T0 + 1, v)
    claims = [a for a in d.actions if isinstance(a, ClaimSpare)]
    assert claims
    assert claims[0].same_domain
    why = "no free warm spare in NVLink domain nvl-a (swap.requireSameDomain)"
    d2 = step(d.record, s_trigger("claim-spare", StepOutcome.UNAVAILABLE, error=why), T0 + 2, v)
    assert d2.phase is Phase.HELD_FOR_CAPACITY
    assert d2.record is not None
    assert why in _events(d2)["HeldForCapacity"].note
    assert held_reason(d2.record) == f"held for capacity: {why}"
    assert reason_of(d2.record) == f"held for capacity: {why}"


def test_default_claim_takes_any_domain() -> None:
    rec = record(Phase.CORDONED, ledger=(open_step("cordon"),))
    d = step(rec, s_trigger("cordon", StepOutcome.DONE), T0 + 1, view())
    claims = [a for a in d.actions if isinstance(a, ClaimSpare)]
    assert claims
    assert not claims[0].same_domain


def test_a_failed_read_of_slurm_while_draining_waits_for_the_next_poll() -> None:
    """An API server or slurmctld restart makes one read of Slurm's view fail: that is not a
    step of the remediation, so Draining carries on (the next poll reads it again, the drain
    deadline bounds the wait); a failed step still escalates."""
    v = view(policies(policy()))
    rec = record(Phase.DRAINING, ledger=(done_step("drain"),))
    d = step(rec, s_trigger("observe-slurm", StepOutcome.RETRY, error="connection refused"),
             T0 + 5, v)
    assert d.record is None or d.record.phase is Phase.DRAINING, d.transitions
    assert not d.transitions
    d2 = step(rec, s_trigger("observe-slurm", StepOutcome.FAILED, error="scaled in"), T0 + 6, v)
    assert d2.record is not None
    assert d2.record.phase is Phase.ESCALATED
