"""Small builders for tests, with sensible defaults: the core's policies, records, views and
triggers (unit and component tests), and the policy files the daemon, flow and observability
tests give a running daemon (one builder instead of policy YAML copied into each file).

A daemon test says only what differs from the common case (a fleet whose spares carry
``healer.io/role=spare`` and the test's own label, one act-mode RemediationPolicy over the test's
GPU Nodes with the fatal-XID rule, a 1 s poll and a 10 min drain deadline)::

    policy_yaml(tid, name=f"storm-{tid}", label=TEST_LABEL,
                fleet={"guardrails": {"maxUnavailable": 2}},
                steps=policy_steps(swap=True, repair_hook="none"))

The documents go through ``yaml.safe_dump_all``, so a value is written with the type the test
gave it (``"true"`` stays a string, ``5`` an integer) and no format string can break it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import yaml

from healer.core import rules as cp
from healer.core.budget import BudgetView
from healer.core.capacity import FleetIndex, open_remediation
from healer.core.health import RuleMatch, Verdict
from healer.core.machine import (
    SlurmObservation,
    StepResult,
    Trigger,
    TriggerKind,
    incident_id,
)
from healer.core.model import (
    Death,
    GpuRef,
    HealthState,
    Incident,
    NodeCondition,
    NodeRecord,
    NodeView,
    PastIncident,
    Severity,
    StepOutcome,
    StepRecord,
)
from healer.core.phases import Phase

T0 = 1_767_600_000.0  # 2026-01-05T08:00:00Z
GPU_LABELS = {"nvidia.com/gpu.present": "true"}


def policy(name: str = "p", *, mode: cp.Mode = cp.Mode.ACT,
           rules: tuple[cp.Rule, ...] | None = None, steps: cp.Steps | None = None,
           guardrails: cp.Guardrails | None = None,
           priority: int = 0, labels: dict[str, str] | None = None,
           dead: cp.DeadNode | None = None) -> cp.Policy:
    return cp.Policy(
        name=name,
        selector=cp.LabelSelector(dict(labels or GPU_LABELS)),
        rules=rules if rules is not None else (
            cp.XidRule("fatal", Severity.FAILED, frozenset({79, 48})),),
        steps=steps or cp.Steps(),
        guardrails=guardrails or cp.Guardrails(),
        mode=mode,
        priority=priority,
        dead=dead or cp.DeadNode(),
    )


#: dead-node handling on, with the defaults
DEAD_ON = cp.DeadNode(enabled=True)


def policies(*ps: cp.Policy, fleet: cp.FleetRules | None = None) -> cp.PolicySet:
    return cp.PolicySet(tuple(ps) or (policy(),), fleet or cp.FleetRules())


def node(name: str, *, labels: dict[str, str] | None = None, unschedulable: bool = False,
         ready: bool = True, **extra: str) -> NodeView:
    lab = dict(GPU_LABELS) | dict(labels or {}) | extra
    conds = (NodeCondition("Ready", "True" if ready else "False"),)
    return NodeView(name, lab, {}, unschedulable, (), conds)


def incident(nodename: str = "n1", at: float = T0, severity: Severity = Severity.FAILED,
             serials: tuple[str, ...] = ("S1",)) -> Incident:
    gpus = tuple(GpuRef(i, f"GPU-{i}", s) for i, s in enumerate(serials))
    return Incident(incident_id(nodename, at), nodename, at, severity, ("fatal",), gpus,
                    "XID 79 x1")


def record(phase: Phase, *, nodename: str = "n1", at: float = T0,
           ledger: tuple[StepRecord, ...] = (), policy_name: str = "p",
           severity: Severity = Severity.FAILED, **kw: Any) -> NodeRecord:
    base = NodeRecord(node=nodename, incident=incident(nodename, at, severity), policy=policy_name,
                      phase=phase, phase_since=at, mode=cp.Mode.ACT, ledger=ledger,
                      slurm_node=nodename, verdict=HealthState.FAILED, verdict_at=at)
    return replace(base, **kw)


def open_step(name: str, at: float = T0, attempts: int = 1) -> StepRecord:
    return StepRecord(name, at, attempts)


def done_step(name: str, at: float = T0, detail: str = "") -> StepRecord:
    return StepRecord(name, at, 1, at + 1, StepOutcome.DONE, "", detail)


def view(ps: cp.PolicySet | None = None, nodes: list[NodeView] | None = None,
         records: list[NodeRecord] | None = None, incidents: list[PastIncident] | None = None,
         paused: bool = False, paused_nodes: frozenset[str] = frozenset()) -> BudgetView:
    """What the guardrails see of ``nodes`` (default n1..n10) with ``records`` open and
    ``incidents`` past: the view of a fleet index told just that. Only ``paused_nodes`` are
    paused node by node."""
    index = FleetIndex(ps or policies())
    for n in nodes if nodes is not None else [node(f"n{i}") for i in range(1, 11)]:
        index.set_node(n)
    for r in records or []:
        index.set_open(open_remediation(r), r.incident.id)
    for i in incidents or []:
        index.add_incident(i)
    return replace(index.view(paused=paused), paused_nodes=paused_nodes)


def verdict(state: HealthState, nodename: str = "n1", at: float = T0, policy_name: str = "p",
            severity: Severity | None = None) -> Verdict:
    sev = severity
    if sev is None and state is HealthState.FAILED:
        sev = Severity.FAILED
    if sev is None and state is HealthState.DEGRADING:
        sev = Severity.DEGRADING
    return Verdict(nodename, state, at, sev, (), None, policy_name)


def dead_verdict(nodename: str = "n1", at: float = T0, since: float = T0 - 150,
                 policy_name: str = "p") -> Verdict:
    """A dead verdict as :func:`healer.core.health.dead_match` words it."""
    m = RuleMatch(cp.DEAD_RULE, HealthState.DEAD, Severity.FAILED, since, (),
                  "node dead: Ready=Unknown since then; Slurm NOT_RESPONDING since then")
    return Verdict(nodename, HealthState.DEAD, at, Severity.FAILED, (m,), None, policy_name)


def d_trigger(nodename: str = "n1", at: float = T0, **kw: Any) -> Trigger:
    """A dead verdict for ``nodename``."""
    return Trigger(TriggerKind.VERDICT, nodename, at, verdict=dead_verdict(nodename, at, **kw))


def death(since: float = T0 - 150, declared: float = T0, **kw: Any) -> Death:
    return Death(since, declared, ("Ready=Unknown since then",), **kw)


def v_trigger(state: HealthState, nodename: str = "n1", at: float = T0, **kw: Any) -> Trigger:
    return Trigger(TriggerKind.VERDICT, nodename, at, verdict=verdict(state, nodename, at, **kw))


def s_trigger(step: str, status: StepOutcome, nodename: str = "n1", at: float = T0,
              error: str = "", **data: str) -> Trigger:
    return Trigger(TriggerKind.STEP, nodename, at,
                   result=StepResult(step, status, error, tuple(sorted(data.items()))))


def slurm_trigger(drain: bool, busy: bool, nodename: str = "n1", at: float = T0) -> Trigger:
    return Trigger(TriggerKind.SLURM, nodename, at, slurm=SlurmObservation(drain, busy))


def trigger(kind: TriggerKind, nodename: str = "n1", at: float = T0, **kw: Any) -> Trigger:
    return Trigger(kind, nodename, at, **kw)


# ------------------------------------------------------------- policy files for a daemon

API_VERSION = "healer.io/v1alpha1"
#: the label that scopes a daemon test's Nodes and spares to that test
TEST_LABEL = "healer-test"

FATAL_XID: dict[str, Any] = {"name": "fatal-xid", "severity": "failed",
                             "xid": {"groups": ["fatal"]}}


def policy_steps(*, swap: bool | None = None, repair_hook: str | None = None,
          **extra: Any) -> dict[str, Any]:
    """A policy's ``steps``: a 1 s poll and a 10 min drain deadline, plus ``extra`` blocks
    (``checkpoint=…``, ``repair=…``); ``swap`` sets ``swap.enabled``; ``repair_hook`` sets
    ``repair.hook``."""
    out: dict[str, Any] = {"pollInterval": "1s"}
    checkpoint = extra.pop("checkpoint", None)
    if checkpoint is not None:
        out["checkpoint"] = checkpoint
    out["drain"] = {"deadline": "10m"}
    if swap is not None:
        out["swap"] = {"enabled": swap}
    if repair_hook is not None:
        out["repair"] = {"hook": repair_hook}
    out.update(extra)
    return out


def fleet_guardrails(tid: str, *, label: str = TEST_LABEL,
                     guardrails: Mapping[str, Any] | None = None,
                     **spec: Any) -> dict[str, Any]:
    """The FleetGuardrails document: spares are the test's Nodes labelled
    ``healer.io/role=spare``; ``guardrails`` and further ``spec`` keys as given."""
    body: dict[str, Any] = {
        "spareSelector": {"matchLabels": {"healer.io/role": "spare", label: tid}}}
    if guardrails:
        body["guardrails"] = dict(guardrails)
    body.update(spec)
    return {"apiVersion": API_VERSION, "kind": "FleetGuardrails",
            "metadata": {"name": "fleet"}, "spec": body}


def remediation_policy(tid: str, *, name: str, label: str = TEST_LABEL,
                       rules: Sequence[Mapping[str, Any]] = (FATAL_XID,),
                       steps: Mapping[str, Any] | None = None,
                       mode: str = "act", **spec: Any) -> dict[str, Any]:
    """A RemediationPolicy over the test's GPU Nodes (``nvidia.com/gpu.present=true`` and the
    test's label); further ``spec`` keys (``guardrails``, ``deadNode``, …) as given."""
    body: dict[str, Any] = {
        "mode": mode,
        "nodeSelector": {"matchLabels": {"nvidia.com/gpu.present": "true", label: tid}},
        "rules": [dict(r) for r in rules],
    }
    body.update(spec)
    body["steps"] = dict(steps if steps is not None else policy_steps())
    return {"apiVersion": API_VERSION, "kind": "RemediationPolicy",
            "metadata": {"name": name}, "spec": body}


