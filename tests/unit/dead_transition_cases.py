"""The state machine's dead-node rows, case by case (``test_transitions`` runs them with the
rest, and fails on a row no case exercises): a node that cannot act on its own is fenced
before anything irreversible, held when no provider says so, taken out of service, swapped;
a node that answers again before it is fenced goes back to the graceful flow."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from healer.core import rules as cp
from healer.core.actions import EmitEvent
from healer.core.budget import BudgetView, PastIncident
from healer.core.machine import SlurmObservation, TriggerKind
from healer.core.model import FenceProvider, HealthState, NodeCondition, NodeRecord, StepOutcome
from healer.core.phases import Phase
from healer.core.vocabulary import StepName
from tests.builders import (
    DEAD_ON,
    T0,
    d_trigger,
    death,
    done_step,
    node,
    open_step,
    policies,
    policy,
    record,
    s_trigger,
    trigger,
    v_trigger,
    view,
)
from tests.unit.transition_case import Case

P, K, S, H = Phase, TriggerKind, StepOutcome, HealthState
LATE = T0 + 10 * 86400

NO_SWAP = cp.Steps(swap=cp.SwapStep(enabled=False))
VALIDATE = cp.Steps(validation=cp.ValidationStep(enabled=True, image="i", command=("c",)))
BUDGET = cp.Guardrails(retry_budget=cp.RetryBudget(per_node=2, per_gpu_serial=1, window=86400))


def dview(*, ready: bool = False, **kw: Any) -> BudgetView:
    """A view whose one policy handles dead nodes (and ``kw``), n1 NotReady (its kubelet
    silent) unless ``ready``."""
    return view(policies(policy(dead=kw.pop("dead", DEAD_ON), **kw)),
                nodes=[node("n1", ready=ready)] + [node(f"n{i}") for i in range(2, 11)])


def dead(phase: Phase, *steps: Any, provider: FenceProvider | None = None,
         **kw: Any) -> NodeRecord:
    """A record in the dead-node flow."""
    fenced = {"provider": provider, "fenced_by": "x", "fenced_at": T0} if provider else {}
    return record(phase, ledger=tuple(steps), death=death(**fenced), **kw)


def fence_done(provider: str = "manual", by: str = "admin: PSU dead") -> Any:
    return s_trigger("fence", S.DONE, provider=provider, by=by)


def _events(*names: str) -> Any:
    def check(d: Any) -> bool:
        reasons = [a.reason for a in d.actions if isinstance(a, EmitEvent)]
        return all(n in reasons for n in names)
    return check


def _mass_death_view() -> BudgetView:
    """Three of ten nodes went NotReady together: more than 10% of the policy's nodes."""
    down = NodeCondition("Ready", "Unknown", last_transition=T0 - 60)
    nodes = [replace(node(f"n{i}"), conditions=(down,)) if i <= 3 else node(f"n{i}")
             for i in range(1, 11)]
    return view(policies(policy(dead=DEAD_ON)), nodes=nodes)


FENCE_OPEN = open_step("fence")
FENCE_DONE = done_step("fence")
CLAIM_DONE = done_step("claim-spare")

