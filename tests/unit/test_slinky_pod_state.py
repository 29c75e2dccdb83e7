"""Slurm's view of a node as the slurm-operator mirrors it into its slurmd pod's conditions
(:func:`healer.adapters.slinky.pod_state`). The operator (v1.0, v1.1) writes one condition per
base state and per flag, and every one carries the Slurm node's reason as its message (its
``nodeState`` helper sets each condition's message to the node's reason). The real stack cannot
hold an admin's DOWN on a live node long enough for the operator to mirror it (the local Slurm
runs ``ReturnToService=2``: slurmctld's ping clears it in about 7 s), so this table is where
the DOWN reason is checked."""

from __future__ import annotations

from typing import Any

import pytest

from healer.adapters.slinky import foreign_reason, pod_state


def pod(*conditions: str, reason: str = "") -> dict[str, Any]:
    return {"metadata": {"name": "gpu-0", "labels": {}},
            "status": {"conditions": [
                {"type": "Ready", "status": "True"},
                *({"type": f"SlurmNodeState{c}", "status": "True", "message": reason}
                  for c in conditions)]}}


@pytest.mark.parametrize(("conditions", "reason", "base", "flags", "read", "foreign"), [
    (("Idle",), "", "IDLE", set(), "", ""),
    # a reason left on a node that is neither drained nor down means nothing
    (("Idle",), "old note", "IDLE", set(), "", ""),
    (("Idle", "Drain"), "maint: bios", "IDLE", {"DRAIN"}, "maint: bios", "maint: bios"),
    (("Allocated", "Drain"), "maint: bios", "ALLOCATED", {"DRAIN"}, "maint: bios",
     "maint: bios"),
    # an admin's DOWN: the reason is on the Down condition (there is no Drain one)
    (("Down",), "admin: PSU swap", "DOWN", set(), "admin: PSU swap", "admin: PSU swap"),
    (("Down", "Drain"), "admin: PSU swap", "DOWN", {"DRAIN"}, "admin: PSU swap",
     "admin: PSU swap"),
    # Slurm's own DOWN of a silent slurmd is nobody's
    (("Down", "NotResponding"), "Not responding", "DOWN", {"NOT_RESPONDING"},
     "Not responding", ""),
    # healer's drain as the operator carries it is healer's
    (("Idle", "Drain"), "slurm-operator: healer: XID 79 [inc-a]", "IDLE", {"DRAIN"},
     "healer: XID 79 [inc-a]", ""),
    # the operator's own drain for a cordon
    (("Idle", "Drain"), "slurm-operator: Node (gpu-0) was cordoned, Pod must be cordoned",
     "IDLE", {"DRAIN"}, "slurm-operator: Node (gpu-0) was cordoned, Pod must be cordoned",
     ""),
])
def test_pod_state_reads_the_reason_of_a_drain_or_a_down(
        conditions: tuple[str, ...], reason: str, base: str, flags: set[str], read: str,
        foreign: str) -> None:
    st = pod_state(pod(*conditions, reason=reason))
    assert (st.base, set(st.flags), st.reason) == (base, flags, read)
    assert foreign_reason(st) == foreign


def test_a_pod_without_slurm_conditions_is_not_registered() -> None:
    st = pod_state({"metadata": {"name": "gpu-0"}, "status": {"conditions": [
        {"type": "Ready", "status": "True"}]}})
    assert (st.base, st.registered) == ("UNKNOWN", False)
