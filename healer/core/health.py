"""Health evaluation: a node's recent signals + its policy + ``now`` → a :class:`Verdict`.

Pure and deterministic. Semantics, rule by rule:

* **XID** rules count occurrences of the rule's codes within ``within`` seconds; ``count`` or more
  confirm the rule, fewer make the node *suspect* until the oldest one leaves the window.
* **Metric** rules test the latest sample of each GPU (or of the node) against the threshold and
  confirm once the test has held continuously for ``for`` seconds, like a Prometheus ``for:``.
  Samples older than the staleness limit are not trusted: the rule is *unknown* for that GPU.
* **Condition** rules test the latest observation of a node condition (``value`` = the
  condition's last-transition time); with ``count``/``within`` they count distinct transitions
  into the bad status within the window. A condition whose detector vouches for it
  (``lastHeartbeatTime``, the observation's ``observed_at``) and whose last heartbeat is older
  than the rule's ``stale_after`` is *stale*, whatever its status: the rule's match is
  ``STALE`` (unknown, never disruptive), like telemetry that stopped; until then
  ``recheck_after`` is when the window would pass, so the runtime's timer re-evaluates the
  node then instead of polling it.
* **Slurm** rules match the node's latest SLURM signal (:mod:`healer.core.slurm_signals`): one
  of the rule's states, a reason its pattern finds, held ``for`` since that state (and reason)
  began.
* **Staleness** rules: a source whose newest fresh data is older than ``after`` (or that sent an
  explicit *stale* marker since, or never sent anything) makes the verdict ``STALE`` unless a
  confirmed rule decides otherwise. ``STALE`` is *unknown*: never healthy, never failed, and the
  state machine never takes a disruptive step on it.
* **Dead** (the policy's ``deadNode``, :func:`dead_match`): the node cannot act on its own when
  the witnesses the policy names agree (all of them, or any): its Ready condition is Unknown
  or False for ``after`` (``notReady``: the node lifecycle controller turns an expired kubelet
  Lease into Ready=Unknown), Slurm flags it NOT_RESPONDING (``slurmNotResponding``), every
  telemetry source for it is stale (``telemetryStale``). Some but not all of them (or NotReady
  for less than ``after``) make it *suspect*. ``DEAD`` is distinct from failed: the state
  machine fences it instead of draining it.

The verdict state is the worst of: dead > failed > degrading > stale > suspect > healthy.
``recheck_after`` is the soonest time the verdict could change without new signals.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from healer.core.model import EVIDENCE_LIMIT, GpuRef, HealthState, Severity, Signal, SignalKind
from healer.core.parts import PartRef
from healer.core.rules import (
    DEAD_RULE,
    ConditionRule,
    DeadMatch,
    DeadNode,
    DeadSignal,
    MetricRule,
    Op,
    Policy,
    Rule,
    SlurmRule,
    StalenessRule,
    XidRule,
)
from healer.core.signals import DEFAULT_SAMPLE_MAX_AGE, LIVENESS
from healer.core.slurm_signals import KEY as SLURM_KEY
from healer.core.slurm_signals import finding_of
from healer.core.timefmt import format_duration, rfc3339


@dataclass(frozen=True, slots=True)
class RuleMatch:
    """One rule that matches (or half-matches) now."""

    rule: str
    state: HealthState  # SUSPECT, DEGRADING, FAILED or STALE
    severity: Severity | None
    since: float
    gpus: tuple[GpuRef, ...] = ()
    detail: str = ""
    evidence: tuple[Signal, ...] = ()  # the signals that make the rule match
    source: str = ""  # STALE matches: what is stale (``condition/<type>`` for a condition)


@dataclass(frozen=True, slots=True)
class Verdict:
    node: str
    state: HealthState
    at: float
    severity: Severity | None = None
    matches: tuple[RuleMatch, ...] = ()
    recheck_after: float | None = None  # seconds from ``at``
    policy: str = ""  # the policy whose rules produced this verdict

    @property
    def rules(self) -> tuple[str, ...]:
        return tuple(m.rule for m in self.matches if m.state.is_confirmed)

    @property
    def gpus(self) -> tuple[GpuRef, ...]:
        seen: dict[GpuRef, None] = {}
        for m in self.matches:
            if m.state.is_confirmed:
                for g in m.gpus:
                    seen.setdefault(g, None)
        return tuple(sorted(seen))

    def summary(self) -> str:
        parts = [m.detail or m.rule for m in self.matches if m.state is self.state]
        return "; ".join(parts) if parts else self.state.value

    @property
    def evidence(self) -> tuple[Signal, ...]:
        out: list[Signal] = []
        for m in self.matches:
            if m.state.is_confirmed:
                out.extend(m.evidence)
        return tuple(out[-EVIDENCE_LIMIT:])


def evaluate(node: str, signals: Sequence[Signal], policy: Policy, now: float) -> Verdict:
    """Evaluate ``policy`` on ``node``'s recent ``signals`` at time ``now``."""
    by_kind: dict[SignalKind, list[Signal]] = defaultdict(list)
    for s in signals:
        if s.node == node and s.observed_at <= now:
            by_kind[s.kind].append(s)
    for lst in by_kind.values():
        lst.sort(key=lambda s: s.observed_at)

    staleness = [r for r in policy.rules if isinstance(r, StalenessRule)]
    max_age = min((r.after for r in staleness), default=DEFAULT_SAMPLE_MAX_AGE)

    matches: list[RuleMatch] = []
    rechecks: list[float] = []
    for rule in policy.rules:
        m, recheck = _evaluate_rule(rule, by_kind, now, max_age)
        if m is not None:
            matches.append(m)
        if recheck is not None and recheck > 0:
            rechecks.append(recheck)

    if policy.dead.enabled:
        m, recheck = dead_match(policy.dead, by_kind, now, max_age)
        if m is not None:
            matches.append(m)
        if recheck is not None and recheck > 0:
            rechecks.append(recheck)

    confirmed = [m for m in matches if m.state.is_confirmed]
    if any(m.state is HealthState.DEAD for m in matches):
        state, severity = HealthState.DEAD, Severity.FAILED
    elif confirmed:
        severity = max(m.severity for m in confirmed if m.severity is not None)
        state = HealthState.FAILED if severity is Severity.FAILED else HealthState.DEGRADING
    elif any(m.state is HealthState.STALE for m in matches):
        state, severity = HealthState.STALE, None
    elif any(m.state is HealthState.SUSPECT for m in matches):
        state, severity = HealthState.SUSPECT, None
    else:
        state, severity = HealthState.HEALTHY, None
    return Verdict(
        node=node,
        state=state,
        at=now,
        severity=severity,
        matches=tuple(matches),
        recheck_after=min(rechecks) if rechecks else None,
        policy=policy.name,
    )


