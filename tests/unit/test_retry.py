"""The one retry policy (healer.adapters.retry), on a recording clock: nothing really sleeps."""

from __future__ import annotations

import pytest
import structlog.testing

from healer.adapters.retry import KUBERNETES, QUICK, WEBHOOK, Backoff, RetryPolicy
from healer.errors import ConflictError, NotFoundError, PermanentError, TransientError


class StepClock:
    """A clock whose sleep returns at once, moving time on by what was asked."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


class Script:
    """Raises the scripted errors in turn, then answers ``"ok"``; counts the calls."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


async def test_transient_errors_are_retried_until_success() -> None:
    clock = StepClock()
    fn = Script(TransientError("a"), TransientError("b"))
    policy = RetryPolicy(attempts=3, first=0.5, cap=5.0)
    assert await policy.run("op", fn, clock=clock) == "ok"
    assert fn.calls == 3
    assert clock.slept == [0.5, 1.0]  # exponential, no jitter asked for


async def test_retry_after_is_the_wait() -> None:
    clock = StepClock()
    fn = Script(TransientError("429", delay=3.0), TransientError("503"))
    policy = RetryPolicy(attempts=3, first=0.1, cap=5.0)
    assert await policy.run("op", fn, clock=clock) == "ok"
    assert clock.slept == [3.0, 0.2]  # the server's Retry-After, then the backoff again


async def test_a_retry_after_beyond_the_cap_or_budget_goes_to_the_caller() -> None:
    clock = StepClock()
    fn = Script(TransientError("429", delay=7.0))
    with pytest.raises(TransientError) as e:
        await RetryPolicy(attempts=3, first=0.1, cap=1.0).run("op", fn, clock=clock)
    assert e.value.delay == 7.0
    assert fn.calls == 1
    assert clock.slept == []
    fn = Script(TransientError("429", delay=2.0))
    with pytest.raises(TransientError):
        await RetryPolicy(attempts=3, first=0.1, cap=5.0, budget=1.5).run("op", fn, clock=clock)
    assert fn.calls == 1
    assert clock.slept == []


@pytest.mark.parametrize("error", [PermanentError("422"), NotFoundError("gone"),
                                   ValueError("a bug")])
async def test_anything_but_a_transient_error_is_not_retried(error: Exception) -> None:
    clock = StepClock()
    fn = Script(error)
    with pytest.raises(type(error)):
        await KUBERNETES.run("op", fn, clock=clock)
    assert fn.calls == 1
    assert clock.slept == []


async def test_retry_if_narrows_the_retried_errors() -> None:
    clock = StepClock()
    fn = Script(ConflictError("409"))
    with pytest.raises(ConflictError):
        await KUBERNETES.run("op", fn, clock=clock,
                             retry_if=lambda e: not isinstance(e, ConflictError))
    assert fn.calls == 1


async def test_waits_never_exceed_the_cap() -> None:
    clock = StepClock()
    fn = Script(*[TransientError(str(i)) for i in range(9)])
    policy = RetryPolicy(attempts=10, first=1.0, cap=5.0, jitter=0.5)
    assert await policy.run("op", fn, clock=clock) == "ok"
    assert len(clock.slept) == 9
    assert all(0.0 <= w <= 5.0 for w in clock.slept)
    assert clock.slept[4:] == [5.0] * 5  # 16 s and more are capped
    assert 1.0 <= clock.slept[0] <= 1.5  # jitter adds at most its bound


async def test_exhausted_attempts_reraise_the_last_error() -> None:
    clock = StepClock()
    first, last = TransientError("first"), TransientError("last")
    fn = Script(first, TransientError("middle"), last, TransientError("never reached"))
    with pytest.raises(TransientError) as e:
        await RetryPolicy(attempts=3, first=0.1, cap=1.0).run("op", fn, clock=clock)
    assert e.value is last
    assert fn.calls == 3
    assert len(clock.slept) == 2


async def test_the_budget_stops_further_attempts() -> None:
    clock = StepClock()
    fn = Script(*[TransientError(str(i)) for i in range(9)])
    with pytest.raises(TransientError):
        await RetryPolicy(attempts=10, first=1.0, cap=1.0, budget=2.5).run("op", fn,
                                                                             clock=clock)
    assert fn.calls == 4  # attempts at 0, 1, 2, 3 s; the budget is spent after the fourth


def test_presets_and_overrides() -> None:
    assert (KUBERNETES.attempts, KUBERNETES.cap) == (4, 5.0)
    assert QUICK.cap == 1.0
    assert WEBHOOK.first == 0.5
    once = WEBHOOK.but(attempts=1)
    assert once.attempts == 1
    assert once.cap == WEBHOOK.cap
    assert WEBHOOK.attempts == 3


async def test_backoff_doubles_to_its_cap_and_resets() -> None:
    clock = StepClock()
    b = Backoff(0.2, 1.0, clock=clock)
    for _ in range(5):
        await b.sleep()
    b.reset()
    await b.sleep()
    assert clock.slept == [0.2, 0.4, 0.8, 1.0, 1.0, 0.2]


async def test_each_retry_is_logged_at_debug() -> None:
    clock = StepClock()
    fn = Script(TransientError("503"))
    with structlog.testing.capture_logs() as logs:
        assert await RetryPolicy(attempts=2, first=0.25, cap=1.0).run("GET nodes", fn,
                                                                      clock=clock) == "ok"
    (line,) = [e for e in logs if e["event"] == "retrying"]
    assert line["log_level"] == "debug"
    assert (line["what"], line["attempt"], line["wait"]) == ("GET nodes", 1, 0.25)
