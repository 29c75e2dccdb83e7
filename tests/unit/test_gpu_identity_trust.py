"""Whose word counts for GPU identity, and what a Node's conditions may cost (issue 22 item 5).

The identity block is read only from healer's agent's GPUHealthy condition whose message the
agent's field manager wrote (managedFields), one such condition per node; a block anywhere
else, a second GPUHealthy, a message with two blocks or a block in which one index, UUID or
serial names two GPUs identifies nothing. Text from conditions is kept printable. A Node with
thousands of conditions is read in a bounded number of parsed conditions."""

from __future__ import annotations

import json

import pytest

from healer.adapters.kube.nodes import (
    MAX_CONDITION_TYPES,
    MESSAGE_CHARS,
    node_view,
)
from healer.core import rules as cp
from healer.core.engine import Engine
from healer.core.gpu_identity import GpuIdentity, parse_entries, with_block
from healer.core.model import GpuRef, NodeCondition, NodeView, Severity
from healer.core.signals import condition_signals, identity_condition
from healer.core.vocabulary import AGENT_FIELD_MANAGER, GPU_CONDITION, GPU_IDENTITY_TAG
from tests.builders import GPU_LABELS, T0, policy

A = GpuRef(2, "GPU-aaaa", "1650000000002")
FORGED = GpuRef(2, "GPU-aaaa", "1650999999999")
TAG = f"[{GPU_IDENTITY_TAG} v1"


def _cond(message: str, writer: str = AGENT_FIELD_MANAGER, ctype: str = GPU_CONDITION,
          status: str = "False", reason: str = "XidFatal") -> NodeCondition:
    return NodeCondition(ctype, status, reason, message, T0, T0, writer)


def _view(*conds: NodeCondition) -> NodeView:
    return NodeView("n1", dict(GPU_LABELS), {}, False, (), (NodeCondition("Ready", "True"),
                                                            *conds))


def _gpus(view: NodeView) -> dict[str, str]:
    return {s.key: s.get("gpus") for s in condition_signals(view, T0 + 1)}


AGENT_MSG = with_block("XID 79 on GPU 2", [GpuIdentity(A, True)])
FORGED_MSG = with_block("XID 79 on GPU 2", [GpuIdentity(FORGED, True)])


def test_the_agents_own_condition_is_read() -> None:
    view = _view(_cond(AGENT_MSG))
    assert identity_condition(view) is view.conditions[1]
    assert parse_entries(_gpus(view)[GPU_CONDITION]) == (GpuIdentity(A, True),)


@pytest.mark.parametrize(("case", "conds"), [
    ("another writer", (_cond(FORGED_MSG, writer="kubectl-edit"),)),
    ("writer unknown", (_cond(FORGED_MSG, writer=""),)),
    ("another condition type", (_cond(FORGED_MSG, ctype="NPDGpuFault"),)),
    ("two GPUHealthy", (_cond(AGENT_MSG), _cond(FORGED_MSG))),
    ("two blocks", (_cond(f"{AGENT_MSG} {TAG} *2:GPU-aaaa:1650999999999]"),)),
    ("one UUID, two serials", (_cond(f"x {TAG} *2:GPU-aaaa:1 3:GPU-aaaa:2]"),)),
    ("one index, two UUIDs", (_cond(f"x {TAG} *2:GPU-aaaa:1 2:GPU-bbbb:2]"),)),
    ("one serial, two UUIDs", (_cond(f"x {TAG} *2:GPU-aaaa:1 3:GPU-bbbb:1]"),)),
])
def test_a_block_from_anyone_else_or_in_conflict_identifies_nothing(
        case: str, conds: tuple[NodeCondition, ...]) -> None:
    assert not any(_gpus(_view(*conds)).values()), case


