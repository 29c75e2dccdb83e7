"""Node events: what a change of a Kubernetes Node means for remediation, decided in one place.

The runtime's node-events source (:mod:`healer.runtime.node_events`) hands every Node watch
event to :func:`node_change`; the controller then only ingests the signals and queues the
triggers it returns. Two things come out of a Node:

* **signals**: its conditions (any detector's: healer's agent, NPD, a cloud agent) as
  CONDITION signals (:func:`healer.core.signals.condition_signals`), whenever a condition
  changed, even if only its heartbeat did (that refreshes the signal; only a change beyond
  heartbeats asks for an evaluation);
* **triggers** an admin or a repair system causes on a node with an open remediation
  (:func:`admin_triggers`): an uncordon of a node healer cordoned (ADMIN_UNCORDON),
  ``healer.io/exclude=true`` (OPT_OUT), ``healer.io/repair-result`` on a node in repair
  (REPAIR); and a change of what a waiting step reads of the Node itself (NODE: it was
  deleted, its readiness or taints changed, a fencing provider annotated it) while its
  remediation waits on one (a dead node's fencing, its out-of-service taint's removal);
* **a new warm spare** (:func:`available_spare`): a Node that is now a free spare and was not
  one before — created as one, labelled one, Ready again, uncordoned, released by a claim —
  wakes the remediations held for capacity, on this very event.

Pure: no I/O, no clock (``now`` is passed in).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from healer.core.machine import Trigger, TriggerKind
from healer.core.machine.triggers import REPAIR_NO_FAULT
from healer.core.model import NodeRecord, NodeView, Signal
from healer.core.phases import MAY_BE_CORDONED, Phase
from healer.core.signals import condition_signals, only_heartbeats
from healer.core.vocabulary import (
    CLAIMED_BY,
    CORDONED_BY,
    CORDONED_BY_HEALER,
    EXCLUDE_LABEL,
    FENCE_ACK,
    FENCED_ANNOTATION,
    INCIDENT_ANNOTATION,
    REPAIR_RESULT,
    SPARE_FAILED_LABEL,
    StepName,
)

#: Is a node with these labels a warm spare (``PolicySet.is_spare``)?
SpareTest = Callable[[Mapping[str, str]], bool]

#: The phases of a dead node's flow, whose steps read the Node object itself (NODE triggers).
NODE_PHASES = frozenset({Phase.DEAD, Phase.HELD_FOR_FENCING, Phase.OUT_OF_SERVICE})


def waits_on_node(record: NodeRecord) -> bool:
    """Does a step of ``record`` wait on the Node object itself: a dead node's fencing and
    taint, or the removal of its out-of-service taint once it is Ready again?"""
    if record.phase in NODE_PHASES:
        return True
    clear = record.step(StepName.CLEAR_OUT_OF_SERVICE)
    return record.phase is Phase.REPAIR and clear is not None and not clear.done

#: What :func:`admin_triggers` looked at; the same state twice derives no trigger again.
AdminState = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class NodeChange:
    """What one Node watch event means (:func:`node_change`)."""

    node: str
    view: NodeView | None
    """The node as it is now; None: it was deleted."""
    signals: tuple[Signal, ...] = ()
    """Its conditions as signals, when :attr:`conditions_refreshed`."""
    conditions_refreshed: bool = False
    """The node is new or some condition changed, if only its heartbeat (its condition
    signals are refreshed)."""
    conditions_changed: bool = False
    """A condition changed beyond its heartbeat: the node's health needs evaluating."""
    new_spare: bool = False
    """It just became a free warm spare (:func:`available_spare`)."""
    triggers: tuple[Trigger, ...] = ()
    """What an admin or a repair system caused on the node's open remediation."""
    admin_state: AdminState | None = None
    """The state the triggers were derived from (None: no open remediation)."""


