"""GPU identity end to end in the core (issue 14, item 3).

* the agent's block (:mod:`healer.core.gpu_identity`): formatted, split off a message and parsed
  back (a table of hostile and odd messages; hypothesis: any text is answered, never raised on;
  a formatted block always reads back as written);
* a node's condition carries the block into its CONDITION signal (the message without it);
* the per-serial retry budget, per source: a GPU whose serial already failed on one node is
  escalated when it fails again on another node, whether the fault comes from the agent's
  condition, a DCGM metric or a DCGM XID (serial from the node's agent block, by UUID), or a
  DCGM series that carries the serial itself; without any serial the budget cannot see it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healer.core import rules as cp
from healer.core.actions import EmitEvent, Escalate
from healer.core.engine import Engine
from healer.core.gpu_identity import (
    MAX_GPUS,
    GpuIdentity,
    format_block,
    parse_entries,
    split_message,
    with_block,
)
from healer.core.health import RuleMatch, Verdict
from healer.core.machine import Decision
from healer.core.model import (
    GpuRef,
    HealthState,
    NodeCondition,
    NodeView,
    Severity,
    Signal,
    SignalKind,
)
from healer.core.phases import Phase
from healer.core.signals import condition_signals
from healer.core.verdict_gpus import with_gpu_identity
from healer.core.vocabulary import AGENT_FIELD_MANAGER, GPU_CONDITION, GPU_IDENTITY_TAG
from tests.builders import GPU_LABELS, T0, policy

UUID_A = "GPU-5d3c8e7f-0000-1111-2222-333344445555"
A = GpuRef(2, UUID_A, "1650123456789")
B = GpuRef(0, "GPU-1a2b", "1650000000001")
TAG = f"[{GPU_IDENTITY_TAG} v1"

# -- the block ----------------------------------------------------------------------------------


SPLIT_CASES = [
    # (message, human text left, entries read)
    ("4 GPUs healthy", "4 GPUs healthy", ""),
    (f"XID 79 {TAG} *2:{UUID_A}:1650123456789 0:GPU-1a2b:1650000000001]", "XID 79",
     f"*2:{UUID_A}:1650123456789 0:GPU-1a2b:1650000000001"),
    (f"{TAG} *2:{UUID_A}:]", "", f"*2:{UUID_A}:"),  # serial unknown
    (f"{TAG} :{UUID_A}:S]", "", f":{UUID_A}:S"),  # index unknown
    (f"x {TAG} 1:a:b] then more", "x then more", "1:a:b"),
    (f"old {TAG} 1:a:x] new {TAG} 2:b:y]", f"old {TAG} 1:a:x] new {TAG} 2:b:y]",
     ""),  # two blocks conflict: no identity
    (f"x [{GPU_IDENTITY_TAG} v2 1:a:b]", f"x [{GPU_IDENTITY_TAG} v2 1:a:b]", ""),  # unknown version
    (f"x {TAG} 1:a:b", f"x {TAG} 1:a:b", ""),  # never closed
    (f"x {TAG} 1:a;b:c]", f"x {TAG} 1:a;b:c]", ""),  # nothing readable: left as it is
    (f"x {TAG} 1:a:b 2:a b:c]", "x", "1:a:b"),  # the malformed entries are skipped
    (f"x {TAG} 12345:a:b 1:a:b:c 1:a:b 1:a:b]", "x", "1:a:b"),  # bad index, 4 fields, dup
    (f"x {TAG} " + " ".join(f"{i}:u{i}:s{i}" for i in range(MAX_GPUS + 1)) + "]",
     f"x {TAG} " + " ".join(f"{i}:u{i}:s{i}" for i in range(MAX_GPUS + 1)) + "]", ""),  # too many
    (f"x {TAG} 1:{'u' * 65}:s]", f"x {TAG} 1:{'u' * 65}:s]", ""),  # a field too long
    (f"x {TAG} 1:a:{'s' * 5000}]", f"x {TAG} 1:a:{'s' * 5000}]", ""),  # a block too long
    ("", "", ""),
]


@pytest.mark.parametrize(("message", "text", "entries"), SPLIT_CASES)
def test_split_message(message: str, text: str, entries: str) -> None:
    assert split_message(message) == (text, entries)


def test_the_agent_block_reads_back() -> None:
    gpus = [GpuIdentity(B), GpuIdentity(A, affected=True)]
    message = with_block("GPU 2: XID 79", gpus)
    assert message == (f"GPU 2: XID 79 {TAG} *2:{UUID_A}:1650123456789 "
                       "0:GPU-1a2b:1650000000001]")
    text, entries = split_message(message)
    assert text == "GPU 2: XID 79"
    assert parse_entries(entries) == (GpuIdentity(A, True), GpuIdentity(B, False))
    # a field outside the format is written empty, never as it is
    assert format_block([GpuIdentity(GpuRef(1, "GPU x]", "S 1"))]) == f"{TAG} 1::]"
    # more GPUs than a block holds: the affected ones are kept
    many = [GpuIdentity(GpuRef(i, f"u{i}", f"s{i}"), affected=i == 40) for i in range(41)]
    kept = parse_entries(split_message(with_block("m", many))[1])
    assert len(kept) == MAX_GPUS
    assert kept[0] == GpuIdentity(GpuRef(40, "u40", "s40"), True)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300) | st.builds(lambda a, b: a + TAG + b, st.text(max_size=80),
                                           st.text(max_size=200)))
def test_any_message_is_answered(message: str) -> None:
    text, entries = split_message(message)
    assert len(text) <= len(message)
    for g in parse_entries(entries):
        assert g.gpu.index >= -1
        assert max(len(g.gpu.uuid), len(g.gpu.serial)) <= 64


FIELD = st.text("abcXYZ019.-_", max_size=20)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 9999), FIELD, FIELD, st.booleans()), max_size=MAX_GPUS,
                unique_by=(lambda t: t[0], lambda t: t[1], lambda t: t[2])))
def test_a_formatted_block_reads_back_as_written(
        gpus: list[tuple[int, str, str, bool]]) -> None:
    ids = [GpuIdentity(GpuRef(i, u, s), a) for i, u, s, a in gpus if i >= 0 or u or s]
    _, entries = split_message(with_block("human text", ids))
    assert sorted(parse_entries(entries), key=repr) == sorted(ids, key=repr)


# -- conditions → signals -------------------------------------------------------------------------


def agent_view(node: str, gpus: list[GpuIdentity], *, status: str = "True",
               reason: str = "Healthy", since: float = T0, heartbeat: float = T0) -> NodeView:
    message = with_block("XID 79 on GPU 2" if status == "False" else "8 GPUs healthy", gpus)
    return NodeView(node, dict(GPU_LABELS), {}, False, (), (
        NodeCondition("Ready", "True"),
        NodeCondition(GPU_CONDITION, status, reason, message, since, heartbeat,
                      AGENT_FIELD_MANAGER)))


def test_a_condition_signal_carries_the_block_and_the_message_without_it() -> None:
    view = agent_view("n1", [GpuIdentity(A, True), GpuIdentity(B)], status="False",
                      reason="XidFatal")
    _, gpu = condition_signals(view, T0 + 1)
    assert gpu.get("message") == "XID 79 on GPU 2"
    assert parse_entries(gpu.get("gpus")) == (GpuIdentity(A, True), GpuIdentity(B))
    (ready, _) = condition_signals(view, T0 + 1)
    assert ready.get("gpus") == ""


# -- the per-serial retry budget, per source -------------------------------------------------------

AGENT = cp.ConditionRule("agent", Severity.FAILED, GPU_CONDITION, frozenset({"False"}), None)
DBE = cp.MetricRule("dbe", Severity.FAILED, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", cp.Op.GT, 0)
XID = cp.XidRule("fatal", Severity.FAILED, frozenset({79}))
BUDGET = cp.Guardrails(retry_budget=cp.RetryBudget(per_node=5, per_gpu_serial=1, window=86400))
POLICY = policy("p", rules=(AGENT, DBE, XID), guardrails=BUDGET)
NO_SERIAL = GpuRef(A.index, A.uuid, "")


def agent_fault(node: str, t: float) -> tuple[NodeView, list[Signal]]:
    """The agent says GPU A failed (its block names A's serial)."""
    return agent_view(node, [GpuIdentity(A, True), GpuIdentity(B)], status="False",
                      reason="XidFatal", since=t, heartbeat=t), []


def healthy_agent(node: str, t: float) -> NodeView:
    return agent_view(node, [GpuIdentity(A), GpuIdentity(B)], since=t - 600, heartbeat=t)


def dcgm_metric(node: str, t: float) -> tuple[NodeView, list[Signal]]:
    """DCGM's DBE counter for A by UUID, no serial; the node's agent is healthy."""
    return healthy_agent(node, t), [Signal(node, "dcgm", SignalKind.METRIC, DBE.key, 1.0, t,
                                           NO_SERIAL)]


def dcgm_xid(node: str, t: float) -> tuple[NodeView, list[Signal]]:
    """XID 79 from Prometheus for A by UUID, no serial; the node's agent is healthy."""
    return healthy_agent(node, t), [Signal(node, "dcgm", SignalKind.XID, "DCGM_FI_DEV_XID_ERRORS",
                                           79.0, t, NO_SERIAL)]


def dcgm_serial_label(node: str, t: float) -> tuple[NodeView, list[Signal]]:
    """A DCGM series carrying the serial itself (DCGM_FI_DEV_SERIAL label), no agent."""
    view = NodeView(node, dict(GPU_LABELS), {}, False, (), (NodeCondition("Ready", "True"),))
    return view, [Signal(node, "dcgm", SignalKind.METRIC, DBE.key, 1.0, t, A)]


def dcgm_without_serial(node: str, t: float) -> tuple[NodeView, list[Signal]]:
    """No serial anywhere (no agent, no serial label): the budget cannot follow the GPU."""
    view = NodeView(node, dict(GPU_LABELS), {}, False, (), (NodeCondition("Ready", "True"),))
    return view, [Signal(node, "dcgm", SignalKind.METRIC, DBE.key, 1.0, t, NO_SERIAL)]


@dataclass(frozen=True)
class Source:
    name: str
    fault: object  # (node, t) -> (NodeView, [Signal])
    follows_the_gpu: bool


SOURCES = [Source("agent-condition", agent_fault, True),
           Source("dcgm-metric", dcgm_metric, True),
           Source("dcgm-xid", dcgm_xid, True),
           Source("dcgm-serial-label", dcgm_serial_label, True),
           Source("dcgm-no-serial-anywhere", dcgm_without_serial, False)]


def _fail(e: Engine, source: Source, node: str, t: float) -> Decision:
    view, signals = source.fault(node, t)  # type: ignore[operator]
    e.set_node(view)
    e.ingest([*condition_signals(view, t), *signals])
    ev = e.evaluate(node, t + 1)
    assert ev.trigger is not None, ev
    d = e.decide(node, ev.trigger, t + 1)
    e.commit(node, d)
    assert d.record is not None
    return d


@pytest.mark.parametrize("source", SOURCES, ids=[s.name for s in SOURCES])
def test_the_serial_budget_follows_the_gpu_to_another_node(source: Source) -> None:
    e = Engine(cp.PolicySet((POLICY,)))
    first = _fail(e, source, "n1", T0)
    assert first.phase is not Phase.ESCALATED
    serials = {g.serial for g in e.records["n1"].incident.gpus}
    assert serials == ({A.serial} if source.follows_the_gpu else {""})
    (opened,) = [a.note for a in first.actions
                 if isinstance(a, EmitEvent) and a.reason == "IncidentOpened"]
    assert (f"GPU 2 {UUID_A} serial {A.serial}" in opened) is source.follows_the_gpu, opened
    # the same GPU (same UUID and serial) now sits in n2, and fails again an hour later
    again = _fail(e, source, "n2", T0 + 3600)
    escalations = [a.reason for a in again.actions if isinstance(a, Escalate)]
    if source.follows_the_gpu:
        assert again.phase is Phase.ESCALATED
        assert escalations == [f"GPU serial {A.serial} failed 1 times in the last 1d (budget 1)"]
    else:
        assert again.phase is not Phase.ESCALATED
        assert not escalations


def test_only_confirmed_matches_are_identified() -> None:
    view = agent_view("n1", [GpuIdentity(A)])
    signals = condition_signals(view, T0)
    detail = f"XID 79 on {NO_SERIAL.describe()}"
    failed = RuleMatch("fatal", HealthState.FAILED, Severity.FAILED, T0, (NO_SERIAL,), detail)
    suspect = replace(failed, rule="slow", state=HealthState.SUSPECT)
    v = Verdict("n1", HealthState.FAILED, T0, Severity.FAILED, (failed, suspect))
    got = with_gpu_identity(v, signals)
    assert got.matches[0].gpus == (A,)
    assert got.matches[0].detail == f"XID 79 on {A.describe()}"
    assert got.matches[1] is suspect
    # nothing to identify: the very same verdict comes back
    known = replace(v, matches=(replace(failed, gpus=(A,)),))
    assert with_gpu_identity(known, signals) is known
    assert with_gpu_identity(replace(v, matches=(suspect,)), signals).matches == (suspect,)
    # no agent block on the node: the serial stays unknown
    assert with_gpu_identity(v, []).matches[0].gpus == (NO_SERIAL,)
