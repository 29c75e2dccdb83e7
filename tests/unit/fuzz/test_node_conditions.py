"""Fuzz: Nodes as any status writer may shape them (issue 22 item 5), generated.

Random conditions (types good and bad, duplicates, thousands of them, messages with zero, one
or several identity blocks, conflicting entries, control characters, ANSI escapes, NUL) and
random ``managedFields`` (the agent's field manager, others, shared ownership, garbage) go
through the adapter's :func:`healer.adapters.kube.nodes.node_view` and the core's
:func:`healer.core.signals.condition_signals`. Always: no exception; at most
``MAX_CONDITION_TYPES`` (+ Ready, GPUHealthy) conditions kept; every detail printable; and a
GPU identity only when exactly one GPUHealthy exists and the agent's manager alone owns its
message, the identity being that message's single, consistent block.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healer.adapters.kube.nodes import MAX_CONDITION_TYPES, node_view
from healer.core.gpu_identity import GpuIdentity, parse_entries, split_message, with_block
from healer.core.model import GpuRef
from healer.core.signals import condition_signals
from healer.core.vocabulary import AGENT_FIELD_MANAGER, GPU_CONDITION, GPU_IDENTITY_TAG

FUZZ = settings(max_examples=300, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NOW = 1_767_600_000.0
EVIL = st.sampled_from(["", "\n", "\x1b[31m", "\x00", "\u202e", "\r\n", "\t", "]", "[",
                        f"[{GPU_IDENTITY_TAG} v1 ", f"[{GPU_IDENTITY_TAG} v2 1:a:b]"])
gpus = st.lists(st.builds(lambda i, u, s, a: GpuIdentity(GpuRef(i, u, s), a),
                          st.integers(0, 20), st.sampled_from(["GPU-a", "GPU-b", "GPU-c", ""]),
                          st.sampled_from(["S1", "S2", "S3", ""]), st.booleans()),
                max_size=5)


@st.composite
def messages(draw: st.DrawFn) -> str:
    parts = [draw(EVIL) + draw(st.text(max_size=20)) + draw(EVIL)]
    for _ in range(draw(st.integers(0, 2))):
        parts.append(with_block("", draw(gpus)))
        parts.append(draw(EVIL))
    return " ".join(parts)


condition_types = st.sampled_from([GPU_CONDITION, "Ready", "NPDGpu", "MemoryPressure",
                                   "bad type", "x\ny", "", "a" * 400, "Junk-1", "Junk-2"])


@st.composite
def conditions(draw: st.DrawFn) -> list[Any]:
    out: list[Any] = []
    for _ in range(draw(st.integers(0, 6))):
        out.append({"type": draw(condition_types), "status": draw(st.sampled_from(
            ["True", "False", "Unknown", "False\x1b"])), "reason": draw(EVIL) + "Xid",
            "message": draw(messages()), "lastHeartbeatTime": "2026-01-05T08:00:00Z"})
    if draw(st.booleans()):  # thousands of junk conditions before or after the real ones
        junk = [{"type": f"Junk{i}", "status": "True"} for i in range(2000)]
        out = junk + out if draw(st.booleans()) else out + junk
    if draw(st.booleans()):
        out.append(draw(st.sampled_from([None, 1, "x", [], {"type": 7}])))
    return out


@st.composite
def managed(draw: st.DrawFn) -> Any:
    entries: list[Any] = []
    for _ in range(draw(st.integers(0, 3))):
        manager = draw(st.sampled_from([AGENT_FIELD_MANAGER, "kubelet", "intruder", ""]))
        types = draw(st.lists(st.sampled_from([GPU_CONDITION, "NPDGpu", "Ready"]),
                              max_size=2))
        owned = draw(st.sampled_from(["f:message", "f:status"]))
        entries.append({"manager": manager, "operation": "Update", "fieldsV1": {
            "f:status": {"f:conditions": {
                f'k:{json.dumps({"type": t}, separators=(",", ":"))}': {owned: {}}
                for t in types}}}})
    if draw(st.booleans()):
        entries.append(draw(st.sampled_from([None, "x", {"fieldsV1": 3},
                                             {"fieldsV1": {"f:status": []}}])))
    return entries if draw(st.integers(0, 9)) else draw(st.sampled_from([None, {}, "x", 5]))


def _owner(entries: Any) -> str:
    """Who owns GPUHealthy's message, read independently: one manager, or "" (none, shared)."""
    owners = set()
    for e in entries if isinstance(entries, list) else []:
        conds = (((e or {}).get("fieldsV1") or {}) if isinstance(e, dict) else {})
        conds = conds.get("f:status") if isinstance(conds, dict) else None
        conds = conds.get("f:conditions") if isinstance(conds, dict) else None
        if isinstance(conds, dict):
            for key, owned in conds.items():
                if json.loads(key[2:]).get("type") == GPU_CONDITION and "f:message" in owned:
                    owners.add(e.get("manager") or "")
    return owners.pop() if len(owners) == 1 else ""


