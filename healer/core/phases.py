"""The phases of a remediation and the groups of phases the guardrails reason about."""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    HEALTHY = "Healthy"
    SUSPECT = "Suspect"
    DEGRADING = "Degrading"
    FAILED = "Failed"
    CHECKPOINTING = "Checkpointing"
    DRAINING = "Draining"
    CORDONED = "Cordoned"
    SWAPPING = "Swapping"
    ANNOTATING = "Annotating"
    VALIDATING = "Validating"
    UNDRAINING = "Undraining"
    REPAIR = "Repair"
    RECOVERED = "Recovered"
    HELD_FOR_CAPACITY = "HeldForCapacity"
    DEAD = "Dead"
    HELD_FOR_FENCING = "HeldForFencing"
    OUT_OF_SERVICE = "OutOfService"
    DONE = "Done"
    ESCALATED = "Escalated"
    CANCELLED = "Cancelled"

    @classmethod
    def parse(cls, text: str) -> Phase:
        return cls(text)


#: Confirmed but not yet admitted: waiting for the guardrails (or observe-only). A dead node
#: waits in Dead, and stays there (fencing) once admitted.
PENDING_ADMISSION = frozenset({Phase.DEGRADING, Phase.FAILED, Phase.DEAD})

#: Admitted remediations in flight: these count against ``maxConcurrent`` (and a Dead one
#: once its fencing started: :func:`healer.core.machine.counts_as_active`).
ACTIVE = frozenset({
    Phase.CHECKPOINTING, Phase.DRAINING, Phase.CORDONED, Phase.SWAPPING, Phase.ANNOTATING,
    Phase.VALIDATING, Phase.UNDRAINING, Phase.HELD_FOR_CAPACITY, Phase.HELD_FOR_FENCING,
    Phase.OUT_OF_SERVICE,
})

#: A dead node's own phases: waiting for a fence, held for one, taken out of service.
DEAD_PHASES = frozenset({Phase.DEAD, Phase.HELD_FOR_FENCING, Phase.OUT_OF_SERVICE})

#: No further transitions (the record is closed; open ledger steps may still be re-issued).
TERMINAL = frozenset({Phase.DONE, Phase.ESCALATED, Phase.CANCELLED})

#: Phases in which healer may have cordoned the node (an admin uncordon then cancels).
MAY_BE_CORDONED = frozenset({
    Phase.DRAINING, Phase.CORDONED, Phase.HELD_FOR_CAPACITY, Phase.SWAPPING, Phase.ANNOTATING,
    Phase.VALIDATING, Phase.UNDRAINING, Phase.REPAIR, Phase.OUT_OF_SERVICE,
})