DEAD_CASES: list[Case] = [
    # -- a DOWN Slurm node with no job counts as drained (docs/adr/0016) -----------------------
    Case("draining/down-not-busy-counts-as-drained",
         record(P.DRAINING, ledger=(done_step("drain"),)),
         trigger(K.SLURM, slurm=SlurmObservation(drain=False, busy=False, down=True,
                                                 reason="Not responding")),
         P.CORDONED, ("cordon",)),
    Case("draining/down-and-busy-waits", record(P.DRAINING, ledger=(done_step("drain"),)),
         trigger(K.SLURM, slurm=SlurmObservation(drain=False, busy=True, down=True)),
         P.DRAINING),
    # -- a node dies ---------------------------------------------------------------------------
    Case("healthy/dead-opens-and-asks-for-a-fence", None, d_trigger(), P.DEAD,
         ("lost-jobs", "fence"), ("IncidentOpened", "NodeDead", "FenceRequested"),
         view=dview(), check=lambda d: d.record.death is not None
         and d.record.death.since == T0 - 150 and not d.record.death.fenced
         and "Ready=Unknown since then" in d.record.death.witnesses),
    Case("healthy/dead-without-dead-node-handling-is-ignored", None, d_trigger(), P.HEALTHY),
    Case("suspect/dead", record(P.SUSPECT), d_trigger(), P.DEAD, ("lost-jobs", "fence"),
         view=dview()),
    *[Case(f"{ph.value}/dies", record(ph), d_trigger(), P.DEAD, ("lost-jobs", "fence"),
           ("NodeDead",), view=dview()) for ph in (P.DEGRADING, P.FAILED)],
    *[Case(f"{ph.value}/dies-mid-flight", record(ph, ledger=(open_step(st),)), d_trigger(),
           P.DEAD, ("lost-jobs", "fence"), ("NodeDead",), view=dview(),
           check=lambda d, st=st: d.record.step(st).outcome.value == "skipped")
      for ph, st in ((P.CHECKPOINTING, "checkpoint"), (P.DRAINING, "drain"),
                     (P.CORDONED, "cordon"), (P.HELD_FOR_CAPACITY, "claim-spare"))],
    Case("held/dead-again-stays-in-its-flow",
         dead(P.HELD_FOR_CAPACITY, FENCE_DONE, done_step("claim-spare"),
              provider=FenceProvider.MANUAL), d_trigger(), P.HELD_FOR_CAPACITY, view=dview()),
    # -- Dead: admission -----------------------------------------------------------------------
    Case("dead/tick-admits", dead(P.DEAD), trigger(K.TICK), P.DEAD, ("fence",),
         ("FenceRequested",), view=dview()),
    Case("dead/observe-only-fences-nothing", dead(P.DEAD), trigger(K.TICK), P.DEAD, (),
         ("GuardrailBlocked",), view=dview(mode=cp.Mode.OBSERVE)),
    Case("dead/policy-gone-cancels", dead(P.DEAD, policy_name="gone"), trigger(K.TICK),
         P.CANCELLED),
    Case("dead/retry-budget-escalates", dead(P.DEAD), trigger(K.TICK), P.ESCALATED,
         ("escalate",), view=view(policies(policy(guardrails=BUDGET, dead=DEAD_ON)),
                                  incidents=[PastIncident("o1", "n1", T0 - 3600, "p"),
                                             PastIncident("o2", "n1", T0 - 7200, "p")])),
    Case("dead/mass-death-fences-nothing", dead(P.DEAD), trigger(K.TICK), P.DEAD, (),
         ("GuardrailBlocked",), view=_mass_death_view(),
         check=lambda d: d.record.blocked.guardrail == "mass-death"
         and "suspect the control plane or the network, not the nodes"
         in d.record.blocked.message),
    Case("dead/capacity-limits-never-hold-it", dead(P.DEAD), trigger(K.TICK), P.DEAD,
         ("fence",), view=view(policies(policy(dead=DEAD_ON, guardrails=cp.Guardrails(
             max_concurrent=1, max_unavailable=cp.Quantity(0)))),
             nodes=[node("n1", ready=False)] + [node(f"n{i}") for i in range(2, 11)],
             records=[record(P.DRAINING, nodename="n2")])),
    # its Node is Ready again before its verdict caught up (a mass death whose nodes all came
    # back at once: no NotReady node left to trip the breaker): never admitted
    Case("dead/ready-again-is-not-admitted", dead(P.DEAD), trigger(K.TICK), P.DEAD, (),
         view=dview(ready=True), check=lambda d: d.record.step("fence") is None),
    # -- Dead: fencing -------------------------------------------------------------------------
    Case("dead/still-dead-stays", dead(P.DEAD, FENCE_OPEN), d_trigger(), P.DEAD,
         view=dview()),
    Case("dead/healthy-recovers", dead(P.DEAD, FENCE_OPEN), v_trigger(H.HEALTHY), P.DONE, (),
         ("Recovered",), view=dview(),
         check=lambda d: d.record.step("fence").outcome.value == "skipped"),
    Case("dead/answers-again-goes-graceful", dead(P.DEAD, FENCE_OPEN), v_trigger(H.FAILED),
         P.DRAINING, ("drain",), ("NodeAnswered",), view=dview(ready=True),
         check=lambda d: d.record.death is None
         and d.record.step("fence").outcome.value == "skipped"),
    # a witness let go (Slurm hears the slurmd again, or the Ready condition's transition time
    # restarted deadAfter) but the node is still not Ready: no answer, it stays dead
    Case("dead/suspect-while-not-ready-stays", dead(P.DEAD, FENCE_OPEN),
         v_trigger(H.SUSPECT), P.DEAD, view=dview(),
         check=lambda d: d.record.death is not None and not d.record.step("fence").done),
    # a provider says fenced but the Node is Ready (its kubelet contradicts it): nothing is
    # taken out of service, the fence step stays open for the next Node change to poll
    Case("dead/fenced-but-ready-stays", dead(P.DEAD, FENCE_OPEN), fence_done(), P.DEAD, (),
         ("FenceContradicted",), view=dview(ready=True),
         check=lambda d: d.record.death is not None and not d.record.death.fenced
         and not d.record.step("fence").done
         and "the Node is Ready" in d.record.step("fence").error),
    # ... and once it is silent again, the next poll's answer takes it out of service
    Case("dead/fenced-but-ready-then-silent", dead(P.DEAD, FENCE_OPEN), trigger(K.NODE),
         P.DEAD, ("fence",), view=dview()),
    Case("dead/fenced-takes-it-out", dead(P.DEAD, FENCE_OPEN), fence_done(),
         P.OUT_OF_SERVICE, ("cordon", "claim-spare"), ("NodeFenced",), view=dview(),
         check=lambda d: d.record.death.provider is FenceProvider.MANUAL
         and d.record.death.fenced_by == "admin: PSU dead"),
    Case("dead/fenced-without-swap-taints-first", dead(P.DEAD, FENCE_OPEN), fence_done(),
         P.OUT_OF_SERVICE, ("cordon", "out-of-service"), view=dview(steps=NO_SWAP)),
    Case("dead/node-deleted-claims-only", dead(P.DEAD, FENCE_OPEN),
         fence_done("nodeDeleted", "Node deleted"), P.OUT_OF_SERVICE, ("claim-spare",),
         view=dview(), check=lambda d: d.record.node_deleted),
    Case("dead/node-deleted-without-swap-is-done", dead(P.DEAD, FENCE_OPEN),
         fence_done("nodeDeleted", "Node deleted"), P.DONE, (), ("RemediationDone",),
         view=dview(steps=NO_SWAP), check=lambda d: d.record.outcome == "node deleted"),
    Case("dead/lost-jobs-recorded", dead(P.DEAD, open_step("lost-jobs"), FENCE_OPEN),
         s_trigger("lost-jobs", S.DONE, jobs="17:RUNNING"), P.DEAD, (), ("JobsLost",),
         view=dview(), check=lambda d: d.record.death.lost_jobs == "17:RUNNING"),
    Case("dead/no-fence-by-the-deadline-holds", dead(P.DEAD, FENCE_OPEN),
         trigger(K.TICK, at=LATE), P.HELD_FOR_FENCING, (), ("HeldForFencing",), now=LATE,
         view=dview()),
    Case("dead/tick-polls-the-providers", dead(P.DEAD, FENCE_OPEN), trigger(K.TICK), P.DEAD,
         ("fence",), view=dview()),
    Case("dead/node-change-polls", dead(P.DEAD, FENCE_OPEN), trigger(K.NODE), P.DEAD,
         ("fence",), view=dview()),
    Case("dead/resume-polls", dead(P.DEAD, FENCE_OPEN), trigger(K.RESUME), P.DEAD,
         ("fence",), view=dview()),
    Case("dead/opt-out-cancels", dead(P.DEAD, FENCE_OPEN), trigger(K.OPT_OUT), P.CANCELLED,
         view=dview()),
    # -- HeldForFencing ------------------------------------------------------------------------
    Case("held-fencing/fenced", dead(P.HELD_FOR_FENCING, FENCE_OPEN), fence_done(),
         P.OUT_OF_SERVICE, ("cordon", "claim-spare"), ("NodeFenced",), view=dview()),
    Case("held-fencing/node-deleted-without-swap", dead(P.HELD_FOR_FENCING, FENCE_OPEN),
         fence_done("nodeDeleted"), P.DONE, view=dview(steps=NO_SWAP)),
    Case("held-fencing/healthy-recovers", dead(P.HELD_FOR_FENCING, FENCE_OPEN),
         v_trigger(H.HEALTHY), P.DONE, view=dview()),
    Case("held-fencing/still-dead", dead(P.HELD_FOR_FENCING, FENCE_OPEN), d_trigger(),
         P.HELD_FOR_FENCING, view=dview()),
    Case("held-fencing/answers-again", dead(P.HELD_FOR_FENCING, FENCE_OPEN),
         v_trigger(H.FAILED), P.DRAINING, ("drain",), view=dview(ready=True)),
    Case("held-fencing/fenced-but-ready-stays", dead(P.HELD_FOR_FENCING, FENCE_OPEN),
         fence_done(), P.HELD_FOR_FENCING, (), ("FenceContradicted",), view=dview(ready=True),
         check=lambda d: not d.record.step("fence").done and not d.record.death.fenced),
    Case("held-fencing/suspect-while-not-ready-stays", dead(P.HELD_FOR_FENCING, FENCE_OPEN),
         v_trigger(H.SUSPECT), P.HELD_FOR_FENCING, view=dview()),
    Case("held-fencing/lost-jobs", dead(P.HELD_FOR_FENCING, FENCE_OPEN,
                                        open_step("lost-jobs")),
         s_trigger("lost-jobs", S.DONE, jobs="none"), P.HELD_FOR_FENCING, view=dview()),
    Case("held-fencing/node-change-polls", dead(P.HELD_FOR_FENCING, FENCE_OPEN),
         trigger(K.NODE), P.HELD_FOR_FENCING, ("fence",), view=dview()),
    # -- OutOfService --------------------------------------------------------------------------
    Case("out-of-service/claimed-then-tainted",
         dead(P.OUT_OF_SERVICE, FENCE_DONE, open_step("claim-spare"),
              provider=FenceProvider.MANUAL),
         s_trigger("claim-spare", S.DONE, spare="s1"), P.OUT_OF_SERVICE, ("out-of-service",),
         ("SpareClaimed",), view=dview(), check=lambda d: d.record.spare == "s1"),
    Case("out-of-service/claimed-for-a-deleted-node-moves",
         dead(P.OUT_OF_SERVICE, FENCE_DONE, open_step("claim-spare"),
              provider=FenceProvider.NODE_DELETED),
         s_trigger("claim-spare", S.DONE, spare="s1"), P.SWAPPING, ("move-workload",),
         view=dview()),
    Case("out-of-service/no-spare-holds",
         dead(P.OUT_OF_SERVICE, FENCE_DONE, open_step("claim-spare"),
              provider=FenceProvider.MANUAL),
         s_trigger("claim-spare", S.UNAVAILABLE), P.HELD_FOR_CAPACITY, (),
         ("HeldForCapacity",), view=dview()),
    Case("out-of-service/tainted-moves",
         dead(P.OUT_OF_SERVICE, FENCE_DONE, CLAIM_DONE, open_step("out-of-service"),
              provider=FenceProvider.MANUAL, spare="s1"),
         s_trigger("out-of-service", S.DONE), P.SWAPPING, ("move-workload",), view=dview(),
         check=lambda d: next(a for a in d.actions if a.ledger_name == "move-workload").dead),
    Case("out-of-service/tainted-repairs-in-place",
         dead(P.OUT_OF_SERVICE, FENCE_DONE, open_step("out-of-service"),
              provider=FenceProvider.MANUAL),
         s_trigger("out-of-service", S.DONE), P.REPAIR, ("mark-repair",),
         view=dview(steps=NO_SWAP)),
    Case("out-of-service/lost-jobs", dead(P.OUT_OF_SERVICE, open_step("lost-jobs"),
                                          provider=FenceProvider.MANUAL),
         s_trigger("lost-jobs", S.DONE, jobs="none"), P.OUT_OF_SERVICE, view=dview()),
    Case("out-of-service/node-change-polls",
         dead(P.OUT_OF_SERVICE, open_step("cordon"), provider=FenceProvider.MANUAL),
         trigger(K.NODE), P.OUT_OF_SERVICE, ("cordon",), view=dview()),
    Case("out-of-service/admin-uncordon-cancels-and-gives-back",
         dead(P.OUT_OF_SERVICE, FENCE_DONE, done_step("cordon"), CLAIM_DONE,
              open_step("out-of-service"), provider=FenceProvider.MANUAL, spare="s1"),
         trigger(K.ADMIN_UNCORDON), P.CANCELLED, ("release-spare", "uncordon"),
         view=dview()),
    Case("held/dead-claimed-then-tainted",
         dead(P.HELD_FOR_CAPACITY, FENCE_DONE, open_step("claim-spare"),
              provider=FenceProvider.MANUAL),
         s_trigger("claim-spare", S.DONE, spare="s2"), P.OUT_OF_SERVICE, ("out-of-service",),
         view=dview()),
    Case("held/dead-deleted-claimed-moves",
         dead(P.HELD_FOR_CAPACITY, FENCE_DONE, open_step("claim-spare"),
              provider=FenceProvider.NODE_DELETED),
         s_trigger("claim-spare", S.DONE, spare="s2"), P.SWAPPING, ("move-workload",),
         view=dview()),
    # -- the end of a dead node's flow ---------------------------------------------------------
    Case("undraining/node-deleted-is-done",
         dead(P.UNDRAINING, open_step("undrain"), provider=FenceProvider.NODE_DELETED,
              spare="s1"),
         s_trigger("undrain", S.DONE), P.DONE, (), ("RemediationDone",), view=dview()),
    Case("repair/out-of-service-comes-off-first",
         dead(P.REPAIR, done_step("out-of-service"), provider=FenceProvider.MANUAL,
              spare="s1"),
         trigger(K.REPAIR, repair_passed=True), P.REPAIR, ("clear-out-of-service",),
         view=dview(), check=lambda d: d.record.repaired),
    Case("repair/cleared-returns-to-pool",
         dead(P.REPAIR, done_step("out-of-service"), open_step("clear-out-of-service"),
              provider=FenceProvider.MANUAL, spare="s1", repaired=True),
         s_trigger("clear-out-of-service", S.DONE), P.REPAIR, ("return-to-pool",),
         view=dview()),
    Case("repair/cleared-validates-in-place",
         dead(P.REPAIR, done_step("out-of-service"), open_step("clear-out-of-service"),
              provider=FenceProvider.MANUAL, repaired=True),
         s_trigger("clear-out-of-service", S.DONE), P.VALIDATING, ("validate-replacement",),
         view=dview(steps=VALIDATE)),
    Case("repair/cleared-undrains-in-place",
         dead(P.REPAIR, done_step("out-of-service"), open_step("clear-out-of-service"),
              provider=FenceProvider.MANUAL, repaired=True),
         s_trigger("clear-out-of-service", S.DONE), P.UNDRAINING, ("undrain",),
         view=dview(steps=NO_SWAP)),
    Case("repair/node-change-polls-the-open-step",
         dead(P.REPAIR, open_step("clear-out-of-service"), provider=FenceProvider.MANUAL,
              spare="s1", repaired=True),
         trigger(K.NODE), P.REPAIR, ("clear-out-of-service",), view=dview()),
    Case("repair/node-change-idle", record(P.REPAIR, spare="s1"), trigger(K.NODE), P.REPAIR),
]