consistent = st.lists(st.integers(0, 15), unique=True, max_size=4).map(
    lambda idx: [GpuIdentity(GpuRef(i, f"GPU-{i}", f"S{i}"), i % 2 == 0) for i in idx])


@st.composite
def nodes(draw: st.DrawFn) -> tuple[list[Any], Any]:
    """Random conditions and managedFields; half the time built around the agent's own
    well-formed GPUHealthy, then possibly spoiled (a second GPUHealthy, another owner of its
    message, a second block)."""
    conds, entries = draw(conditions()), draw(managed())
    if draw(st.booleans()):
        conds = [c for c in conds if not (isinstance(c, dict) and c.get("type") == GPU_CONDITION)]
        message = with_block(draw(st.text(max_size=10)), draw(consistent))
        if draw(st.integers(0, 3)) == 0:
            message += " " + with_block("", draw(gpus))
        conds.insert(draw(st.integers(0, len(conds))), {
            "type": GPU_CONDITION, "status": "False", "reason": "XidFatal",
            "message": message})
        if draw(st.integers(0, 3)) == 0:
            conds.append({"type": GPU_CONDITION, "status": "True", "message": with_block(
                "", draw(gpus))})
        owners = [AGENT_FIELD_MANAGER] + (["intruder"] if draw(st.integers(0, 3)) == 0 else [])
        entries = [{"manager": m, "operation": "Update", "fieldsV1": {"f:status": {
            "f:conditions": {'k:{"type":"GPUHealthy"}': {"f:message": {}}}}}}
            for m in owners] + (entries if isinstance(entries, list) else [])
    return conds, entries


@FUZZ
@given(node=nodes())
def test_any_node_status_is_read_in_bounds_and_identity_only_from_the_agent(
        node: tuple[list[Any], Any]) -> None:
    conds, entries = node
    raw = {"metadata": {"name": "n1", "managedFields": entries},
           "status": {"conditions": conds}}
    view = node_view(raw)
    assert len(view.conditions) <= MAX_CONDITION_TYPES + 2
    signals = condition_signals(view, NOW)
    for s in signals:
        for k, v in s.detail:
            assert v.isprintable(), (k, v)
    with_gpus = [s for s in signals if s.get("gpus")]
    gpu_conds = [c for c in conds if isinstance(c, dict) and c.get("type") == GPU_CONDITION]
    if not with_gpus:
        return
    (s,) = with_gpus
    assert s.key == GPU_CONDITION
    assert len(gpu_conds) == 1, "identity from one of two GPUHealthy conditions"
    assert _owner(entries) == AGENT_FIELD_MANAGER
    message = gpu_conds[0]["message"]
    assert message.count(f"[{GPU_IDENTITY_TAG} ") == 1
    found = parse_entries(s.get("gpus"))
    assert found == parse_entries(split_message(message)[1])
    for attr in ("index", "uuid", "serial"):  # no value stands for two GPUs
        values = [getattr(g.gpu, attr) for g in found if getattr(g.gpu, attr) not in (-1, "")]
        keyed = {getattr(g.gpu, attr): g.gpu for g in found
                 if getattr(g.gpu, attr) not in (-1, "")}
        assert len(keyed) == len(set(values))
        assert all(sum(1 for g in found if getattr(g.gpu, attr) == v) == 1 for v in keyed)
