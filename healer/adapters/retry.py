"""The one retry policy of every adapter (tenacity underneath), and the backoff of endless loops.

:class:`RetryPolicy` retries :class:`~healer.errors.TransientError` only (a caller may narrow
that further, e.g. to connect errors for writes that must not be sent twice). Each attempt
after a failure waits:

* the error's ``delay`` when it has one (a server's ``Retry-After``): never sooner than the
  server asked. A ``Retry-After`` longer than the policy's ``cap``, or than what is left of its
  ``budget``, ends the retries at once: the error, still carrying its ``delay``, goes to the
  caller, whose own loop (a poll, a step's recheck) comes back later;
* otherwise ``first · 2^(n-1)`` plus a random jitter in ``[0, jitter]``, at most ``cap``.

Retries end after ``attempts`` attempts in all, or once ``budget`` seconds have passed since the
first attempt; the last error is re-raised as it was. Every retry is logged at debug.

Call sites choose a policy by name: :data:`KUBERNETES` (API server calls),
:data:`QUICK` (reads of a polled source or of Slurm: short waits, the next poll is near),
:data:`WEBHOOK` (other services healer calls: hooks, topograph); a site whose attempts are
configurable overrides them with :meth:`RetryPolicy.but`.

:class:`Backoff` is the doubling, capped wait of a loop that never gives up (the node watch):
reset after each success.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import structlog
from tenacity import AsyncRetrying, RetryCallState

from healer.adapters.clock import SYSTEM_CLOCK
from healer.errors import TransientError
from healer.ports import Clock

__all__ = ["KUBERNETES", "QUICK", "WEBHOOK", "Backoff", "RetryPolicy"]

T = TypeVar("T")

log = structlog.get_logger("healer.adapters.retry")


def _transient(e: BaseException) -> bool:
    return isinstance(e, TransientError)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently one kind of call is retried (see the module docstring)."""

    attempts: int
    """Attempts in all, the first included (1: never retried)."""
    first: float
    """The first wait, in seconds; it doubles with every further retry."""
    cap: float
    """The longest wait; a ``Retry-After`` above it ends the retries."""
    jitter: float = 0.0
    """Up to this many random seconds are added to every computed wait."""
    budget: float | None = None
    """Seconds from the first attempt after which no attempt starts (None: no such limit)."""

    def but(self, **changes: float | int | None) -> RetryPolicy:
        """This policy with some fields changed (``WEBHOOK.but(attempts=1)``)."""
        return replace(self, **changes)  # type: ignore[arg-type]

    def wait(self, attempt: int, error: BaseException | None) -> float:
        """The wait after failed attempt number ``attempt`` (1-based) that raised ``error``."""
        delay = error.delay if isinstance(error, TransientError) else None
        if delay is not None:
            return max(0.0, float(delay))
        try:
            backoff = self.first * 2.0 ** (attempt - 1)
        except OverflowError:
            backoff = self.cap
        return max(0.0, min(self.cap, backoff + random.uniform(0, self.jitter)))

    async def run(self, what: str, fn: Callable[[], Awaitable[T]], *,
                  retry_if: Callable[[BaseException], bool] = _transient,
                  clock: Clock = SYSTEM_CLOCK) -> T:
        """``await fn()``, retried on a TransientError for which ``retry_if`` holds (every
        TransientError by default; the predicate can only narrow that)."""
        start = clock.now()

        def error_of(state: RetryCallState) -> BaseException | None:
            return state.outcome.exception() if state.outcome is not None else None

        def retryable(state: RetryCallState) -> bool:
            e = error_of(state)
            return isinstance(e, TransientError) and retry_if(e)

        def stop(state: RetryCallState) -> bool:
            if state.attempt_number >= self.attempts:
                return True
            elapsed = clock.now() - start
            if self.budget is not None and elapsed >= self.budget:
                return True
            delay = getattr(error_of(state), "delay", None)
            return delay is not None and (delay > self.cap or (
                self.budget is not None and elapsed + delay > self.budget))

        def wait(state: RetryCallState) -> float:
            return self.wait(state.attempt_number, error_of(state))

        def before_sleep(state: RetryCallState) -> None:
            log.debug("retrying", what=what, attempt=state.attempt_number,
                      wait=round(state.upcoming_sleep, 3), error=repr(error_of(state)))

        retrying = AsyncRetrying(stop=stop, wait=wait, retry=retryable, reraise=True,
                                 sleep=clock.sleep, before_sleep=before_sleep)
        return await retrying(fn)


#: Kubernetes API calls: 4 attempts, 0.2 s doubling to at most 5 s, up to 0.2 s of jitter.
KUBERNETES = RetryPolicy(attempts=4, first=0.2, cap=5.0, jitter=0.2)
#: Reads of a polled source or of Slurm: short waits (0.1 s doubling to at most 1 s).
QUICK = RetryPolicy(attempts=3, first=0.1, cap=1.0, jitter=0.1)
#: Services healer calls out to (webhooks, topograph): 3 attempts, 0.5 s doubling to 5 s.
WEBHOOK = RetryPolicy(attempts=3, first=0.5, cap=5.0, jitter=0.5)


class Backoff:
    """The wait of a loop that retries for ever: ``first``, doubling to at most ``cap``;
    :meth:`reset` after a success starts again from ``first``."""

    def __init__(self, first: float = 0.2, cap: float = 5.0, *,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.first = first
        self.cap = cap
        self.next = first
        self._clock = clock

    def reset(self) -> None:
        self.next = self.first

    async def sleep(self) -> None:
        """Wait the current delay, then double it (up to the cap)."""
        delay, self.next = self.next, min(self.next * 2, self.cap)
        await self._clock.sleep(delay)