_RANK = {HealthState.HEALTHY: 0, HealthState.SUSPECT: 1, HealthState.STALE: 2,
         HealthState.DEGRADING: 3, HealthState.FAILED: 4, HealthState.DEAD: 5}


def evaluate_node(node: str, signals: Sequence[Signal], policies: Sequence[Policy],
                  now: float) -> Verdict:
    """Evaluate every policy that selects the node; the worst verdict wins.

    ``policies`` must be ordered by precedence (:meth:`PolicySet.policies_for`): among equally
    bad verdicts the earlier policy wins. ``recheck_after`` is the soonest of all of them.
    """
    if not policies:
        return Verdict(node=node, state=HealthState.HEALTHY, at=now)
    verdicts = [evaluate(node, signals, p, now) for p in policies]
    best = verdicts[0]
    for v in verdicts[1:]:
        if _RANK[v.state] > _RANK[best.state]:
            best = v
    rechecks = [v.recheck_after for v in verdicts if v.recheck_after is not None]
    return replace(best, recheck_after=min(rechecks) if rechecks else None)


def _evaluate_rule(
    rule: Rule, by_kind: dict[SignalKind, list[Signal]], now: float, max_age: float
) -> tuple[RuleMatch | None, float | None]:
    match rule:
        case XidRule():
            return _xid(rule, by_kind.get(SignalKind.XID, []), now)
        case MetricRule():
            return _metric(rule, by_kind.get(SignalKind.METRIC, []), now, max_age)
        case ConditionRule():
            return _condition(rule, by_kind.get(SignalKind.CONDITION, []), now)
        case StalenessRule():
            return _staleness(rule, by_kind, now)
        case SlurmRule():
            return _slurm(rule, by_kind.get(SignalKind.SLURM, []), now)
    raise AssertionError(rule)  # pragma: no cover


