"""The effects of the transition table's dead-node rows: a node that cannot act on its own
(:class:`~healer.core.model.Death`) is fenced before anything irreversible, then taken out of
service and swapped (docs/adr/0015-dead-nodes-fencing-out-of-service.md).

Like :mod:`healer.core.machine.effects` (whose helpers these build on), each is a named
:class:`Effect` that only changes ``ctx.record`` and appends to ``ctx.actions``.
"""

from __future__ import annotations

from dataclasses import replace

from healer.core.actions import Fence
from healer.core.machine.context import Ctx, Effect
from healer.core.machine.effects import OPEN_INCIDENT, build_action, record_spare
from healer.core.model import (
    EVIDENCE_LIMIT,
    Death,
    FenceProvider,
    HealthState,
    RecordOutcome,
    Severity,
    StepKey,
)
from healer.core.rules import DEAD_RULE
from healer.core.timefmt import format_duration, rfc3339
from healer.core.vocabulary import StepName


def _death_of(ctx: Ctx) -> Death:
    """The death the trigger's dead verdict describes (its dead match's time and words)."""
    v = ctx.trigger.verdict
    assert v is not None
    m = next((m for m in v.matches if m.rule == DEAD_RULE
              and m.state is HealthState.DEAD), None)
    since = m.since if m is not None else ctx.now
    words = tuple(w.strip() for w in (m.detail.removeprefix("node dead:") if m is not None
                                      else v.summary()).split(";") if w.strip())
    seen = ctx.view.nodes.get(ctx.trigger.node)
    labels = tuple(sorted(seen.labels.items())) if seen is not None else ()
    return Death(since=since, declared=ctx.now, witnesses=words, labels=labels)


def _dead_event(ctx: Ctx) -> None:
    d = ctx.rec.death
    assert d is not None
    ctx.event("dead", "NodeDead",
              f"{ctx.rec.node} is dead (no checkpoint, drain or eviction: nobody can answer "
              f"them): {'; '.join(d.witnesses) or 'no witness named'}; dead since "
              f"{rfc3339(d.since)}, declared {format_duration(max(d.declared - d.since, 0.0))} "
              "later; nothing irreversible happens before a fencing provider says the "
              "machine is off or cut off", warning=True)


def _open_dead(ctx: Ctx) -> None:
    OPEN_INCIDENT(ctx)
    ctx.record = replace(ctx.rec, death=_death_of(ctx))
    _dead_event(ctx)
    ctx.issue(build_action(ctx, StepName.LOST_JOBS))


OPEN_DEAD = Effect("open incident, record death, issue lost-jobs", _open_dead)


def _go_dead(ctx: Ctx) -> None:
    """An incident in flight whose node died: its graceful steps cannot finish."""
    v = ctx.trigger.verdict
    assert v is not None
    ctx.close_open("superseded: the node died")
    inc = ctx.rec.incident
    ctx.record = replace(ctx.rec, blocked=None, death=_death_of(ctx), incident=replace(
        inc, severity=Severity.FAILED, rules=tuple(dict.fromkeys(inc.rules + v.rules)),
        summary=v.summary(), evidence=(inc.evidence + v.evidence)[-EVIDENCE_LIMIT:]))
    _dead_event(ctx)
    ctx.issue(build_action(ctx, StepName.LOST_JOBS))


GO_DEAD = Effect("close open steps, record death, issue lost-jobs", _go_dead)


def _record_lost_jobs(ctx: Ctx) -> None:
    r = ctx.result
    d = ctx.rec.death
    if r is None or d is None:
        return
    jobs = r.get(StepKey.JOBS) or "none"
    ctx.record = replace(ctx.rec, death=replace(d, lost_jobs=jobs))
    if jobs != "none":
        ctx.event("lost-jobs", "JobsLost",
                  f"jobs Slurm failed or requeued on dead node {ctx.rec.node}: {jobs}",
                  warning=True)


RECORD_LOST_JOBS = Effect("record the lost jobs", _record_lost_jobs)


def _admit_fence(ctx: Ctx) -> None:
    assert ctx.policy is not None
    ctx.record = replace(ctx.rec, blocked=None, mode=ctx.policy.mode)
    fence = build_action(ctx, StepName.FENCE)
    ctx.issue(fence)
    assert isinstance(fence, Fence)
    ctx.event("fence", "FenceRequested",
              f"fencing {ctx.rec.node}: waiting until {rfc3339(fence.deadline)} for "
              f"{', '.join(fence.providers) or 'no provider'} to say it is off or cut off "
              f"(mode {ctx.rec.mode.value})")


ADMIT_FENCE = Effect("admit, issue fence", _admit_fence)


