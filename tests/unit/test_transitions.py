"""Table-driven tests of every transition of the state machine.

Each case starts from a record in some phase, applies one trigger and checks the phase it ends
in and the steps it issued. ``test_every_row_is_exercised`` replays all cases with the table
instrumented and fails if any row of ``TRANSITIONS`` was never selected: a new row needs a case.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from healer.core import rules as cp
from healer.core.actions import EmitEvent
from healer.core.budget import BudgetView
from healer.core.machine import (
    TRANSITIONS,
    Decision,
    TransitionRow,
    TriggerKind,
    step,
    stepping,
)
from healer.core.machine.context import Ctx
from healer.core.model import HealthState, PastIncident, Severity, StepOutcome
from healer.core.phases import Phase
from tests.builders import (
    T0,
    done_step,
    node,
    open_step,
    policies,
    policy,
    record,
    s_trigger,
    slurm_trigger,
    trigger,
    v_trigger,
    view,
)
from tests.unit.dead_transition_cases import DEAD_CASES
from tests.unit.transition_case import Case, policy_view

P, K, S, H = Phase, TriggerKind, StepOutcome, HealthState
LATE = T0 + 10 * 86400  # past every deadline


def _policy_view(**kw: Any) -> BudgetView:
    return policy_view(**kw)


CHECKPOINT_ON = cp.Steps(checkpoint=cp.CheckpointStep(
    enabled=True, severities=frozenset({Severity.DEGRADING, Severity.FAILED})))
CHECKPOINT_ESCALATES = cp.Steps(checkpoint=cp.CheckpointStep(
    enabled=True, on_timeout=cp.CheckpointTimeout.ESCALATE,
    severities=frozenset({Severity.FAILED})))
NO_SWAP = cp.Steps(swap=cp.SwapStep(enabled=False))
VALIDATE = cp.Steps(validation=cp.ValidationStep(enabled=True, image="i", command=("c",)))
REQUEUE = cp.Steps(drain=cp.DrainStep(deadline=600, on_timeout=cp.DrainTimeout.REQUEUE,
                                      requeue_grace=60))
HOLD_TIMEOUT = cp.Steps(swap=cp.SwapStep(hold_timeout=3600))
REPAIR_DEADLINE = cp.Steps(repair=cp.RepairStep(deadline=3600))
budget = cp.Guardrails(retry_budget=cp.RetryBudget(per_node=2, per_gpu_serial=1, window=86400))

CASES: list[Case] = [
    # -- Healthy -------------------------------------------------------------------------------
    Case("healthy/failed-verdict-opens-and-admits", None, v_trigger(H.FAILED), P.DRAINING,
         ("drain",), ("IncidentOpened", "RemediationStarted")),
    Case("healthy/degrading-verdict-opens-and-admits", None, v_trigger(H.DEGRADING), P.DRAINING,
         ("drain",)),
    Case("healthy/suspect-verdict", None, v_trigger(H.SUSPECT), P.SUSPECT),
    Case("healthy/healthy-verdict-stays", None, v_trigger(H.HEALTHY), P.HEALTHY),
    Case("healthy/stale-verdict-stays", None, v_trigger(H.STALE), P.HEALTHY),
    Case("healthy/opted-out-node-ignored", None, v_trigger(H.FAILED), P.HEALTHY,
         view=view(nodes=[node("n1", **{"healer.io/exclude": "true"})])),
    Case("healthy/spare-node-ignored", None, v_trigger(H.FAILED), P.HEALTHY,
         view=view(nodes=[node("n1", **{"healer.io/role": "spare"})])),
    Case("healthy/paused-ignored", None, v_trigger(H.FAILED), P.HEALTHY,
         view=view(paused=True)),
    # -- Suspect -------------------------------------------------------------------------------
    Case("suspect/failed", record(P.SUSPECT), v_trigger(H.FAILED), P.DRAINING, ("drain",)),
    Case("suspect/degrading", record(P.SUSPECT), v_trigger(H.DEGRADING), P.DRAINING, ("drain",)),
    Case("suspect/healthy-drops", record(P.SUSPECT), v_trigger(H.HEALTHY), P.HEALTHY),
    Case("suspect/still-suspect", record(P.SUSPECT), v_trigger(H.SUSPECT), P.SUSPECT),
    Case("suspect/tick", record(P.SUSPECT), trigger(K.TICK), P.SUSPECT),
    Case("suspect/resume", record(P.SUSPECT), trigger(K.RESUME), P.SUSPECT),
    Case("suspect/opt-out", record(P.SUSPECT), trigger(K.OPT_OUT), P.HEALTHY),
    Case("suspect/policy-gone", record(P.SUSPECT, policy_name="gone"), trigger(K.TICK),
         P.HEALTHY),
    # -- Degrading / Failed (admission) --------------------------------------------------------
    Case("degrading/upgrade-to-failed", record(P.DEGRADING, severity=Severity.DEGRADING,
                                               verdict=H.DEGRADING),
         v_trigger(H.FAILED), P.DRAINING, ("drain",), ("SeverityRaised",)),
    Case("degrading/checkpoint-first", record(P.DEGRADING, severity=Severity.DEGRADING,
                                              verdict=H.DEGRADING),
         trigger(K.TICK), P.CHECKPOINTING, ("checkpoint",), view=_policy_view(steps=CHECKPOINT_ON)),
    Case("failed/checkpoint-first-when-policy-says", record(P.FAILED), trigger(K.TICK),
         P.CHECKPOINTING, ("checkpoint",), view=_policy_view(steps=CHECKPOINT_ON)),
    Case("failed/no-checkpoint-for-failed-by-default", record(P.FAILED), trigger(K.TICK),
         P.DRAINING, ("drain",), view=_policy_view(steps=cp.Steps(checkpoint=cp.CheckpointStep(
             enabled=True)))),
    *[c for ph in (P.DEGRADING, P.FAILED) for c in (
        Case(f"{ph.value}/healthy-recovers", record(ph), v_trigger(H.HEALTHY), P.DONE, (),
             ("Recovered",), check=lambda d: d.record.outcome == "recovered"),
        Case(f"{ph.value}/verdict-stays-blocked", record(ph), v_trigger(H.STALE), ph, (),
             ("GuardrailBlocked",)),
        Case(f"{ph.value}/tick-admits", record(ph), trigger(K.TICK), P.DRAINING, ("drain",)),
        Case(f"{ph.value}/resume-admits", record(ph), trigger(K.RESUME), P.DRAINING, ("drain",)),
        Case(f"{ph.value}/opt-out", record(ph), trigger(K.OPT_OUT), P.CANCELLED),
        Case(f"{ph.value}/policy-gone", record(ph, policy_name="gone"), trigger(K.TICK),
             P.CANCELLED),
        Case(f"{ph.value}/observe-only", record(ph), trigger(K.TICK), ph, (),
             ("GuardrailBlocked",), view=_policy_view(mode=cp.Mode.OBSERVE)),
        Case(f"{ph.value}/retry-budget-escalates", record(ph), trigger(K.TICK), P.ESCALATED,
             ("escalate",), view=view(policies(policy(guardrails=budget)), incidents=[
                 PastIncident("old1", "n1", T0 - 3600, "p"),
                 PastIncident("old2", "n1", T0 - 7200, "p")])),
        Case(f"{ph.value}/guardrail-blocks", record(ph), trigger(K.TICK), ph, (),
             ("GuardrailBlocked",), view=view(policies(policy(guardrails=cp.Guardrails(
                 max_concurrent=1))), records=[record(P.DRAINING, nodename="n2")])),
    )],
    # -- Checkpointing -------------------------------------------------------------------------
    Case("checkpointing/acked", record(P.CHECKPOINTING, ledger=(open_step("checkpoint"),)),
         s_trigger("checkpoint", S.DONE), P.DRAINING, ("drain",),
         view=_policy_view(steps=CHECKPOINT_ON)),
    Case("checkpointing/hook-failed-continue",
         record(P.CHECKPOINTING, ledger=(open_step("checkpoint"),)),
         s_trigger("checkpoint", S.FAILED, error="webhook 500"), P.DRAINING, ("drain",),
         ("CheckpointFailed",), view=_policy_view(steps=CHECKPOINT_ON),
         check=lambda d: "webhook 500" in next(a.note for a in d.actions
                                                if isinstance(a, EmitEvent))),
    Case("checkpointing/deadline-continue", record(P.CHECKPOINTING,
                                                   ledger=(open_step("checkpoint"),)),
         trigger(K.TICK, at=LATE), P.DRAINING, ("drain",), now=LATE,
         view=_policy_view(steps=CHECKPOINT_ON)),
    Case("checkpointing/deadline-escalate", record(P.CHECKPOINTING,
                                                   ledger=(open_step("checkpoint"),)),
         trigger(K.TICK, at=LATE), P.ESCALATED, ("escalate",), now=LATE,
         view=_policy_view(steps=CHECKPOINT_ESCALATES)),
    Case("checkpointing/healthy-recovers", record(P.CHECKPOINTING,
                                                  ledger=(open_step("checkpoint"),)),
         v_trigger(H.HEALTHY), P.DONE, (), ("Recovered",)),
    # -- Draining ------------------------------------------------------------------------------
    Case("draining/drain-accepted-observes", record(P.DRAINING, ledger=(open_step("drain"),)),
         s_trigger("drain", S.DONE), P.DRAINING,
         check=lambda d: any(type(a).__name__ == "ObserveSlurm" for a in d.actions)),
    Case("draining/requeued-observes", record(P.DRAINING, ledger=(
        done_step("drain"), open_step("requeue"))), s_trigger("requeue", S.DONE), P.DRAINING,
         check=lambda d: any(type(a).__name__ == "ObserveSlurm" for a in d.actions)),
    Case("draining/drained-cordons", record(P.DRAINING, ledger=(done_step("drain"),)),
         slurm_trigger(True, False), P.CORDONED, ("cordon",)),
    Case("draining/busy-waits", record(P.DRAINING, ledger=(done_step("drain"),)),
         slurm_trigger(True, True), P.DRAINING),
    Case("draining/busy-at-deadline-requeues", record(P.DRAINING, ledger=(done_step("drain"),)),
         slurm_trigger(True, True, at=LATE), P.DRAINING, ("requeue",), now=LATE,
         view=_policy_view(steps=REQUEUE)),
    Case("draining/busy-at-deadline-escalates", record(P.DRAINING, ledger=(done_step("drain"),)),
         slurm_trigger(True, True, at=LATE), P.ESCALATED, ("escalate",), now=LATE),
    Case("draining/still-busy-after-requeue-grace", record(P.DRAINING, ledger=(
        done_step("drain"), done_step("requeue"))), slurm_trigger(True, True, at=LATE),
         P.ESCALATED, ("escalate",), now=LATE, view=_policy_view(steps=REQUEUE)),
    Case("draining/not-yet-drained-waits", record(P.DRAINING, ledger=(done_step("drain"),)),
         slurm_trigger(False, False), P.DRAINING),
    Case("draining/tick-not-accepted-by-deadline", record(P.DRAINING,
                                                          ledger=(open_step("drain"),)),
         trigger(K.TICK, at=LATE), P.ESCALATED, ("escalate",), now=LATE),
    Case("draining/tick-observes", record(P.DRAINING, ledger=(done_step("drain"),)),
         trigger(K.TICK), P.DRAINING,
         check=lambda d: any(type(a).__name__ == "ObserveSlurm" for a in d.actions)),
    Case("draining/healthy-recovers-undoes", record(P.DRAINING, ledger=(done_step("drain"),)),
         v_trigger(H.HEALTHY), P.RECOVERED, ("undo-drain", "uncordon"), ("Recovered",)),
    Case("draining/admin-uncordon-cancels", record(P.DRAINING, ledger=(done_step("drain"),)),
         trigger(K.ADMIN_UNCORDON), P.CANCELLED, ("undo-drain", "uncordon")),
    # -- Cordoned ------------------------------------------------------------------------------
    Case("cordoned/cordon-done-claims", record(P.CORDONED, ledger=(open_step("cordon"),)),
         s_trigger("cordon", S.DONE), P.CORDONED, ("claim-spare",)),
    Case("cordoned/cordon-done-no-swap-repairs", record(P.CORDONED,
                                                        ledger=(open_step("cordon"),)),
         s_trigger("cordon", S.DONE), P.REPAIR, ("mark-repair",),
         view=_policy_view(steps=NO_SWAP)),
    Case("cordoned/spare-claimed", record(P.CORDONED, ledger=(done_step("cordon"),
                                                              open_step("claim-spare"))),
         s_trigger("claim-spare", S.DONE, spare="s1"), P.SWAPPING, ("move-workload",),
         ("SpareClaimed",), check=lambda d: d.record.spare == "s1"),
    Case("cordoned/no-spare-holds", record(P.CORDONED, ledger=(done_step("cordon"),
                                                               open_step("claim-spare"))),
         s_trigger("claim-spare", S.UNAVAILABLE), P.HELD_FOR_CAPACITY, (), ("HeldForCapacity",)),
    # -- HeldForCapacity -----------------------------------------------------------------------
    Case("held/spare-claimed", record(P.HELD_FOR_CAPACITY, ledger=(open_step("claim-spare"),)),
         s_trigger("claim-spare", S.DONE, spare="s2"), P.SWAPPING, ("move-workload",)),
    Case("held/still-none", record(P.HELD_FOR_CAPACITY, ledger=(open_step("claim-spare"),)),
         s_trigger("claim-spare", S.UNAVAILABLE), P.HELD_FOR_CAPACITY),
    Case("held/capacity-retries", record(P.HELD_FOR_CAPACITY, ledger=(done_step("claim-spare"),)),
         trigger(K.CAPACITY), P.HELD_FOR_CAPACITY, ("claim-spare",),
         check=lambda d: len([s for s in d.record.ledger if s.step == "claim-spare"]) == 1),
    Case("held/tick-retries", record(P.HELD_FOR_CAPACITY, ledger=(done_step("claim-spare"),)),
         trigger(K.TICK), P.HELD_FOR_CAPACITY, ("claim-spare",)),
    Case("held/hold-timeout", record(P.HELD_FOR_CAPACITY, ledger=(done_step("claim-spare"),)),
         trigger(K.TICK, at=LATE), P.ESCALATED, ("escalate",), now=LATE,
         view=_policy_view(steps=HOLD_TIMEOUT)),
    # -- Swapping ------------------------------------------------------------------------------
    Case("swapping/moved-awaits", record(P.SWAPPING, spare="s1",
                                         ledger=(open_step("move-workload"),)),
         s_trigger("move-workload", S.DONE), P.SWAPPING, ("await-replacement",)),
    Case("swapping/ready-annotates", record(P.SWAPPING, spare="s1", ledger=(
        done_step("move-workload"), open_step("await-replacement"))),
         s_trigger("await-replacement", S.DONE), P.ANNOTATING, ("annotate-topology",)),
    # -- Annotating ----------------------------------------------------------------------------
    Case("annotating/validates", record(P.ANNOTATING, spare="s1",
                                        ledger=(open_step("annotate-topology"),)),
         s_trigger("annotate-topology", S.DONE), P.VALIDATING, ("validate-replacement",),
         view=_policy_view(steps=VALIDATE)),
    Case("annotating/undrains", record(P.ANNOTATING, spare="s1",
                                       ledger=(open_step("annotate-topology"),)),
         s_trigger("annotate-topology", S.DONE), P.UNDRAINING, ("undrain",)),
    # -- Validating ----------------------------------------------------------------------------
    Case("validating/pass", record(P.VALIDATING, spare="s1",
                                   ledger=(open_step("validate-replacement"),)),
         s_trigger("validate-replacement", S.DONE), P.UNDRAINING, ("undrain",),
         view=_policy_view(steps=VALIDATE)),
    Case("validating/fail", record(P.VALIDATING, spare="s1",
                                   ledger=(open_step("validate-replacement"),)),
         s_trigger("validate-replacement", S.FAILED, error="diag"), P.ESCALATED, ("escalate",),
         view=_policy_view(steps=VALIDATE)),
    # -- Undraining ----------------------------------------------------------------------------
    Case("undraining/swapped-to-repair", record(P.UNDRAINING, spare="s1",
                                                ledger=(open_step("undrain"),)),
         s_trigger("undrain", S.DONE), P.REPAIR, ("mark-repair",)),
    Case("undraining/in-place-uncordons", record(P.UNDRAINING, repaired=True,
                                                 ledger=(open_step("undrain"),)),
         s_trigger("undrain", S.DONE), P.UNDRAINING, ("uncordon",)),
    Case("undraining/in-place-done", record(P.UNDRAINING, repaired=True, ledger=(
        done_step("undrain"), open_step("uncordon"))), s_trigger("uncordon", S.DONE), P.DONE,
         (), ("RemediationDone",), check=lambda d: d.record.outcome == "repaired"),
    # -- Repair --------------------------------------------------------------------------------
    Case("repair/serial-over-budget", record(P.REPAIR, spare="s1"),
         trigger(K.REPAIR, repair_passed=True), P.ESCALATED, ("escalate",),
         view=view(policies(policy(guardrails=budget)), incidents=[
             PastIncident("old", "n9", T0 - 60, "p", ("S1",))])),
    Case("repair/swapped-returns-to-pool", record(P.REPAIR, spare="s1"),
         trigger(K.REPAIR, repair_passed=True), P.REPAIR, ("return-to-pool",)),
    Case("repair/swapped-validates-first", record(P.REPAIR, spare="s1"),
         trigger(K.REPAIR, repair_passed=True), P.REPAIR, ("validate-repaired",),
         view=_policy_view(steps=VALIDATE)),
    Case("repair/in-place-validates", record(P.REPAIR), trigger(K.REPAIR, repair_passed=True),
         P.VALIDATING, ("validate-replacement",), view=_policy_view(steps=VALIDATE),
         check=lambda d: d.record.repaired),
    Case("repair/in-place-undrains", record(P.REPAIR), trigger(K.REPAIR, repair_passed=True),
         P.UNDRAINING, ("undrain",)),
    Case("repair/failed", record(P.REPAIR, spare="s1"), trigger(K.REPAIR, repair_passed=False),
         P.ESCALATED, ("escalate",)),
    Case("repair/validated-returns", record(P.REPAIR, spare="s1",
                                            ledger=(open_step("validate-repaired"),)),
         s_trigger("validate-repaired", S.DONE), P.REPAIR, ("return-to-pool",),
         view=_policy_view(steps=VALIDATE)),
    Case("repair/validation-failed", record(P.REPAIR, spare="s1",
                                            ledger=(open_step("validate-repaired"),)),
         s_trigger("validate-repaired", S.FAILED), P.ESCALATED, ("escalate",),
         view=_policy_view(steps=VALIDATE)),
    Case("repair/back-in-pool-done", record(P.REPAIR, spare="s1",
                                            ledger=(open_step("return-to-pool"),)),
         s_trigger("return-to-pool", S.DONE), P.DONE, (), ("RemediationDone",),
         check=lambda d: d.record.outcome == "replaced"),
    Case("repair/deadline", record(P.REPAIR, spare="s1"), trigger(K.TICK, at=LATE),
         P.ESCALATED, ("escalate",), now=LATE, view=_policy_view(steps=REPAIR_DEADLINE)),
    Case("repair/admin-uncordon-keeps", record(P.REPAIR, spare="s1",
                                               ledger=(done_step("drain"),)),
         trigger(K.ADMIN_UNCORDON), P.CANCELLED, ()),
    # -- Recovered -----------------------------------------------------------------------------
    Case("recovered/undo-finished", record(P.RECOVERED, ledger=(
        done_step("undo-drain"), open_step("uncordon"))), s_trigger("uncordon", S.DONE), P.DONE),
    # -- terminal ------------------------------------------------------------------------------
    *[c for ph in (P.DONE, P.ESCALATED, P.CANCELLED) for c in (
        Case(f"{ph.value}/step-absorbed", record(ph, ledger=(open_step("uncordon"),)),
             s_trigger("uncordon", S.DONE), ph, check=lambda d: d.record.ledger[-1].done),
        Case(f"{ph.value}/resume-reissues-undo", record(ph, ledger=(open_step("uncordon"),)),
             trigger(K.RESUME), ph, ("uncordon",)),
        Case(f"{ph.value}/tick-polls-undo", record(ph, ledger=(open_step("uncordon"),)),
             trigger(K.TICK), ph, ("uncordon",)),
        Case(f"{ph.value}/tick-idle", record(ph), trigger(K.TICK), ph),
        Case(f"{ph.value}/verdict-only-tracked", record(ph), v_trigger(H.HEALTHY), ph,
             check=lambda d: d.record.verdict is H.HEALTHY),
    )],
]

# Generic rows every working phase shares: derive one case per row from the phase's open step.
WORKING = {
    P.CHECKPOINTING: "checkpoint", P.DRAINING: "drain", P.CORDONED: "cordon",
    P.HELD_FOR_CAPACITY: "claim-spare", P.SWAPPING: "move-workload",
    P.ANNOTATING: "annotate-topology", P.VALIDATING: "validate-replacement",
    P.UNDRAINING: "undrain", P.REPAIR: "mark-repair", P.RECOVERED: "undo-drain",
}
UNCORDON_CANCELS = {P.DRAINING, P.CORDONED, P.HELD_FOR_CAPACITY, P.REPAIR}
OWN_DEADLINE = {P.CHECKPOINTING, P.DRAINING, P.HELD_FOR_CAPACITY, P.REPAIR}


def _generic(phase: Phase, st: str) -> list[Case]:
    spare = "s1" if phase in (P.SWAPPING, P.ANNOTATING, P.VALIDATING, P.UNDRAINING,
                              P.REPAIR) else ""
    ledger = (open_step(st),)
    out = [
        Case(f"{phase.value}/pending-waits", record(phase, spare=spare, ledger=ledger),
             s_trigger(st, S.PENDING), phase),
        Case(f"{phase.value}/retry-backs-off", record(phase, spare=spare, ledger=ledger),
             s_trigger(st, S.RETRY, error="timeout"), phase, (),
             check=lambda d, st=st: d.record.step(st).attempts == 2
             and d.record.step(st).error == "timeout" and d.recheck_after == 10.0),
        Case(f"{phase.value}/retries-exhausted", record(phase, spare=spare, ledger=(
            open_step(st, attempts=5),)), s_trigger(st, S.RETRY), P.ESCALATED, ("escalate",)),
        Case(f"{phase.value}/other-step-stays", record(phase, spare=spare, ledger=ledger),
             s_trigger("something-else", S.DONE), phase),
        Case(f"{phase.value}/failed-slurm-read-waits", record(phase, spare=spare, ledger=ledger),
             s_trigger("observe-slurm", S.RETRY, error="connection refused"), phase),
        Case(f"{phase.value}/tick-polls", record(phase, spare=spare, ledger=ledger),
             trigger(K.TICK), phase, (st,),
             check=lambda d, st=st: d.record.step(st).attempts == 1),
        Case(f"{phase.value}/resume-reissues", record(phase, spare=spare, ledger=ledger),
             trigger(K.RESUME), phase, (st,)),
        Case(f"{phase.value}/opt-out-cancels", record(phase, spare=spare, ledger=ledger),
             trigger(K.OPT_OUT), P.CANCELLED, (), ("Cancelled",)),
        Case(f"{phase.value}/verdict-stays", record(phase, spare=spare, ledger=ledger),
             v_trigger(H.FAILED), phase),
    ]
    if phase not in (P.CHECKPOINTING,):
        out.append(Case(f"{phase.value}/failed-escalates", record(phase, spare=spare,
                                                                  ledger=ledger),
                        s_trigger(st, S.FAILED, error="boom"), P.ESCALATED, ("escalate",)))
    if phase not in OWN_DEADLINE:
        out.append(Case(f"{phase.value}/deadline-escalates",
                        record(phase, spare=spare, ledger=ledger), trigger(K.TICK, at=LATE),
                        P.ESCALATED, ("escalate",), now=LATE))
    if phase in UNCORDON_CANCELS:
        undo = {P.DRAINING: ("undo-drain", "uncordon"), P.CORDONED: ("uncordon",)}
        out.append(Case(f"{phase.value}/admin-uncordon", record(phase, spare=spare,
                                                                ledger=ledger),
                        trigger(K.ADMIN_UNCORDON), P.CANCELLED, undo.get(phase, ())))
    if phase is P.HELD_FOR_CAPACITY:
        out.append(Case(f"{phase.value}/tick-claim-in-flight", record(phase, ledger=ledger),
                        trigger(K.TICK), phase, (st,)))
    return out


for _phase, _st in WORKING.items():
    CASES.extend(_generic(_phase, _st))
CASES.extend(DEAD_CASES)
CASES.append(Case("checkpointing/retries-exhausted-escalates-by-policy",
                  record(P.CHECKPOINTING, ledger=(open_step("checkpoint", attempts=5),)),
                  s_trigger("checkpoint", S.RETRY), P.ESCALATED, ("escalate",),
                  view=_policy_view(steps=CHECKPOINT_ESCALATES)))


def _run(case: Case) -> Decision:
    now = case.now if case.now is not None else case.trigger.at
    return step(case.record, case.trigger, now, case.view or view())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_transition(case: Case) -> None:
    d = _run(case)
    assert d.phase is case.phase, f"{case.id}: {d.transitions} note={d.note}"
    issued = tuple(a.ledger_name for a in d.actions if a.ledgered)
    assert issued == case.steps, f"{case.id}: issued {issued}"
    reasons = {a.reason for a in d.actions if isinstance(a, EmitEvent)}
    for ev in case.events:
        assert ev in reasons, f"{case.id}: events {reasons}"
    if case.check is not None:
        assert case.check(d), case.id
    if d.record is not None:
        for a in d.actions:
            if a.ledgered:
                s = d.record.step(a.ledger_name)
                assert s is not None, f"intent for {a.ledger_name} not in the ledger"
                assert not s.done, f"{a.ledger_name} issued but its ledger entry is closed"
            assert a.incident == d.record.incident.id


def test_every_row_is_exercised(monkeypatch: pytest.MonkeyPatch) -> None:
    hit: set[int] = set()
    real = stepping._select

    def spy(phase: Phase, kind: TriggerKind, ctx: Ctx) -> TransitionRow | None:
        row = real(phase, kind, ctx)
        if row is not None:
            hit.add(id(row))
        return row

    monkeypatch.setattr(stepping, "_select", spy)
    for case in CASES:
        _run(case)
    missing = [f"{t.source.value} --{t.label}--> {t.target.value if t.target else 'stay'}"
               for t in TRANSITIONS if id(t) not in hit]
    assert not missing, "rows without a test case:\n" + "\n".join(missing)


def test_stale_trigger_is_dropped() -> None:
    rec = record(P.DRAINING, ledger=(done_step("drain"),))
    rec = replace(rec, phase_since=T0 + 100)
    d = step(rec, slurm_trigger(True, False, at=T0 + 50), T0 + 101, view())
    assert d.phase is P.DRAINING
    assert d.actions == ()
    assert "stale" in d.note


def test_result_for_another_incident_is_dropped() -> None:
    rec = record(P.CORDONED, ledger=(open_step("claim-spare"),))
    trig = replace(s_trigger("claim-spare", S.DONE, spare="x"), incident="someone-else")
    d = step(rec, trig, T0, view())
    assert d.phase is P.CORDONED
    assert d.record is not None
    assert d.record.spare == ""


def test_pause_blocks_every_transition() -> None:
    rec = record(P.DRAINING, ledger=(done_step("drain"),))
    for trig in (slurm_trigger(True, False), trigger(K.ADMIN_UNCORDON), v_trigger(H.HEALTHY)):
        d = step(rec, trig, T0, view(paused_nodes=frozenset({"n1"})))
        assert d.phase is P.DRAINING
        assert d.actions == ()
        assert d.record is not None
        assert d.record.paused


def test_blocked_event_emitted_once_per_guardrail() -> None:
    v = view(policies(policy(mode=cp.Mode.OBSERVE)))
    d1 = step(record(P.FAILED), trigger(K.TICK), T0, v)
    assert [a.reason for a in d1.actions if isinstance(a, EmitEvent)] == ["GuardrailBlocked"]
    d2 = step(d1.record, trigger(K.TICK, at=T0 + 30), T0 + 30, v)
    assert d2.actions == ()


def test_recovered_undoes_only_started_steps() -> None:
    d = step(record(P.CHECKPOINTING, ledger=(open_step("checkpoint"),)), v_trigger(H.HEALTHY),
             T0, view())
    assert d.phase is P.DONE
    assert [a for a in d.actions if a.ledgered] == []
    assert d.record is not None
    assert d.record.step("checkpoint").outcome.value == "skipped"


def test_decision_is_deterministic() -> None:
    for case in CASES[:40]:
        assert _run(case) == _run(case)


def test_events_ride_with_the_intent_and_are_re_emitted_on_resume() -> None:
    """A leader that died after persisting a transition but before its Events re-emits them
    when it resumes (Events are idempotent by key, so a repeat is a no-op)."""
    v = view(policies(policy()))
    opened = step(None, v_trigger(H.FAILED), T0, v)
    assert opened.record is not None
    emitted = [a for a in opened.actions if isinstance(a, EmitEvent)]
    assert {a.reason for a in emitted} >= {"IncidentOpened", "RemediationStarted"}
    assert [e.reason for e in opened.record.events] == [a.reason for a in emitted]
    resumed = step(opened.record, trigger(TriggerKind.RESUME, at=T0 + 1), T0 + 1, v)
    again = [a for a in resumed.actions if isinstance(a, EmitEvent)]
    assert [a.key for a in again] == [a.key for a in emitted]
    assert resumed.record is not None
    assert resumed.record.events == opened.record.events
    # a decision without Events keeps the last ones (no extra write for them)
    polled = step(opened.record, trigger(TriggerKind.TICK, at=T0 + 2), T0 + 2, v)
    assert polled.record is not None
    assert polled.record.events == opened.record.events
