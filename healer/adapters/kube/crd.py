"""The ``NodeRemediation`` custom resource: its definition and the exact mapping to and from
the core's :class:`~healer.core.model.NodeRecord`.

``spec`` holds what opened the remediation (node, policy, incident with its signals' summary
and GPUs) and never changes; ``status`` is the record (phase, ledger, spare, ...), written by
healer *before* each action (intent) and after it (outcome). A few status fields are derived for
humans (``reason``, ``conditions``, ``lastTransitionTime``) and ignored when reading back.
"""

from __future__ import annotations

from typing import Any

from healer.core.machine import held_reason
from healer.core.model import RECORD_FORMAT_VERSION, FenceProvider, NodeRecord
from healer.core.phases import Phase
from healer.core.text import printable
from healer.core.timefmt import rfc3339
from healer.core.vocabulary import NODE_LABEL

GROUP = "healer.io"
VERSION = "v1alpha1"
PLURAL = "noderemediations"
KIND = "NodeRemediation"
API_VERSION = f"{GROUP}/{VERSION}"

_DERIVED = ("reason", "conditions", "lastTransitionTime", "observedGeneration")


def _s(desc: str = "") -> dict[str, Any]:
    return {"type": "string", **({"description": desc} if desc else {})}


def _n(desc: str = "") -> dict[str, Any]:
    return {"type": "number", **({"description": desc} if desc else {})}


_GPU = {"type": "object", "properties": {"index": {"type": "integer"}, "uuid": _s(),
                                         "serial": _s()}}
_INCIDENT = {
    "type": "object",
    "required": ["id", "node", "openedAt", "severity"],
    "properties": {
        "id": _s("incident id (node + time it was first suspected)"),
        "node": _s(), "openedAt": _n("seconds since the epoch"),
        "severity": {"type": "string", "enum": ["degrading", "failed"]},
        "rules": {"type": "array", "items": _s()},
        "gpus": {"type": "array", "items": _GPU},
        "summary": _s("what was seen"),
        "evidence": {"type": "array", "description": "the signals that confirmed it",
                     "items": {"type": "object", "properties": {
                         "source": _s(), "kind": _s(), "key": _s(), "value": _n(),
                         "observedAt": _n(), "gpu": _GPU,
                         "detail": {"type": "object",
                                    "additionalProperties": {"type": "string"}},
                         "part": {"type": "object", "description": "the part of the node "
                                  "(an HCA port: device, port) when not a GPU",
                                  "additionalProperties": {"type": "string"}}}}},
    },
}
_STEP = {
    "type": "object", "required": ["step", "startedAt"],
    "properties": {"step": _s(), "startedAt": _n(), "finishedAt": _n(),
                   "attempts": {"type": "integer", "minimum": 0},
                   "outcome": {"type": "string", "enum": ["ok", "failed", "timeout", "skipped"]},
                   "error": _s(), "detail": _s()},
}
_STATUS = {
    "type": "object",
    "properties": {
        "formatVersion": {"type": "integer"},
        "node": _s(), "policy": _s(),
        "phase": {"type": "string", "enum": [p.value for p in Phase]},
        "phaseSince": _n(), "mode": {"type": "string", "enum": ["observe", "dryRun", "act"]},
        "ledger": {"type": "array", "items": _STEP},
        "spare": _s("the warm spare that replaces the node"),
        "sparePlacement": {
            "type": "object",
            "description": "how far the spare is from the node: level domain (the same NVLink "
                           "domain), tier-N (another domain, sharing the tier-N fabric switch) "
                           "or any (nothing shared); a spare from another domain also raises "
                           "a SpareFromOtherDomain Event",
            "properties": {"level": _s(), "sameDomain": {"type": "boolean"},
                           "nodeDomain": _s(), "spareDomain": _s(), "switch": _s()}},
        "death": {
            "type": "object",
            "description": "the node was declared dead: since when (its earliest witness), "
                           "when, the witnesses in words, the fencing provider that said the "
                           "machine is off or cut off (and what it said, when), and the jobs "
                           "Slurm failed or requeued there",
            "properties": {"since": _n(), "declared": _n(),
                           "witnesses": {"type": "array", "items": _s()},
                           "provider": {"type": "string", "enum": [
                               p.value for p in FenceProvider]},
                           "fencedBy": _s(), "fencedAt": _n(), "lostJobs": _s(),
                           "labels": {"type": "object",
                                      "additionalProperties": {"type": "string"}}}},
        "carriedReason": _s("someone else's Slurm drain or DOWN reason the swap carried over "
                            "to the replacement (steps.swap.foreignReason: carryOver)"),
        "slurmNode": _s(), "verdict": _s(), "verdictAt": _n(),
        "paused": {"type": "boolean"}, "repaired": {"type": "boolean"},
        "outcome": _s(),
        "blocked": {"type": "object", "properties": {
            "guardrail": _s(), "message": _s(), "current": _n(), "limit": _n()}},
        "history": {"type": "array", "items": {"type": "object", "properties": {
            "at": _n(), "from": _s(), "to": _s(), "trigger": _s()}}},
        "events": {"type": "array", "description": "the latest decision's Events (re-emitted "
                   "after a restart; idempotent)", "items": {"type": "object", "properties": {
                       "reason": _s(), "note": _s(), "type": _s(), "name": _s()}}},
        "reason": _s("derived: why the remediation is where it is"),
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "conditions": {"type": "array", "items": {
            "type": "object", "required": ["type", "status"],
            "properties": {"type": _s(), "status": _s(), "reason": _s(), "message": _s(),
                           "lastTransitionTime": {"type": "string", "format": "date-time"}}},
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    },
}


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition (``deploy/crds/`` holds it as YAML; a test keeps it equal)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {"plural": PLURAL, "singular": "noderemediation", "kind": KIND,
                      "listKind": f"{KIND}List", "shortNames": ["nrem"],
                      "categories": ["healer"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Node", "type": "string", "jsonPath": ".spec.node"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
                    {"name": "Spare", "type": "string", "jsonPath": ".status.spare"},
                    {"name": "Placement", "type": "string",
                     "jsonPath": ".status.sparePlacement.level", "priority": 1},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "One remediation of one node (one incident). Status is "
                                   "healer's persisted record; see docs/workflow.md.",
                    "properties": {
                        "apiVersion": _s(), "kind": _s(), "metadata": {"type": "object"},
                        "spec": {"type": "object", "required": ["node", "incident"],
                                 "properties": {"node": _s("the Kubernetes node"),
                                                "policy": _s(), "mode": _s(),
                                                "incident": _INCIDENT}},
                        "status": _STATUS,
                    },
                }},
            }],
        },
    }


