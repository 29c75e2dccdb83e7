"""Call timing: every adapter call is observed with a low-cardinality operation."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from healer.adapters import calls
from healer.adapters.slurm.slurmrestd import _endpoint
from healer.errors import NotFoundError


@pytest.fixture
def seen() -> Iterator[list[tuple[str, str, float, str | None]]]:
    out: list[tuple[str, str, float, str | None]] = []
    calls.set_observer(lambda *a: out.append(a))
    yield out
    calls.set_observer(None)


def test_a_call_is_timed(seen: list[tuple[str, str, float, str | None]]) -> None:
    with calls.timed("kubernetes", "get"):
        pass
    assert len(seen) == 1
    system, op, seconds, error = seen[0]
    assert (system, op, error) == ("kubernetes", "get", None)
    assert seconds >= 0


def test_a_failed_call_records_its_error_class_and_still_raises(
        seen: list[tuple[str, str, float, str | None]]) -> None:
    with pytest.raises(NotFoundError), calls.timed("slurm", "scontrol show"):
        raise NotFoundError("no such node")
    assert seen[0][1:] == ("scontrol show", seen[0][2], "NotFoundError")


def test_without_an_observer_nothing_happens() -> None:
    calls.set_observer(None)
    with calls.timed("prometheus", "query"):
        pass


@pytest.mark.parametrize(("path", "endpoint"), [
    ("/slurm/v0.0.40/node/gpu-2", "node"),
    ("/slurm/v0.0.44/nodes", "nodes"),
    ("/slurm/v0.0.41/job/1234", "job"),
    ("/openapi/v3", "v3"),
    ("/", "/"),
])
def test_slurmrestd_operations_never_carry_names(path: str, endpoint: str) -> None:
    assert _endpoint(path) == endpoint


def test_metrics_start_error_counters_at_zero_and_count_failures() -> None:
    from healer.obs.metrics import ERROR_KINDS, Metrics

    m = Metrics()
    m.observe_call("kubernetes", "get", 0.01)
    m.observe_call("kubernetes", "get", 0.02, "NotFoundError")
    value = m.registry.get_sample_value
    assert value("healer_api_call_duration_seconds_count",
                 {"system": "kubernetes", "operation": "get"}) == 2
    for kind in ERROR_KINDS:
        want = 1.0 if kind == "NotFoundError" else 0.0
        assert value("healer_api_call_errors_total",
                     {"system": "kubernetes", "operation": "get", "kind": kind}) == want