def _fenced(ctx: Ctx) -> None:
    r = ctx.result
    d = ctx.rec.death
    assert r is not None
    assert d is not None
    provider = FenceProvider(r.get(StepKey.PROVIDER))
    ctx.record = replace(ctx.rec, death=replace(d, provider=provider,
                                                fenced_by=r.get(StepKey.BY)[:250],
                                                fenced_at=ctx.now))
    ctx.event("fenced", "NodeFenced",
              f"{ctx.rec.node} fenced by {provider.value} ({r.get(StepKey.BY) or 'no detail'}) "
              f"{format_duration(max(ctx.now - d.declared, 0.0))} after it was declared dead")
    deleted = provider is FenceProvider.NODE_DELETED
    if not deleted:
        ctx.issue(build_action(ctx, StepName.CORDON))
    if ctx.steps.swap.enabled:
        ctx.issue(build_action(ctx, StepName.CLAIM_SPARE))
    elif not deleted:
        ctx.issue(build_action(ctx, StepName.OUT_OF_SERVICE))


FENCED = Effect("record fencing; issue cordon, claim-spare (or out-of-service)", _fenced)


def _fenced_gone(ctx: Ctx) -> None:
    r = ctx.result
    d = ctx.rec.death
    assert r is not None
    assert d is not None
    ctx.record = replace(ctx.rec, outcome=RecordOutcome.NODE_DELETED, death=replace(
        d, provider=FenceProvider.NODE_DELETED, fenced_by=r.get(StepKey.BY)[:250],
        fenced_at=ctx.now))
    ctx.event("done", "RemediationDone",
              f"{ctx.rec.node}: its Node was deleted and the policy swaps nothing: nothing "
              "is left to do")


FENCED_GONE = Effect("record fencing, close: Node deleted", _fenced_gone)


def _held_fence(ctx: Ctx) -> None:
    assert ctx.policy is not None
    f = ctx.policy.dead.fencing
    ways = ", ".join(sorted(p.value for p in f.providers)) or "none"
    ctx.event("held-fence", "HeldForFencing",
              f"no fencing provider ({ways}) said {ctx.rec.node} is off or cut off within "
              f"{format_duration(f.deadline)}: nothing is force-deleted and no spare is "
              "claimed; annotate the Node healer.io/fenced=<who and why> once it is off "
              "(docs/runbooks/HealerNodesHeldForFencing.md)", warning=True)


HELD_FENCE = Effect("hold for fencing", _held_fence)


def _fence_contradicted(ctx: Ctx) -> None:
    """A provider says the machine is off, but its Node is Ready: its kubelet contradicts the
    fence (a stale annotation, a provider mistaken). Nothing is taken out of service; the fence
    step stays open (the next change of the Node polls it again), and the next verdict takes a
    node that answers back to the graceful flow."""
    r = ctx.result
    s = ctx.rec.step(StepName.FENCE)
    assert r is not None
    if s is None:
        return
    said = f"{r.get(StepKey.PROVIDER) or 'a provider'} ({r.get(StepKey.BY) or 'no detail'})"
    ctx.record = ctx.rec.replace_latest(replace(
        s, finished_at=None, outcome=None, detail="",
        error=f"{said} says fenced, but the Node is Ready: not taken out of service"[:250]))
    ctx.event("fence-contradicted", "FenceContradicted",
              f"{ctx.rec.node}: {said} says the machine is off, but its Node is Ready (its "
              "kubelet answers): nothing is taken out of service", warning=True)


FENCE_CONTRADICTED = Effect("keep fencing open: the Node is Ready", _fence_contradicted)


def _alive_again(ctx: Ctx) -> None:
    """The node answers again before it was fenced: back to the graceful flow."""
    v = ctx.trigger.verdict
    assert v is not None
    ctx.close_open("superseded: the node answered again before it was fenced")
    inc = ctx.rec.incident
    rules = tuple(r for r in dict.fromkeys(inc.rules + v.rules) if r != DEAD_RULE)
    ctx.record = replace(ctx.rec, death=None, blocked=None, incident=replace(
        inc, rules=rules or inc.rules, summary=v.summary()))
    ctx.event("alive", "NodeAnswered",
              f"{ctx.rec.node} answers again before it was fenced (verdict {v.state.value}): "
              "back to the graceful flow; nothing was force-deleted")


ALIVE_AGAIN = Effect("close fencing, back to the graceful flow", _alive_again)


def _set_spare_oos(ctx: Ctx) -> None:
    record_spare(ctx)
    ctx.issue(build_action(ctx, StepName.OUT_OF_SERVICE))


SPARE_THEN_OUT_OF_SERVICE = Effect("record spare, issue out-of-service", _set_spare_oos)


def _after_clear(ctx: Ctx) -> None:
    step = (StepName.VALIDATE_REPAIRED if ctx.steps.validation.enabled
            else StepName.RETURN_TO_POOL)
    ctx.issue(build_action(ctx, step))


AFTER_CLEAR = Effect("validate or return to pool", _after_clear)