def _xid(
    rule: XidRule, events: Iterable[Signal], now: float
) -> tuple[RuleMatch | None, float | None]:
    hits = [e for e in events if int(e.value) in rule.codes and now - e.observed_at < rule.within]
    if not hits:
        return None, None
    codes = sorted({int(e.value) for e in hits})
    gpus = tuple(sorted({e.gpu for e in hits if e.gpu is not None}))
    expires = hits[0].observed_at + rule.within - now  # when the oldest counted event ages out
    detail = (f"XID {','.join(map(str, codes))} x{len(hits)} within "
              f"{format_duration(rule.within)}")
    on = ", ".join(g.describe() for g in gpus)
    if on:
        detail += f" on {on}"
    first = hits[0].observed_at
    if len(hits) >= rule.count:
        return RuleMatch(rule.name, _state_of(rule.severity), rule.severity, first, gpus,
                         detail, tuple(hits)), expires
    return (RuleMatch(rule.name, HealthState.SUSPECT, rule.severity, first, gpus,
                      f"{detail} (needs {rule.count})"), expires)


#: What a metric rule is judged per: a GPU, a part of the node (an HCA port), or the node.
Entity = tuple[GpuRef | None, PartRef | None]


def _metric(
    rule: MetricRule, samples: Iterable[Signal], now: float, max_age: float
) -> tuple[RuleMatch | None, float | None]:
    per_entity: dict[Entity, list[Signal]] = defaultdict(list)
    key = rule.key
    for s in samples:
        if s.key == key:
            per_entity[(s.gpu, s.part)].append(s)
    confirmed: list[tuple[Entity, float, float]] = []
    pending: list[tuple[Entity, float, float]] = []
    evidence: list[Signal] = []
    rechecks: list[float] = []
    for entity, series in per_entity.items():
        latest = series[-1]
        age = now - latest.observed_at
        if age > max_age:
            continue  # untrusted: the staleness rule reports it
        rechecks.append(max_age - age)
        if not rule.op.test(latest.value, rule.threshold):
            continue
        since = latest.observed_at
        for s in reversed(series):
            if not rule.op.test(s.value, rule.threshold):
                break
            since = s.observed_at
        held = now - since
        if held >= rule.hold_for:
            confirmed.append((entity, since, latest.value))
            evidence.append(latest)
        else:
            pending.append((entity, since, latest.value))
            rechecks.append(rule.hold_for - held)
    recheck = min(rechecks) if rechecks else None
    chosen = confirmed or pending
    if not chosen:
        return None, recheck
    gpus = tuple(sorted({g for (g, _), _, _ in chosen if g is not None}))
    parts = sorted({p for (_, p), _, _ in chosen if p is not None})
    since = min(t for _, t, _ in chosen)
    values = [v for _, _, v in chosen]
    worst = min(values) if rule.op in (Op.LT, Op.LE) else max(values)
    what = rule.field if not rule.promql else rule.name
    agg = "" if rule.aggregation.value == "value" else f"{rule.aggregation.value} "
    detail = f"{agg}{what} {rule.op.value} {rule.threshold:g} (value {worst:g})"
    if rule.hold_for:
        detail += f" for {format_duration(rule.hold_for)}"
    if gpus or parts:
        detail += " on " + ", ".join([*(g.describe() for g in gpus),
                                      *(p.describe() for p in parts)])
    if confirmed:
        state = _state_of(rule.severity)
        return RuleMatch(rule.name, state, rule.severity, since, gpus, detail,
                         tuple(evidence)), recheck
    return RuleMatch(rule.name, HealthState.SUSPECT, rule.severity, since, gpus, detail), recheck


def _condition(
    rule: ConditionRule, observations: Iterable[Signal], now: float
) -> tuple[RuleMatch | None, float | None]:
    obs = [o for o in observations if o.key == rule.type]
    if not obs:
        return None, None
    latest = obs[-1]
    if rule.count == 0 and rule.stale_after > 0 and latest.get(LIVENESS):
        age = now - latest.observed_at  # observed_at: the condition's lastHeartbeatTime
        if age >= rule.stale_after:
            return (RuleMatch(rule.name, HealthState.STALE, None, latest.observed_at, (),
                              f"condition {rule.type} stale: last heartbeat "
                              f"{format_duration(age)} ago (window "
                              f"{format_duration(rule.stale_after)}; its detector may be down)",
                              source=f"condition/{rule.type}"), None)
        # a timer, not a poll: look again when the window would pass without a heartbeat
        stale_in: float | None = rule.stale_after - age
    else:
        stale_in = None
    m, recheck = _condition_state(rule, obs, latest, now)
    if stale_in is not None:
        recheck = stale_in if recheck is None else min(recheck, stale_in)
    return m, recheck


