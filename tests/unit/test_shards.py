"""The sharding simulation behind docs/scaling.md: splitting count limits statically between
shards over-admits once a limit is below the number of shards (why the plan keeps fleet-wide
limits in one shared budget), and a percentage limit splits without loss."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from healer.core.rules import PolicySet, Quantity
from healer_dev.bench.policies import load_default
from healer_dev.sim.shards import default_guardrails, shard_of, simulate, split, trace


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    with tempfile.TemporaryDirectory() as d:
        return default_guardrails(load_default(Path(d), permissive=False))


def test_split_scales_counts_and_keeps_percentages(policies: PolicySet) -> None:
    quarter = split(policies, 0.25)
    assert quarter.fleet.guardrails.max_concurrent == 5  # 20 / 4
    assert quarter.fleet.guardrails.max_unavailable == Quantity(2, percent=True)
    fatal = quarter.get("gpu-fatal")
    assert fatal is not None
    assert fatal.guardrails.max_concurrent == 1  # max(1, floor(2 / 4)): more than its share


def test_a_domain_always_lands_in_the_same_shard() -> None:
    assert shard_of("nvl-00042", 16) == shard_of("nvl-00042", 16)
    assert len({shard_of(f"nvl-{d:05d}", 4) for d in range(64)}) == 4


def test_one_leader_keeps_the_limit_and_a_static_split_breaks_it(policies: PolicySet) -> None:
    faults = trace(800, seed=3)
    one = simulate(policies, 800, 1, faults)
    assert one.faults == len(faults)
    assert one.replaced > 0
    assert one.peak_active <= 2  # gpu-fatal's maxConcurrent
    assert one.peak_out <= one.limit
    four = simulate(policies, 800, 4, faults)
    assert four.peak_active > 2  # each shard rounds its share of 2 up to 1