def test_a_forged_block_cannot_aim_the_serial_budget_or_the_events() -> None:
    """Someone else's condition names a serial: the incident (from the agent's rule) names no
    serial from it, and no Event carries it."""
    rule = cp.ConditionRule("npd", Severity.FAILED, "NPDGpuFault", frozenset({"False"}), None)
    e = Engine(cp.PolicySet((policy("p", rules=(rule,)),)))
    view = _view(_cond(FORGED_MSG, ctype="NPDGpuFault", writer="npd"))
    e.set_node(view)
    e.ingest(condition_signals(view, T0))
    ev = e.evaluate("n1", T0 + 1)
    assert ev.trigger is not None
    d = e.decide("n1", ev.trigger, T0 + 1)
    assert d.record is not None
    assert FORGED.serial not in {g.serial for g in d.record.incident.gpus}
    assert not any(FORGED.serial in getattr(a, "note", "") for a in d.actions)


@pytest.mark.parametrize("evil", ["line1\nline2", "\x1b[31mred\x1b[0m", "nul\x00here",
                                  "rtl\u202eevil", "bell\x07", "sep\u2028x"])
def test_condition_text_is_kept_printable(evil: str) -> None:
    view = _view(_cond(f"{evil} {AGENT_MSG}", reason=evil, status=f"False{evil}"))
    for s in condition_signals(view, T0):
        for k, v in s.detail:
            assert v.isprintable(), (k, v)


# -- the adapter: managedFields and bounds ------------------------------------------------------


def _managed(manager: str, *types: str, subresource: str = "status") -> dict[str, object]:
    return {"manager": manager, "operation": "Update", "subresource": subresource,
            "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {
                f'k:{json.dumps({"type": t}, separators=(",", ":"))}':
                    {".": {}, "f:message": {}, "f:status": {}} for t in types}}}}


def _node(conditions: list[dict[str, object]],
          managed: list[dict[str, object]]) -> dict[str, object]:
    return {"metadata": {"name": "n1", "managedFields": managed},
            "status": {"conditions": conditions}}


def test_node_view_names_the_writer_of_each_conditions_message() -> None:
    raw = _node([{"type": "Ready", "status": "True"},
                 {"type": GPU_CONDITION, "status": "False", "message": AGENT_MSG},
                 {"type": "NPD", "status": "True", "message": "x"}],
                [_managed("kubelet", "Ready"), _managed(AGENT_FIELD_MANAGER, GPU_CONDITION),
                 _managed("npd", "NPD")])
    writers = {c.type: c.writer for c in node_view(raw).conditions}
    assert writers == {"Ready": "kubelet", GPU_CONDITION: AGENT_FIELD_MANAGER, "NPD": "npd"}


def test_a_message_two_managers_share_has_no_writer() -> None:
    raw = _node([{"type": GPU_CONDITION, "status": "False", "message": AGENT_MSG}],
                [_managed(AGENT_FIELD_MANAGER, GPU_CONDITION), _managed("other", GPU_CONDITION)])
    (c,) = node_view(raw).conditions
    assert c.writer == ""


def test_thousands_of_conditions_cost_a_bounded_read() -> None:
    junk = [{"type": f"Junk{i}", "status": "True", "message": "m" * 100} for i in range(5000)]
    raw = _node([*junk, {"type": "Ready", "status": "True"},
                 {"type": GPU_CONDITION, "status": "False", "message": AGENT_MSG},
                 {"type": "bad type\n", "status": "True"}, *junk],
                [_managed(AGENT_FIELD_MANAGER, GPU_CONDITION)])
    conds = node_view(raw).conditions
    assert len(conds) <= MAX_CONDITION_TYPES + 2
    types = [c.type for c in conds]
    assert "Ready" in types
    assert GPU_CONDITION in types  # found at the end, still read
    assert all("\n" not in t for t in types)
    assert identity_condition(node_view(raw)) is not None


def test_a_huge_message_is_cut_keeping_its_identity_block() -> None:
    raw = _node([{"type": GPU_CONDITION, "status": "False",
                  "message": "x" * 1_000_000 + " " + AGENT_MSG}],
                [_managed(AGENT_FIELD_MANAGER, GPU_CONDITION)])
    view = node_view(raw)
    assert len(view.conditions[0].message) <= MESSAGE_CHARS
    assert parse_entries(_gpus(view)[GPU_CONDITION]) == (GpuIdentity(A, True),)
