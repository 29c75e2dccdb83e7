"""One case of the table-driven state-machine tests (``test_transitions``): a record, a
trigger, and what must come out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from healer.core.budget import BudgetView
from healer.core.machine import Trigger
from healer.core.model import NodeRecord
from healer.core.phases import Phase
from tests.builders import policies, policy, view


@dataclass
class Case:
    id: str
    record: NodeRecord | None
    trigger: Trigger
    phase: Phase
    steps: tuple[str, ...] = ()  # ledgered actions issued, by ledger name, in order
    events: tuple[str, ...] = ()  # event reasons that must be among the actions
    view: BudgetView | None = None
    now: float | None = None
    check: Any = None  # optional extra check(decision)
    extra: dict[str, Any] = field(default_factory=dict)


def policy_view(**kw: Any) -> BudgetView:
    """A view whose one policy is built with ``kw``."""
    return view(policies(policy(**kw)))