def _condition_state(
    rule: ConditionRule, obs: list[Signal], latest: Signal, now: float
) -> tuple[RuleMatch | None, float | None]:
    def bad(o: Signal) -> bool:
        if o.get("status") not in rule.statuses:
            return False
        return rule.reason is None or rule.reason.search(o.get("reason")) is not None

    if rule.count > 0:
        transitions = sorted({o.value for o in obs if bad(o) and now - o.value < rule.within})
        if not transitions:
            return None, None
        expires = transitions[0] + rule.within - now
        detail = (f"condition {rule.type} went {'/'.join(sorted(rule.statuses))} "
                  f"x{len(transitions)} within {format_duration(rule.within)}")
        if len(transitions) >= rule.count:
            state = _state_of(rule.severity)
            return RuleMatch(rule.name, state, rule.severity, transitions[0], (), detail,
                             (latest,)), expires
        return (RuleMatch(rule.name, HealthState.SUSPECT, rule.severity, transitions[0], (),
                          f"{detail} (needs {rule.count})"), expires)
    if not bad(latest):
        return None, None
    since = latest.value
    held = now - since
    reason = latest.get("reason")
    detail = f"condition {rule.type}={latest.get('status')}"
    if reason:
        detail += f" ({reason})"
    message = latest.get("message")
    if message:
        detail += f": {message}"
    if held >= rule.hold_for:
        state = _state_of(rule.severity)
        return RuleMatch(rule.name, state, rule.severity, since, (), detail, (latest,)), None
    return (RuleMatch(rule.name, HealthState.SUSPECT, rule.severity, since, (), detail),
            rule.hold_for - held)


def _slurm(
    rule: SlurmRule, observations: Sequence[Signal], now: float
) -> tuple[RuleMatch | None, float | None]:
    """The node's latest SLURM signal against ``rule``: one of its states, a reason the
    pattern finds, held ``for`` since the state (and, with a pattern, the reason) began."""
    latest = next((o for o in reversed(observations) if o.key == SLURM_KEY), None)
    found = finding_of(latest) if latest is not None else None
    if latest is None or found is None:
        return None, None
    held_since = [t for s, t in found.states if s in rule.states]
    if not held_since or (rule.reason is not None
                          and rule.reason.search(found.reason) is None):
        return None, None
    since = min(held_since)
    if rule.reason is not None:
        since = max(since, found.reason_since)
    detail = found.describe()
    if rule.hold_for:
        detail += f" for {format_duration(rule.hold_for)}"
    held = now - since
    if held >= rule.hold_for:
        return RuleMatch(rule.name, _state_of(rule.severity), rule.severity, since, (), detail,
                         (latest,)), None
    return (RuleMatch(rule.name, HealthState.SUSPECT, rule.severity, since, (), detail),
            rule.hold_for - held)


def _staleness(
    rule: StalenessRule, by_kind: dict[SignalKind, list[Signal]], now: float
) -> tuple[RuleMatch | None, float | None]:
    fresh: dict[str, float] = {}
    stale_marks: dict[str, float] = {}
    for kind in (SignalKind.METRIC, SignalKind.XID, SignalKind.FRESH):
        for s in by_kind.get(kind, []):
            fresh[s.source] = max(fresh.get(s.source, 0.0), s.observed_at)
    for s in by_kind.get(SignalKind.STALE, []):
        stale_marks[s.source] = max(stale_marks.get(s.source, 0.0), s.observed_at)
    sources = set(rule.sources) if rule.sources else set(fresh) | set(stale_marks)
    if not sources:
        return (RuleMatch(rule.name, HealthState.STALE, None, now, (),
                          "no telemetry received for this node"), None)
    stale: list[str] = []
    rechecks: list[float] = []
    for src in sorted(sources):
        last = fresh.get(src)
        if last is None:
            stale.append(f"{src}: no data")
        elif stale_marks.get(src, -1.0) >= last:
            stale.append(f"{src}: reported stale")
        elif now - last >= rule.after:
            stale.append(f"{src}: last sample {format_duration(now - last)} ago")
        else:
            rechecks.append(last + rule.after - now)
    recheck = min(rechecks) if rechecks else None
    if not stale:
        return None, recheck
    since = min((fresh.get(s, now) for s in sources), default=now)
    return (RuleMatch(rule.name, HealthState.STALE, None, since, (),
                      "telemetry stale (" + "; ".join(stale) + ")"), recheck)



