"""Why a node cannot take jobs: the causes healer counts (:data:`CAUSES`), Slurm's node state
read as one (:func:`slurm_cause`), and the one cause named for a node (:func:`unavailable_cause`).

The guardrails (:mod:`healer.core.budget`), the fleet index (:mod:`healer.core.capacity`), the
runtime's Slurm feed and the ``healer_unavailable_nodes`` metric all count with these.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from healer.core.model import NodeView, OpenRemediation
from healer.core.phases import Phase

#: Why a node counts as unavailable (the ``cause`` label of ``healer_unavailable_nodes``), in
#: the order one is named when several apply. Bounded: metrics label values.
CAUSES = ("healer", "cordoned", "not-ready", "slurm-down", "slurm-not-responding",
          "slurm-fail", "slurm-drain", "slurm-reboot", "slurm-power-down", "slurm-maintenance")


def slurm_cause(base: str, flags: AbstractSet[str]) -> str:
    """Why Slurm will not start jobs on a node in state ``base`` + ``flags`` ("" = it will).

    POWERED_DOWN alone is *not* a cause: Slurm's power saving powers such a node up for the
    next job that needs it. UNKNOWN alone (slurmctld just restarted, the node not yet heard
    from) is not one either; UNKNOWN + NOT_RESPONDING is."""
    base, flags = base.upper(), frozenset(f.upper() for f in flags)
    if base in ("DOWN", "ERROR", "FUTURE"):
        return "slurm-down"
    if "NOT_RESPONDING" in flags:
        return "slurm-not-responding"
    if flags & {"FAIL", "FAILING"}:
        return "slurm-fail"
    if "DRAIN" in flags and "UNDRAIN" not in flags:
        return "slurm-drain"
    if "REBOOT_ISSUED" in flags:
        return "slurm-reboot"
    if flags & {"POWER_DOWN", "POWERING_DOWN"}:
        return "slurm-power-down"
    if "MAINTENANCE" in flags:
        return "slurm-maintenance"
    return ""


def unavailable_cause(view: NodeView, rec: OpenRemediation | None, slurm: str = "") -> str:
    """Why ``view`` cannot take jobs ("" = it can): healer's hold first, then Kubernetes, then
    Slurm's ``slurm`` cause (:func:`slurm_cause`, as the runtime's feed last read it)."""
    if rec is not None and (rec.active or rec.out_of_service):
        return "healer"
    if view.unschedulable:
        return "cordoned"
    if not view.ready:
        return "not-ready"
    return slurm


def replaced(rec: OpenRemediation | None) -> bool:
    """A node a spare has replaced: out of the population (its spare is counted instead)."""
    return rec is not None and bool(rec.spare) and rec.phase is Phase.REPAIR


def claims_in_flight(rec: OpenRemediation) -> str:
    """The spare ``rec`` holds while it is not yet serving ("" if none): out of the population
    (the node it replaces is counted)."""
    return rec.spare if rec.spare and rec.phase is not Phase.REPAIR else ""
