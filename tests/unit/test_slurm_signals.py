"""Slurm as a detector (issue 14 item 1), table-driven: a Slurm node state → a finding → a
SLURM signal; a ``slurm:`` rule on it (states, reason, ``for:``); healer's own drains never a
finding; hostile reason text bounded and total; the policy file's ``slurm:`` rule loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healer.core import rules as cp
from healer.core.health import evaluate
from healer.core.model import HealthState, Severity, Signal, SignalKind
from healer.core.signals import NodeSignals, RuleIndex
from healer.core.slurm_signals import (
    KEY,
    OUT_FLAGS,
    REASON_LIMIT,
    SOURCE,
    SlurmFinding,
    bounded,
    finding_of,
    finding_signal,
    next_finding,
    out_states,
)
from healer.policy.checks import compile_regex
from healer.policy.load import load_policy_set
from tests.builders import T0, policies, policy

H = HealthState


@pytest.mark.parametrize(("base", "flags", "reason", "states"), [
    ("IDLE", (), "", ()),
    ("DOWN", (), "Not responding", ("DOWN",)),
    ("DOWN", ("NOT_RESPONDING",), "Not responding", ("DOWN", "NOT_RESPONDING")),
    ("IDLE", ("NOT_RESPONDING",), "", ("NOT_RESPONDING",)),
    ("IDLE", ("FAIL",), "admin: bad dimm", ("FAIL",)),
    ("ALLOCATED", ("FAILING",), "x", ("FAIL",)),
    ("IDLE", ("DRAIN",), "NHC: GPU 3 ECC DBE", ("DRAIN",)),
    ("MIXED", ("DRAIN",), "maint", ("DRAIN",)),  # draining counts as well
    ("IDLE", ("DRAIN", "UNDRAIN"), "NHC: x", ()),
    ("IDLE", ("DRAIN",), "healer: XID 79 [n1-20260105-080000]", ()),  # healer's own drain
    ("IDLE", ("DRAIN",), "slurm-operator: Node (n1) was cordoned", ()),  # a cordon mirrored
    ("DOWN", (), "slurm-operator: Pod is terminating", ()),  # the operator's preStop
    ("DOWN", ("DRAIN",), "healer: XID 79 [i]", ("DOWN",)),  # Slurm's DOWN stays Slurm's
    ("IDLE", ("NOT_RESPONDING", "DRAIN"), "slurm-operator: x", ("NOT_RESPONDING",)),
    ("idle", ("drain",), "lower case", ("DRAIN",)),
    ("IDLE", ("MAINTENANCE", "REBOOT_ISSUED", "POWERED_DOWN"), "", ()),
])
def test_states_that_count(base: str, flags: tuple[str, ...], reason: str,
                           states: tuple[str, ...]) -> None:
    assert out_states(base, frozenset(flags), reason) == frozenset(states)


_FLAGS = ("DRAIN", "UNDRAIN", "NOT_RESPONDING", "FAIL", "FAILING", "COMPLETING", "MAINTENANCE",
          "REBOOT_ISSUED", "POWERED_DOWN", "CLOUD")


@given(st.sampled_from(("IDLE", "DOWN", "ALLOCATED", "MIXED", "UNKNOWN", "FUTURE", "ERROR")),
       st.sets(st.sampled_from(_FLAGS)),
       st.sampled_from(("", "NHC: x", "healer: y [i]", "slurm-operator: z", "Not responding")))
def test_the_feeds_shortcut_never_skips_a_finding(base: str, flags: set[str],
                                                  reason: str) -> None:
    """The Slurm feed skips a node without DOWN or one of OUT_FLAGS without asking further."""
    if out_states(base, frozenset(flags), reason):
        assert base == "DOWN" or not OUT_FLAGS.isdisjoint(flags)


def test_a_finding_keeps_when_each_state_and_the_reason_began() -> None:
    f1 = next_finding(None, base="IDLE", flags={"DRAIN"}, reason="NHC: GPU 3", user="root",
                      reason_time="2026-01-05T08:00:00", now=T0)
    assert f1 == SlurmFinding((("DRAIN", T0),), "NHC: GPU 3", T0, "root", "2026-01-05T08:00:00")
    f2 = next_finding(f1, base="DOWN", flags={"DRAIN"}, reason="NHC: GPU 3", user="root",
                      reason_time="2026-01-05T08:00:00", now=T0 + 60)
    assert f2 is not None
    assert f2.states == (("DOWN", T0 + 60), ("DRAIN", T0))
    assert f2.reason_since == T0  # the same reason
    f3 = next_finding(f2, base="DOWN", flags={"DRAIN"}, reason="NHC: GPU 4", now=T0 + 90)
    assert f3 is not None
    assert f3.reason_since == T0 + 90
    assert next_finding(f3, base="IDLE", flags=set(), now=T0 + 99) is None


def test_healers_drain_over_slurms_down_keeps_the_owners_reason() -> None:
    down = next_finding(None, base="DOWN", flags={"NOT_RESPONDING"}, reason="Not responding",
                        user="slurm", reason_time="t0", now=T0)
    assert down is not None
    after = next_finding(down, base="DOWN", flags={"NOT_RESPONDING", "DRAIN"},
                         reason="healer: slurm DOWN [n1-x]", user="root", now=T0 + 30)
    assert after == down  # nothing new: no signal, no second incident, no recovery
    # without a finding before, healer's words are never shown as someone's reason
    fresh = next_finding(None, base="DOWN", flags={"DRAIN"}, reason="healer: x [i]", now=T0)
    assert fresh is not None
    assert fresh.reason == ""


def test_signal_round_trip_and_clear() -> None:
    f = SlurmFinding((("DOWN", T0 + 5), ("DRAIN", T0)), "NHC: a=b, c", T0, "root", "then")
    s = finding_signal("n1", f, T0 + 10)
    assert (s.kind, s.source, s.key, s.value, s.observed_at) == (
        SignalKind.SLURM, SOURCE, KEY, T0, T0 + 10)
    assert finding_of(s) == f
    assert finding_of(Signal.from_dict("n1", s.to_dict())) == f  # as the record keeps it
    assert s.to_dict()["detail"]["reason"] == "NHC: a=b, c"
    cleared = finding_signal("n1", None, T0 + 20)
    assert finding_of(cleared) is None
    forged = Signal("n1", SOURCE, SignalKind.SLURM, KEY, 0, T0, None,
                    Signal.details(states="DRAIN,BOGUS", **{"since.DRAIN": "nan"}))
    assert finding_of(forged) is None


@pytest.mark.parametrize(("text", "expect"), [
    ("NHC: GPU 3 ECC", "NHC: GPU 3 ECC"),
    ("  padded\t", "padded"),
    ("bell\x07 nul\x00 esc\x1b[31m red", "bell\ufffd nul\ufffd esc\ufffd[31m red"),
    ("line1\nline2\r\n", "line1\ufffdline2"),
    ("bidi \u202e gnp.exe", "bidi \ufffd gnp.exe"),
    ("sep\u2028arator\u00a0nbsp", "sep\ufffdarator\ufffdnbsp"),
    ("ünïcödé ✓ 日本語", "ünïcödé ✓ 日本語"),
    ("x" * 300, "x" * (REASON_LIMIT - 1) + "…"),
    ("y" * 10**6, "y" * (REASON_LIMIT - 1) + "…"),
])
def test_reason_text_is_bounded_and_printable(text: str, expect: str) -> None:
    assert bounded(text) == expect


@given(st.text(max_size=3000), st.text(max_size=200), st.text(max_size=200))
def test_any_reason_gives_a_bounded_finding(reason: str, user: str, when: str) -> None:
    f = next_finding(None, base="IDLE", flags={"DRAIN"}, reason=reason, user=user,
                     reason_time=when, now=T0)
    if f is None:  # healer's or the operator's own drain
        assert reason.startswith(("healer: ", "slurm-operator: "))
        return
    assert len(f.reason) <= REASON_LIMIT
    assert len(f.user) <= 64
    assert len(f.reason_time) <= 64
    assert (f.reason + f.user + f.reason_time).isprintable()
    assert finding_of(finding_signal("n1", f, T0)) == f
    assert len(f.describe()) < 600


def rule(*states: str, reason: str | None = None, hold: float = 0.0,
         severity: Severity = Severity.FAILED) -> cp.SlurmRule:
    return cp.SlurmRule("slurm", severity, frozenset(states),
                        compile_regex(reason) if reason is not None else None, hold)


def drained(reason: str, since: float, *, down_since: float | None = None,
            reason_since: float | None = None) -> Signal:
    states = (("DOWN", down_since),) if down_since is not None else ()
    f = SlurmFinding((*states, ("DRAIN", since)), reason,
                     since if reason_since is None else reason_since, "root", "2026-01-05")
    return finding_signal("n1", f, since)


@pytest.mark.parametrize(("r", "signals", "now", "state", "recheck"), [
    (rule("DRAIN"), [drained("NHC: GPU 3", T0)], T0, H.FAILED, None),
    (rule("DRAIN", severity=Severity.DEGRADING), [drained("x", T0)], T0, H.DEGRADING, None),
    (rule("DOWN"), [drained("NHC: GPU 3", T0)], T0, H.HEALTHY, None),
    (rule("DOWN", "DRAIN"), [drained("x", T0)], T0, H.FAILED, None),
    (rule("DRAIN", reason="^NHC:"), [drained("NHC: GPU 3", T0)], T0, H.FAILED, None),
    (rule("DRAIN", reason="^NHC:"), [drained("maint: bios", T0)], T0, H.HEALTHY, None),
    (rule("DRAIN", hold=300), [drained("x", T0)], T0 + 100, H.SUSPECT, 200),
    (rule("DRAIN", hold=300), [drained("x", T0)], T0 + 300, H.FAILED, None),
    # for: follows the state asked for, not the episode
    (rule("DOWN", hold=300), [drained("x", T0, down_since=T0 + 200)], T0 + 300, H.SUSPECT,
     200),
    # with a reason pattern, for: counts from when that reason was set
    (rule("DRAIN", reason="NHC", hold=300), [drained("NHC b", T0, reason_since=T0 + 250)],
     T0 + 300, H.SUSPECT, 250),
    # the newest signal decides: cleared is cleared
    (rule("DRAIN"), [drained("x", T0), finding_signal("n1", None, T0 + 5)], T0 + 6, H.HEALTHY,
     None),
    (rule("DRAIN"), [], T0, H.HEALTHY, None),
])
def test_slurm_rule(r: cp.SlurmRule, signals: list[Signal], now: float, state: HealthState,
                    recheck: float | None) -> None:
    v = evaluate("n1", signals, policy(rules=(r,)), now)
    assert v.state is state
    assert v.recheck_after == recheck
    if state.is_confirmed:
        assert v.evidence == (signals[-1],)
        assert 'Slurm DRAIN: "' in v.summary() or "Slurm DOWN" in v.summary()


def test_the_summary_carries_the_owners_reason_user_and_time() -> None:
    v = evaluate("n1", [drained("NHC: GPU 3 ECC DBE", T0)], policy(rules=(rule("DRAIN"),)), T0)
    assert v.summary() == 'Slurm DRAIN: "NHC: GPU 3 ECC DBE" (by root at 2026-01-05)'
    no_reason = finding_signal("n1", SlurmFinding((("NOT_RESPONDING", T0),)), T0)
    v = evaluate("n1", [no_reason], policy(rules=(rule("NOT_RESPONDING", hold=60),)), T0 + 60)
    assert v.summary() == "Slurm NOT_RESPONDING (no reason given) for 1m"


def test_the_node_store_keeps_the_newest_and_says_when_it_changed() -> None:
    store = NodeSignals(RuleIndex.of(policies(policy(rules=(rule("DRAIN"),)))))
    first = drained("x", T0)
    assert store.add(first)
    assert not store.add(first)  # the same again
    later = finding_signal("n1", None, T0 + 5)
    assert store.add(later)
    assert not store.add(first)  # older than what it holds
    assert store.signals(T0 + 6) == [later]
    assert store.size() == 1


def test_a_policy_file_with_a_slurm_rule_loads(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("""\
apiVersion: healer.io/v1alpha1
kind: RemediationPolicy
metadata: {name: p}
spec:
  nodeSelector: {matchLabels: {a: b}}
  rules:
    - name: nhc
      severity: failed
      slurm: {states: [DRAIN, FAIL], reason: "^NHC:", for: 2m}
    - name: slurm-down
      severity: degrading
      slurm: {states: [DOWN, NOT_RESPONDING]}
""")
    (p,) = load_policy_set([f]).policies
    nhc, down = p.rules
    assert isinstance(nhc, cp.SlurmRule)
    assert isinstance(down, cp.SlurmRule)
    assert nhc.states == {"DRAIN", "FAIL"}
    assert nhc.reason is not None
    assert nhc.reason.search("NHC: x")
    assert nhc.hold_for == 120
    assert down.states == frozenset({"DOWN", "NOT_RESPONDING"})
    assert down.reason is None
    assert down.hold_for == 0
