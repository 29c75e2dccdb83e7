"""The telemetry group's per-poll figure and the worker's garbage-collector clock."""

from __future__ import annotations

import gc

import pytest

from healer_dev.bench.telemetry import per_poll
from healer_dev.bench.telemetry_worker import GcClock


@pytest.mark.parametrize(("cpu", "expected"), [
    ([9.0, 1.0, 2.0, 3.0], 2.0),      # the first poll (the XID lookback) is left out
    ([9.0, 0.1, 0.1, 0.1, 1.3], 0.4),  # a full collection in one poll is spread, not dropped
    ([5.0], 5.0),                      # one poll: that poll
])
def test_per_poll_is_the_mean_after_the_first(cpu: list[float], expected: float) -> None:
    assert per_poll(cpu) == pytest.approx(expected)


def test_the_gc_clock_counts_a_collection() -> None:
    clock = GcClock()
    try:
        assert clock.spent == 0.0
        cycles: list[list[object]] = [[] for _ in range(50_000)]
        for c in cycles:
            c.append(c)
        del cycles
        gc.collect()
        assert clock.spent > 0.0
    finally:
        clock.close()


def test_a_window_counts_its_cpu_and_the_collectors_part() -> None:
    clock = GcClock()
    try:
        with clock.window():
            cycles: list[list[object]] = [[] for _ in range(50_000)]
            for c in cycles:
                c.append(c)
            del cycles
            gc.collect()
        gc.collect()  # outside any window: not counted
        cpu, collector = clock.take()
        assert 0.0 < collector <= cpu
        assert clock.take() == (0.0, 0.0)
    finally:
        clock.close()
