"""Every shipped scenario replays through the real engine and meets its expectations."""

from __future__ import annotations

from pathlib import Path

import pytest

from healer.core.phases import Phase
from healer.sim.scenario import build, check_expectations, load_scenario

SCENARIOS = sorted(p for p in (Path(__file__).resolve().parents[2] / "scenarios").glob("*.yaml")
                   if not p.name.endswith("-policy.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    sc, ps = load_scenario(path)
    replay, world = build(sc, ps)
    replay.run(sc.start.timestamp() + sc.until)
    assert check_expectations(sc, replay, world) == []
    assert sc.expect, "a scenario must say what it expects"
    assert all(n <= 1 for n in world.effects.swaps.values())


def test_replay_is_deterministic() -> None:
    path = SCENARIOS[0]
    texts = []
    for _ in range(2):
        sc, ps = load_scenario(path)
        replay, _ = build(sc, ps)
        replay.run(sc.start.timestamp() + sc.until)
        texts.append([(e.at, e.node, e.text) for e in replay.timeline])
    assert texts[0] == texts[1]


def test_job_is_never_moved_while_busy() -> None:
    """In the demo the job on the bad node runs 20 minutes: the swap waits for it."""
    sc, ps = load_scenario(Path(SCENARIOS[0]).parent / "xid79-warm-spare.yaml")
    replay, _world = build(sc, ps)
    replay.run(sc.start.timestamp() + sc.until)
    rec = next(r for r in replay.all_records() if r.node == "gpu-2")
    move = rec.step("move-workload")
    assert move is not None
    job_end = sc.start.timestamp() + 20 * 60
    assert move.started_at >= job_end
    assert rec.phase is Phase.DONE