def node_change(old: NodeView | None, new: NodeView | None, now: float, *,
                record: NodeRecord | None = None,
                is_spare: SpareTest | None = None) -> NodeChange:
    """What the Node's change from ``old`` (None: first seen) to ``new`` (None: deleted) means,
    given its open remediation ``record`` and what makes a node a warm spare (``is_spare``:
    the fleet's and every NodeSet's spare selector)."""
    if new is None:
        gone = record is not None and waits_on_node(record)
        return NodeChange(old.name if old is not None else "", None, triggers=(
            Trigger(TriggerKind.NODE, record.node, now, incident=record.incident.id),)
            if gone and record is not None else ())
    beat = old is None or old.conditions != new.conditions
    signals = tuple(condition_signals(new, now)) if beat else ()
    new_spare = is_spare is not None and available_spare(new, is_spare) and (
        old is None or not available_spare(old, is_spare))
    return NodeChange(new.name, new, signals, conditions_refreshed=beat,
                      conditions_changed=beat and not only_heartbeats(old, new),
                      new_spare=new_spare, triggers=admin_triggers(new, record, now),
                      admin_state=admin_state(new, record))


def available_spare(view: NodeView, is_spare: SpareTest) -> bool:
    """Could a claim take ``view`` now: a warm spare by its labels, Ready, schedulable, not
    claimed, not failed its validation?"""
    return (is_spare(view.labels) and view.ready and not view.unschedulable
            and not view.annotations.get(CLAIMED_BY)
            and view.labels.get(SPARE_FAILED_LABEL, "").lower() != "true")


def admin_state(view: NodeView, record: NodeRecord | None) -> AdminState | None:
    """Everything :func:`admin_triggers` reads, as one comparable value (None: no record)."""
    if record is None:
        return None
    ann = view.annotations
    return (view.unschedulable, ann.get(INCIDENT_ANNOTATION), ann.get(CORDONED_BY),
            view.labels.get(EXCLUDE_LABEL), ann.get(REPAIR_RESULT), record.incident.id,
            record.phase, view.ready, tuple(sorted((t.key, t.effect) for t in view.taints)),
            ann.get(FENCED_ANNOTATION), ann.get(FENCE_ACK))


def admin_triggers(view: NodeView, record: NodeRecord | None,
                   now: float) -> tuple[Trigger, ...]:
    """The triggers an admin (or a repair system) caused on ``view``'s open remediation:

    * ADMIN_UNCORDON: the node is uncordoned while healer's cordon of this incident should be
      on it (provenance annotations still name it);
    * OPT_OUT: ``healer.io/exclude`` is ``true`` (any case);
    * REPAIR: ``healer.io/repair-result`` is ``passed``, ``failed`` or ``no-fault`` (passed,
      nothing found to fix; any case) while the node is in repair;
    * NODE: the remediation waits on the Node itself (:func:`waits_on_node`): the runtime
      derives triggers again only when :func:`admin_state` changed (its readiness, taints,
      fencing annotations among them)."""
    if record is None:
        return ()
    ann, incident, phase = view.annotations, record.incident.id, record.phase
    out: list[Trigger] = []
    ours = (ann.get(INCIDENT_ANNOTATION) == incident
            and ann.get(CORDONED_BY) == CORDONED_BY_HEALER)
    if ours and not view.unschedulable and phase in MAY_BE_CORDONED:
        out.append(Trigger(TriggerKind.ADMIN_UNCORDON, view.name, now, incident=incident))
    if view.labels.get(EXCLUDE_LABEL, "").lower() == "true":
        out.append(Trigger(TriggerKind.OPT_OUT, view.name, now, incident=incident))
    result = ann.get(REPAIR_RESULT, "").lower()  # a repair system's (or human's) verdict
    if phase is Phase.REPAIR and result in ("passed", "failed", REPAIR_NO_FAULT):
        out.append(Trigger(TriggerKind.REPAIR, view.name, now, incident=incident,
                           repair_passed=result != "failed",
                           repair_no_fault=result == REPAIR_NO_FAULT))
    if waits_on_node(record):
        out.append(Trigger(TriggerKind.NODE, view.name, now, incident=incident))
    return tuple(out)
