"""healer.core.node_events: what a Node watch event means, as a table (old, new, record) →
(signals, triggers, flags)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from healer.core.machine import TriggerKind
from healer.core.model import NodeCondition, NodeView, SignalKind, Taint
from healer.core.node_events import admin_state, admin_triggers, node_change
from healer.core.phases import Phase
from healer.core.rules import LabelSelector
from healer.core.vocabulary import (
    CLAIMED_BY,
    CLOUD_SHUTDOWN_TAINT,
    CORDONED_BY,
    EXCLUDE_LABEL,
    FENCE_ACK,
    FENCED_ANNOTATION,
    INCIDENT_ANNOTATION,
    REPAIR_RESULT,
    ROLE_LABEL,
    SPARE_FAILED_LABEL,
)
from tests.builders import T0, open_step, record

SPARES = LabelSelector({ROLE_LABEL: "spare"})
EAST = LabelSelector({"pool": "east-spares"})


def is_spare(labels: Mapping[str, str]) -> bool:
    """The fleet's selector and a NodeSet's own (``PolicySet.is_spare``)."""
    return SPARES.matches(labels) or EAST.matches(labels)


READY = NodeCondition("Ready", "True", last_transition=T0 - 500)
NOT_READY = NodeCondition("Ready", "Unknown", last_transition=T0 - 5)
GPU = NodeCondition("GPUHealthy", "True", "Ok", "", last_transition=T0 - 100, last_heartbeat=T0)
BAD = NodeCondition("GPUHealthy", "False", "XID79", "", last_transition=T0, last_heartbeat=T0)


def n(*conds: NodeCondition, unschedulable: bool = False, labels: dict[str, str] | None = None,
      **annotations: str) -> NodeView:
    return NodeView("n1", labels or {}, annotations, unschedulable, (), conds)


def cordoned(incident: str, **more: str) -> dict[str, str]:
    return {INCIDENT_ANNOTATION: incident, CORDONED_BY: "healer", **more}


REC = record(Phase.CORDONED)
INC = REC.incident.id
BEAT = replace(GPU, last_heartbeat=T0 + 30)

# (case, old, new, conditions refreshed?, conditions changed?, new spare?)
CHANGES = [
    ("first seen, no conditions", None, n(), True, True, False),
    ("first seen, a condition", None, n(GPU), True, True, False),
    ("nothing changed", n(GPU), n(GPU), False, False, False),
    ("only a heartbeat", n(GPU), n(BEAT), True, False, False),
    ("a condition turned", n(GPU), n(BAD), True, True, False),
    ("a condition appeared", n(), n(GPU), True, True, False),
    ("a condition went away", n(GPU), n(), True, True, False),
    ("labelled a spare", n(), n(labels={ROLE_LABEL: "spare"}), False, False, True),
    ("a spare relabelled, still a spare", n(labels={ROLE_LABEL: "spare"}),
     n(labels={ROLE_LABEL: "spare", "x": "y"}), False, False, False),
    ("no longer a spare", n(labels={ROLE_LABEL: "spare"}), n(), False, False, False),
    ("first seen as a spare: a new spare (issue 20 item 0: a spare created while a node is "
     "held for capacity wakes it)", None, n(labels={ROLE_LABEL: "spare"}), True, True, True),
    ("a spare turned Ready", n(NOT_READY, labels={ROLE_LABEL: "spare"}),
     n(READY, labels={ROLE_LABEL: "spare"}), True, True, True),
    ("a spare turned NotReady", n(READY, labels={ROLE_LABEL: "spare"}),
     n(NOT_READY, labels={ROLE_LABEL: "spare"}), True, True, False),
    ("a spare uncordoned", n(unschedulable=True, labels={ROLE_LABEL: "spare"}),
     n(labels={ROLE_LABEL: "spare"}), False, False, True),
    ("a spare released by its claim", n(labels={ROLE_LABEL: "spare"}, **{CLAIMED_BY: "i"}),
     n(labels={ROLE_LABEL: "spare"}), False, False, True),
    ("a spare that passed validation again", n(labels={ROLE_LABEL: "spare",
                                                       SPARE_FAILED_LABEL: "true"}),
     n(labels={ROLE_LABEL: "spare"}), False, False, True),
    ("a spare of a NodeSet's own selector", None, n(labels={"pool": "east-spares"}), True, True,
     True),
    ("first seen, NotReady, a spare", None, n(NOT_READY, labels={ROLE_LABEL: "spare"}), True,
     True, False),
]


@pytest.mark.parametrize(("old", "new", "refreshed", "changed", "spare"),
                         [c[1:] for c in CHANGES], ids=[c[0] for c in CHANGES])
def test_node_change(old: NodeView | None, new: NodeView, refreshed: bool, changed: bool,
                     spare: bool) -> None:
    ch = node_change(old, new, T0 + 60, is_spare=is_spare)
    assert ch.node == "n1"
    assert ch.view is new
    assert ch.conditions_refreshed is refreshed
    assert all(s.kind is SignalKind.CONDITION and s.node == "n1" for s in ch.signals)
    assert len(ch.signals) == (len(new.conditions) if refreshed else 0)
    assert ch.conditions_changed is changed
    assert ch.new_spare is spare
    assert ch.triggers == ()
    assert ch.admin_state is None


def test_deleted_node_carries_only_its_name() -> None:
    ch = node_change(n(GPU), None, T0, record=REC, is_spare=is_spare)
    assert (ch.node, ch.view, ch.signals, ch.triggers) == ("n1", None, (), ())


@pytest.mark.parametrize("phase", [Phase.DEAD, Phase.HELD_FOR_FENCING, Phase.OUT_OF_SERVICE,
                                   Phase.REPAIR])
def test_a_deleted_node_wakes_the_step_that_waits_on_it(phase: Phase) -> None:
    """The nodeDeleted fencing provider, on the next event (issue 20 item 0)."""
    rec = replace(REC, phase=phase, ledger=(open_step("clear-out-of-service"),))
    ch = node_change(n(GPU), None, T0 + 3, record=rec, is_spare=is_spare)
    assert [(t.kind, t.incident, t.at) for t in ch.triggers] == [
        (TriggerKind.NODE, INC, T0 + 3)]


@pytest.mark.parametrize(("what", "before", "after"), [
    ("readiness", n(READY), n(NOT_READY)),
    ("an admin's fenced annotation", n(NOT_READY), n(NOT_READY, **{FENCED_ANNOTATION: "me"})),
    ("the cloud's shutdown taint", n(NOT_READY), replace(n(NOT_READY), taints=(
        Taint(CLOUD_SHUTDOWN_TAINT, "", "NoSchedule"),))),
    ("the fencing webhook's ack", n(NOT_READY), n(NOT_READY, **{FENCE_ACK: INC})),
])
def test_what_a_waiting_step_reads_of_the_node_wakes_it(what: str, before: NodeView,
                                                        after: NodeView) -> None:
    rec = replace(REC, phase=Phase.DEAD)
    assert admin_state(before, rec) != admin_state(after, rec), what
    assert TriggerKind.NODE in {t.kind for t in node_change(before, after, T0,
                                                            record=rec).triggers}


def test_condition_signal_is_observed_at_its_heartbeat() -> None:
    (sig,) = node_change(None, n(BAD), T0 + 60).signals
    assert (sig.key, sig.value, sig.observed_at) == ("GPUHealthy", T0, T0)


# (case, phase, node, trigger kinds)
ADMIN = [
    ("cordoned by healer, still cordoned", Phase.CORDONED, n(unschedulable=True,
                                                             **cordoned(INC)), ()),
    ("uncordoned by an admin", Phase.CORDONED, n(**cordoned(INC)),
     (TriggerKind.ADMIN_UNCORDON,)),
    ("uncordoned, but another incident's cordon", Phase.CORDONED, n(**cordoned("inc-other")), ()),
    ("uncordoned, cordoned by someone else", Phase.CORDONED,
     n(**{INCIDENT_ANNOTATION: INC, CORDONED_BY: "admin"}), ()),
    ("uncordoned before healer's cordon", Phase.FAILED, n(**cordoned(INC)), ()),
    ("opted out", Phase.DRAINING, n(labels={EXCLUDE_LABEL: "True"}), (TriggerKind.OPT_OUT,)),
    ("exclude=false", Phase.DRAINING, n(labels={EXCLUDE_LABEL: "false"}), ()),
    ("repair passed", Phase.REPAIR, n(unschedulable=True, **{REPAIR_RESULT: "Passed"}),
     (TriggerKind.REPAIR,)),
    ("repair failed", Phase.REPAIR, n(unschedulable=True, **{REPAIR_RESULT: "failed"}),
     (TriggerKind.REPAIR,)),
    ("repair found no fault", Phase.REPAIR, n(unschedulable=True, **{REPAIR_RESULT: "No-Fault"}),
     (TriggerKind.REPAIR,)),
    ("repair result before repair", Phase.SWAPPING, n(**{REPAIR_RESULT: "passed"}), ()),
    ("repair result unknown word", Phase.REPAIR, n(**{REPAIR_RESULT: "maybe"}), ()),
    ("uncordoned and opted out", Phase.UNDRAINING,
     n(labels={EXCLUDE_LABEL: "true"}, **cordoned(INC)),
     (TriggerKind.ADMIN_UNCORDON, TriggerKind.OPT_OUT)),
]


@pytest.mark.parametrize(("phase", "view", "kinds"), [c[1:] for c in ADMIN],
                         ids=[c[0] for c in ADMIN])
def test_admin_triggers(phase: Phase, view: NodeView, kinds: tuple[TriggerKind, ...]) -> None:
    rec = replace(REC, phase=phase)
    got = admin_triggers(view, rec, T0 + 5)
    assert tuple(t.kind for t in got) == kinds
    assert all(t.node == "n1" and t.incident == INC and t.at == T0 + 5 for t in got)
    # node_change derives the same, with the state they came from
    ch = node_change(view, view, T0 + 5, record=rec)
    assert ch.triggers == got
    assert ch.admin_state == admin_state(view, rec)


def test_repair_trigger_says_whether_it_passed() -> None:
    rec = replace(REC, phase=Phase.REPAIR)
    (passed,) = admin_triggers(n(**{REPAIR_RESULT: "passed"}), rec, T0)
    (failed,) = admin_triggers(n(**{REPAIR_RESULT: "failed"}), rec, T0)
    (no_fault,) = admin_triggers(n(**{REPAIR_RESULT: "no-fault"}), rec, T0)
    assert passed.repair_passed is True
    assert failed.repair_passed is False
    assert no_fault.repair_passed is True  # the node goes back, as after passed
    assert (passed.repair_no_fault, failed.repair_no_fault, no_fault.repair_no_fault) == (
        False, False, True)


def test_admin_state_changes_with_what_it_reads() -> None:
    view = n(**cordoned(INC))
    base = admin_state(view, REC)
    assert admin_state(view, None) is None
    assert admin_state(n(**cordoned(INC)), REC) == base  # equal nodes, equal state
    assert admin_state(n(unschedulable=True, **cordoned(INC)), REC) != base
    assert admin_state(n(**cordoned(INC, **{REPAIR_RESULT: "passed"})), REC) != base
    assert admin_state(view, replace(REC, phase=Phase.REPAIR)) != base
    assert admin_state(n(GPU, **cordoned(INC)), REC) == base  # conditions are not read
