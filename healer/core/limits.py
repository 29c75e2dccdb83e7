"""Guardrails as a policy, a NodeSet or the fleet sets them, compiled: how many nodes may be
out at once (a count or a percentage), per failure domain, the breaker and the retry budgets.
Pure data; :mod:`healer.core.budget` checks them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Quantity:
    """A count or a percentage of a population."""

    value: float
    percent: bool = False

    def of(self, population: int) -> int:
        if not self.percent:
            return int(self.value)
        # a percentage rounds down but never below one node unless it is 0%
        n = int(population * self.value / 100.0)
        return max(n, 1) if self.value > 0 and population > 0 else n

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.percent else f"{int(self.value)}"


@dataclass(frozen=True, slots=True)
class Breaker:
    window: float = 600.0
    threshold: Quantity = Quantity(5)
    cooldown: float = 1800.0


@dataclass(frozen=True, slots=True)
class FailureDomain:
    key: str
    max_unavailable: int = 1


@dataclass(frozen=True, slots=True)
class RetryBudget:
    per_node: int = 3
    per_gpu_serial: int = 2
    window: float = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class Guardrails:
    max_concurrent: int | None = None
    max_unavailable: Quantity | None = None
    failure_domains: tuple[FailureDomain, ...] = ()
    breaker: Breaker | None = None
    retry_budget: RetryBudget | None = None