def _outcomes(phase: Phase, step: str) -> list[Case]:
    """The shared step-outcome, poll and opt-out rows of a dead phase."""
    rec = dead(phase, open_step(step), provider=FenceProvider.MANUAL
               if phase is P.OUT_OF_SERVICE else None)
    stuck = dead(phase, open_step(step, attempts=5), provider=rec.death.provider
                 if rec.death is not None else None)
    v = dview()
    out = [
        Case(f"{phase.value}/pending-waits", rec, s_trigger(step, S.PENDING), phase, view=v),
        Case(f"{phase.value}/retry-backs-off", rec, s_trigger(step, S.RETRY, error="t"),
             phase, view=v, check=lambda d: d.record.step(step).attempts == 2),
        Case(f"{phase.value}/retries-exhausted", stuck, s_trigger(step, S.RETRY),
             P.ESCALATED, ("escalate",), view=v),
        Case(f"{phase.value}/other-step", rec, s_trigger("something-else", S.DONE), phase,
             view=v),
        Case(f"{phase.value}/failed-slurm-read", rec,
             s_trigger("observe-slurm", S.RETRY, error="refused"), phase, view=v),
        Case(f"{phase.value}/tick-polls", rec, trigger(K.TICK), phase, (step,), view=v),
        Case(f"{phase.value}/resume-reissues", rec, trigger(K.RESUME), phase, (step,),
             view=v),
        Case(f"{phase.value}/opt-out-cancels", rec, trigger(K.OPT_OUT), P.CANCELLED,
             view=v),
    ]
    if phase is P.OUT_OF_SERVICE:
        out += [
            Case(f"{phase.value}/verdict-changes-nothing", rec, v_trigger(H.HEALTHY), phase,
                 view=v),
            Case(f"{phase.value}/deadline-escalates", rec, trigger(K.TICK, at=LATE),
                 P.ESCALATED, ("escalate",), now=LATE, view=v),
        ]
    return out


for _phase, _step in ((P.DEAD, StepName.FENCE.value),
                      (P.HELD_FOR_FENCING, StepName.FENCE.value),
                      (P.OUT_OF_SERVICE, StepName.OUT_OF_SERVICE.value)):
    DEAD_CASES.extend(_outcomes(_phase, _step))
