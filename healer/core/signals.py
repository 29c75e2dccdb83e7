"""Bounded per-node signal state: what :func:`healer.core.health.evaluate` still needs, no more.

A telemetry source sends every fresh GPU's samples every poll; keeping them all would make
memory and evaluation cost grow with uptime. :class:`NodeSignals` keeps, per node, only what a
rule of the policy set can still look at, pre-indexed by rule (:class:`RuleIndex`):

* **metrics**: per (key, GPU or part) the latest sample and, for every distinct threshold
  test of that key, the first sample of the current run of samples passing it plus the sample
  before that run (``for:`` walks back from the latest sample while the test holds and stops
  there);
* **XIDs**: the occurrences younger than the longest XID window, plus the newest per source (it
  is still fresh data after its window passed), at most :data:`XID_LIMIT`; an occurrence that a
  source reports again (a restart, re-seeding from a record's evidence) is kept once;
* **conditions**: per type the newest observation plus the distinct observations younger than
  the longest N-in-window rule's window, at most :data:`CONDITION_LIMIT` per type; a
  re-publish of an unchanged condition (its detector's heartbeat) only moves the newest
  observation's ``observed_at`` to the heartbeat, which :mod:`healer.core.health` judges
  against the rule's heartbeat window (:func:`default_stale_after`);
* **fresh and stale markers**, and **Slurm's findings** (SLURM signals): the newest of each
  kind per source.

:meth:`NodeSignals.signals` gives the evaluation exactly the verdicts it would give on the full
history (the backtest's unit tests compare the two timelines). Memory per node is therefore a
constant of the policy set: ``series * (1 + 2 * tests)`` metric samples (8 GPUs x the default
policies' 7 keys x at most 2 tests: at most 280 samples), ≤ 64 XIDs, ≤ 16 observations per
condition type, two markers per source.

:meth:`NodeSignals.add` says whether a signal can change the verdict by itself: a sample equal
to the previous one of its series (within ``gap`` seconds of it) cannot, nor can a heartbeat.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from healer.core.gpu_identity import DETAIL_KEY as IDENTITY_DETAIL
from healer.core.gpu_identity import split_message
from healer.core.model import GpuRef, NodeCondition, NodeView, Signal, SignalKind
from healer.core.parts import PartRef
from healer.core.rules import ConditionRule, MetricRule, Op, PolicySet, StalenessRule, XidRule
from healer.core.text import bounded
from healer.core.vocabulary import AGENT_FIELD_MANAGER, GPU_CONDITION

#: At most this many XID occurrences are kept per node (a storm keeps the newest).
XID_LIMIT = 64
#: At most this many observations are kept per condition type and node.
CONDITION_LIMIT = 16
#: Samples older than this are not trusted when a policy has no staleness rule.
DEFAULT_SAMPLE_MAX_AGE = 300.0

#: How often healer's agent re-publishes an unchanged ``GPUHealthy`` condition (its
#: ``--heartbeat`` default; ``healer.agent.publish.DEFAULT_HEARTBEAT``, a test keeps them equal).
AGENT_HEARTBEAT = 30.0
#: How often node-problem-detector re-publishes its conditions
#: (``--k8s-exporter-heartbeat-period``, default 5m).
NPD_HEARTBEAT = 300.0
#: A condition is stale once this many of its detector's heartbeats were missed.
HEARTBEAT_MISSES = 5
#: A condition's reason and message as its signal keeps them (printable, cut).
REASON_CHARS = 256
MESSAGE_CHARS = 200
#: ``detail`` key of a CONDITION signal whose ``observed_at`` is the condition's
#: ``lastHeartbeatTime`` (the detector says it is alive), so its staleness can be judged.
LIVENESS = "liveness"


def default_stale_after(condition_type: str) -> float:
    """The heartbeat window of a condition rule that sets no ``staleAfter``: 5 missed
    heartbeats of the detector that publishes it (healer's agent: 2m30s; NPD and every other
    detector: 25m). ``Ready`` has none: the node lifecycle controller already turns a silent
    kubelet's Ready into Unknown, which the notReady rule matches."""
    if condition_type == "Ready":
        return 0.0
    if condition_type == "GPUHealthy":
        return HEARTBEAT_MISSES * AGENT_HEARTBEAT
    return HEARTBEAT_MISSES * NPD_HEARTBEAT