#: The Ready condition's statuses that make a node NotReady.
NOT_READY = frozenset({"False", "Unknown"})


def dead_match(cfg: DeadNode, by_kind: dict[SignalKind, list[Signal]], now: float,
               max_age: float) -> tuple[RuleMatch | None, float | None]:
    """Is the node dead (see the module docstring)? A DEAD match when the witnesses agree, a
    SUSPECT one while some do (or NotReady is younger than ``after``), else None; and when to
    look again without new signals (NotReady reaching ``after``)."""
    held: dict[DeadSignal, tuple[float, str, Signal | None]] = {}
    recheck: float | None = None
    seen_not_ready = False
    ready = [o for o in by_kind.get(SignalKind.CONDITION, []) if o.key == "Ready"]
    if ready and ready[-1].get("status") in NOT_READY:
        latest, seen_not_ready = ready[-1], True
        since = latest.value
        words = (f"Ready={latest.get('status')} since {rfc3339(since)} "
                 f"({format_duration(max(now - since, 0.0))})")
        if now - since >= cfg.after:
            held[DeadSignal.NOT_READY] = (since, words, latest)
        else:
            recheck = cfg.after - (now - since)
    slurm = next((o for o in reversed(by_kind.get(SignalKind.SLURM, []))
                  if o.key == SLURM_KEY), None)
    found = finding_of(slurm) if slurm is not None else None
    if found is not None and "NOT_RESPONDING" in found.names:
        since = dict(found.states)["NOT_RESPONDING"]
        held[DeadSignal.SLURM_NOT_RESPONDING] = (
            since, f"{found.describe()} since {rfc3339(since)}", slurm)
    stale = _all_stale(by_kind, now, max_age)
    if stale is not None:
        held[DeadSignal.TELEMETRY_STALE] = (stale[0], stale[1], None)
    wanted = [s for s in DeadSignal if s in cfg.signals]
    agree = [s for s in wanted if s in held]
    if not agree and not (seen_not_ready and DeadSignal.NOT_READY in cfg.signals):
        return None, recheck
    dead = bool(agree) and (len(agree) == len(wanted) if cfg.match is DeadMatch.ALL else True)
    since = min((held[s][0] for s in agree), default=now)
    words = "; ".join(held[s][1] for s in agree)
    evidence = tuple(sig for s in agree if (sig := held[s][2]) is not None)
    if dead:
        return RuleMatch(DEAD_RULE, HealthState.DEAD, Severity.FAILED, since, (),
                         f"node dead: {words}", evidence), recheck
    missing = ", ".join(s.value for s in wanted if s not in held)
    detail = f"may be dead: {words or 'Ready not True'} (not yet: {missing})"
    return RuleMatch(DEAD_RULE, HealthState.SUSPECT, Severity.FAILED, since, (), detail), recheck


def _all_stale(by_kind: dict[SignalKind, list[Signal]], now: float,
               max_age: float) -> tuple[float, str] | None:
    """Since when every telemetry source of the node is stale, in words (None: one is fresh,
    or none ever reported)."""
    fresh: dict[str, float] = {}
    marks: dict[str, float] = {}
    for kind in (SignalKind.METRIC, SignalKind.XID, SignalKind.FRESH):
        for s in by_kind.get(kind, []):
            fresh[s.source] = max(fresh.get(s.source, 0.0), s.observed_at)
    for s in by_kind.get(SignalKind.STALE, []):
        marks[s.source] = max(marks.get(s.source, 0.0), s.observed_at)
    sources = set(fresh) | set(marks)
    if not sources:
        return None
    since: list[float] = []
    for src in sources:
        last = fresh.get(src)
        if last is not None and marks.get(src, -1.0) < last and now - last < max_age:
            return None
        since.append(marks[src] if last is None or marks.get(src, -1.0) >= last
                     else last + max_age)
    at = max(since)
    return at, (f"every telemetry source stale ({', '.join(sorted(sources))}) since "
                f"{rfc3339(at)}")


def _state_of(severity: Severity) -> HealthState:
    return HealthState.FAILED if severity is Severity.FAILED else HealthState.DEGRADING



def stale_conditions(v: Verdict) -> tuple[str, ...]:
    """The node conditions ``v`` found stale (``condition/<type>``), sorted."""
    return tuple(sorted({m.source for m in v.matches if m.state is HealthState.STALE
                         and m.source.startswith("condition/")}))