def reason_of(rec: NodeRecord) -> str:
    waiting = next((s for s in reversed(rec.ledger) if not s.done and s.error), None)
    if rec.phase is Phase.HELD_FOR_CAPACITY and not rec.blocked and waiting is None:
        text = held_reason(rec)  # what the last claim said (e.g. requireSameDomain)
    elif rec.blocked is not None:
        text = f"held by {rec.blocked.guardrail}: {rec.blocked.message}"
    elif waiting is not None and rec.outcome is None:  # e.g. a swap held on someone's drain
        text = f"{waiting.step}: {waiting.error}"
    elif rec.outcome is not None:
        text = rec.outcome_text
    else:
        text = rec.incident.summary or ", ".join(rec.incident.rules)
    return printable(text, 200)


def _printable(v: Any) -> Any:
    """``v`` with every string in it made printable (text from others reaches a record through
    its summary, evidence, step errors and outcome: no control character is written)."""
    if isinstance(v, str):
        return printable(v)
    if isinstance(v, dict):
        return {k: _printable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_printable(x) for x in v]
    return v


def to_object(rec: NodeRecord, name: str, resource_version: str = "") -> dict[str, Any]:
    d = _printable(rec.to_dict())
    incident = d.pop("incident")
    status = dict(d)
    status["reason"] = reason_of(rec)
    status["lastTransitionTime"] = rfc3339(rec.phase_since)
    status["conditions"] = _printable(_conditions(rec))
    meta: dict[str, Any] = {"name": name, "labels": {NODE_LABEL: rec.node[:63]}}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta,
            "spec": {"node": rec.node, "policy": rec.policy, "mode": rec.mode.value,
                     "incident": incident},
            "status": status}


def _conditions(rec: NodeRecord) -> list[dict[str, Any]]:
    phase = rec.phase
    done = phase in (Phase.DONE, Phase.CANCELLED, Phase.ESCALATED)
    return [
        {"type": "Completed", "status": "True" if done else "False", "reason": rec.phase.value,
         "message": rec.outcome_text or rec.phase.value,
         "lastTransitionTime": rfc3339(rec.phase_since)},
        {"type": "Blocked", "status": "True" if rec.blocked else "False",
         "reason": rec.blocked.guardrail if rec.blocked else "None",
         "message": rec.blocked.message if rec.blocked else "",
         "lastTransitionTime": rfc3339(rec.phase_since)},
    ]


def from_object(obj: dict[str, Any]) -> NodeRecord:
    """The record an object holds; an object created but never given a status (a crash
    between the two writes) yields the record as it was opened."""
    spec = obj.get("spec") or {}
    status = dict(obj.get("status") or {})
    incident = spec["incident"]
    if not status.get("formatVersion"):
        phase = Phase.FAILED if incident.get("severity") == "failed" else Phase.DEGRADING
        status = {"formatVersion": RECORD_FORMAT_VERSION, "node": spec["node"],
                  "policy": spec.get("policy", ""), "phase": phase.value,
                  "phaseSince": float(incident["openedAt"]), "mode": spec.get("mode", "act"),
                  "verdict": incident.get("severity", "failed"),
                  "verdictAt": float(incident["openedAt"])}
    for k in _DERIVED:
        status.pop(k, None)
    status["incident"] = incident
    return NodeRecord.from_dict(status)