def slurm_nodeset(name: str, *, cluster: str, slurm: Mapping[str, Any],
                  node_selector: Mapping[str, str], **spec: Any) -> dict[str, Any]:
    """A SlurmNodeSet: its Slurm cluster and driver, the Nodes it serves, further ``spec``
    keys (``nodeSet``, ``spareSelector``, ``guardrails``) as given."""
    body: dict[str, Any] = {"cluster": cluster, "slurm": dict(slurm),
                            "nodeSelector": {"matchLabels": dict(node_selector)}}
    body.update(spec)
    return {"apiVersion": API_VERSION, "kind": "SlurmNodeSet", "metadata": {"name": name},
            "spec": body}


def yaml_documents(*documents: Mapping[str, Any]) -> str:
    """The documents as one multi-document YAML file."""
    return yaml.safe_dump_all([dict(d) for d in documents], sort_keys=False)


def policy_yaml(tid: str, *, name: str, label: str = TEST_LABEL,
                fleet: Mapping[str, Any] | None = None,
                nodesets: Sequence[Mapping[str, Any]] = (),
                **policy: Any) -> str:
    """The usual policy file of a daemon test: the fleet's guardrails (``fleet``: the
    FleetGuardrails spec keys besides the spare selector), any SlurmNodeSets, then one
    RemediationPolicy (``policy``: :func:`remediation_policy`'s keyword arguments)."""
    return yaml_documents(fleet_guardrails(tid, label=label, **dict(fleet or {})), *nodesets,
                remediation_policy(tid, name=name, label=label, **policy))