@dataclass(frozen=True, slots=True)
class RuleIndex:
    """What the policy set's rules need from a node's signals, computed once per policy set."""

    tests: Mapping[str, tuple[tuple[Op, float], ...]]  # metric key → distinct threshold tests
    xid_window: float  # the longest XID rule window
    condition_window: float  # the longest N-in-window condition rule window
    sample_max_age: float  # samples older than this are untrusted by every policy

    @classmethod
    def of(cls, policies: PolicySet) -> RuleIndex:
        tests: dict[str, list[tuple[Op, float]]] = {}
        xid_window = 0.0
        condition_window = 0.0
        max_ages: list[float] = []
        for p in policies.policies:
            stale = [r.after for r in p.rules if isinstance(r, StalenessRule)]
            max_ages.append(min(stale, default=DEFAULT_SAMPLE_MAX_AGE))
            for r in p.rules:
                if isinstance(r, MetricRule):
                    entry = tests.setdefault(r.key, [])
                    if (r.op, r.threshold) not in entry:
                        entry.append((r.op, r.threshold))
                elif isinstance(r, XidRule):
                    xid_window = max(xid_window, r.within)
                elif isinstance(r, ConditionRule):
                    condition_window = max(condition_window, r.within)
        return cls({k: tuple(v) for k, v in tests.items()}, xid_window, condition_window,
                   min(max_ages, default=DEFAULT_SAMPLE_MAX_AGE))


class _Series:
    __slots__ = ("latest", "runs")

    def __init__(self, latest: Signal, runs: list[tuple[Signal | None, Signal] | None]) -> None:
        self.latest = latest
        # per threshold test: (the sample before the run, the run's first sample) while the
        # latest sample passes the test; None while it does not
        self.runs = runs


class NodeSignals:
    """The bounded signal state of one node (see the module docstring)."""

    __slots__ = ("conditions", "fresh_at", "gap", "index", "last_xid", "newest", "series",
                 "xids")

    def __init__(self, index: RuleIndex, gap: float | None = None) -> None:
        self.index = index
        # a same-value sample after a gap longer than this may end an untrusted stretch
        self.gap = index.sample_max_age if gap is None else min(gap, index.sample_max_age)
        self.series: dict[tuple[str, GpuRef | None, PartRef | None], _Series] = {}
        self.xids: list[Signal] = []
        self.last_xid: dict[str, Signal] = {}
        self.newest: dict[tuple[SignalKind, str], Signal] = {}
        self.conditions: dict[str, list[Signal]] = {}
        self.fresh_at = -1.0  # the newest FRESH heartbeat

    def add(self, s: Signal) -> bool:
        """Remember ``s``; False when it cannot change the verdict by itself."""
        match s.kind:
            case SignalKind.METRIC:
                return self._metric(s)
            case SignalKind.XID:
                return self._xid(s)
            case SignalKind.CONDITION:
                return self._condition(s)
            case SignalKind.FRESH:
                self._newest(s)
                self.fresh_at = max(self.fresh_at, s.observed_at)
                return False
            case SignalKind.SLURM:  # the feed sends only changes: the newest says it all
                old = self.newest.get((s.kind, s.source))
                if old is not None and s.observed_at < old.observed_at:
                    return False
                self.newest[(s.kind, s.source)] = s
                return old is None or (old.value, old.detail) != (s.value, s.detail)
            case _:  # STALE
                self._newest(s)
                return True

    def extend(self, signals: Iterable[Signal]) -> bool:
        changed = False
        for s in signals:
            changed = self.add(s) or changed
        return changed

    def _newest(self, s: Signal) -> None:
        k = (s.kind, s.source)
        old = self.newest.get(k)
        if old is None or s.observed_at >= old.observed_at:
            self.newest[k] = s

    def _metric(self, s: Signal) -> bool:
        key = (s.key, s.gpu, s.part)
        ser = self.series.get(key)
        tests = self.index.tests.get(s.key, ())
        if ser is None:
            self.series[key] = _Series(s, [(None, s) if op.test(s.value, thr) else None
                                           for op, thr in tests])
            return True
        prev = ser.latest
        if s.observed_at < prev.observed_at:
            return False  # out of order: the latest sample already says more
        if s.value == prev.value and s.observed_at - prev.observed_at <= self.gap:
            ser.latest = s  # the same value again: every threshold test is unchanged
            return False
        runs = ser.runs
        if len(runs) != len(tests):  # the policy set changed: restart the runs here
            runs[:] = [None] * len(tests)
        for i, (op, thr) in enumerate(tests):
            if not op.test(s.value, thr):
                runs[i] = None
            elif runs[i] is None:
                runs[i] = (prev, s)
        ser.latest = s
        return True

    def _xid(self, s: Signal) -> bool:
        if s in self.xids or self.last_xid.get(s.source) == s:
            return False  # the same occurrence re-reported
        self.xids.append(s)
        if len(self.xids) > XID_LIMIT:
            self.xids.sort(key=lambda x: x.observed_at)
            del self.xids[:-XID_LIMIT]
        old = self.last_xid.get(s.source)
        if old is None or s.observed_at >= old.observed_at:
            self.last_xid[s.source] = s
        return True

    def _condition(self, s: Signal) -> bool:
        obs = self.conditions.setdefault(s.key, [])
        if obs and obs[-1].value == s.value and obs[-1].detail == s.detail:
            if s.observed_at >= obs[-1].observed_at:
                obs[-1] = s  # the same observation again (a relist, a heartbeat): newer
            return False
        obs.append(s)
        if len(obs) > CONDITION_LIMIT:
            del obs[:-CONDITION_LIMIT]
        return True

    def prune(self, now: float) -> None:
        """Drop what no rule can look at any more (called before each evaluation)."""
        if self.xids:
            window = self.index.xid_window
            self.xids = [x for x in self.xids if now - x.observed_at < window]
        window = self.index.condition_window
        for key, obs in self.conditions.items():
            if len(obs) > 1:
                self.conditions[key] = [*(o for o in obs[:-1] if now - o.value < window),
                                        obs[-1]]

    def signals(self, now: float) -> list[Signal]:
        """The signals to evaluate at ``now`` (pruned first)."""
        self.prune(now)
        out: list[Signal] = list(self.xids)
        present = {id(x) for x in self.xids}
        out.extend(x for x in self.last_xid.values() if id(x) not in present)
        out.extend(self.newest.values())
        for ser in self.series.values():
            kept = {id(ser.latest): ser.latest}
            for run in ser.runs:
                if run is not None:
                    before, first = run
                    kept[id(first)] = first
                    if before is not None:
                        kept[id(before)] = before
            out.extend(kept.values())
        for obs in self.conditions.values():
            out.extend(obs)
        return out

    def size(self) -> int:
        """How many signals are held (for metrics and the memory bound's tests)."""
        held = len(self.xids) + len(self.last_xid) + len(self.newest)
        held += sum(1 + 2 * sum(r is not None for r in s.runs) for s in self.series.values())
        return held + sum(len(o) for o in self.conditions.values())


