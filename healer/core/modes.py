"""The policy mode: how far a remediation may go (kept apart so the model can type its records)."""

from __future__ import annotations

import enum


class Mode(enum.Enum):
    """How far a policy may go. The safety ladder is observe → dryRun → act."""

    OBSERVE = "observe"  # detect and report incidents; never plan or take a step
    DRY_RUN = "dryRun"  # run the whole flow, record every step as intent, change nothing
    ACT = "act"  # remediate

    @property
    def rank(self) -> int:
        return {"observe": 0, "dryRun": 1, "act": 2}[self.value]