def condition_signals(n: NodeView, now: float) -> list[Signal]:
    """The node's conditions as CONDITION signals (``value``: the last transition). A
    condition its detector vouches for (``lastHeartbeatTime``) is observed at its heartbeat
    (never later than ``now``: a detector clock ahead of ours must not hide it) and marked
    :data:`LIVENESS`, so its staleness is judged; one without a heartbeat is observed ``now``
    and never goes stale. Status, reason and message are kept printable and cut
    (:mod:`healer.core.text`); the GPU identity block is read only from
    :func:`identity_condition`."""
    agent = identity_condition(n)
    out = []
    for c in n.conditions:
        extra = {LIVENESS: "heartbeat"} if c.last_heartbeat > 0 else {}
        message, gpus = split_message(c.message)  # healer's agent names its GPUs
        if gpus and c is agent:
            extra[IDENTITY_DETAIL] = gpus
        out.append(Signal(n.name, "k8s", SignalKind.CONDITION, c.type, c.last_transition or now,
                          min(c.last_heartbeat, now) if c.last_heartbeat > 0 else now, None,
                          Signal.details(status=bounded(c.status, 16),
                                         reason=bounded(c.reason, REASON_CHARS),
                                         message=bounded(message, MESSAGE_CHARS), **extra)))
    return out


def identity_condition(n: NodeView) -> NodeCondition | None:
    """The one condition whose GPU identity block is read: healer's agent's ``GPUHealthy``,
    its message written by the agent's field manager. None when there is no such condition,
    when someone else wrote its message, or when the node has two ``GPUHealthy`` conditions
    (conflicting: no identity at all rather than the wrong one)."""
    found = [c for c in n.conditions if c.type == GPU_CONDITION]
    if len(found) != 1 or found[0].writer != AGENT_FIELD_MANAGER:
        return None
    return found[0]


def only_heartbeats(prev: NodeView | None, n: NodeView) -> bool:
    """Did only heartbeats change between ``prev`` and ``n``'s conditions?"""
    return prev is not None and len(prev.conditions) == len(n.conditions) and all(
        a.same_content(b) for a, b in zip(prev.conditions, n.conditions, strict=True))
