"""kwok's Stages as the local stack writes them: every document parses, and the pod-gone
Stage skips the pods of a dead Node by the annotation the dead-node simulation puts on them."""

from __future__ import annotations

import yaml

from healer_dev.devstack.kwok import DEAD_NODE_POD, KWOK_STAGES


def _stages() -> dict[str, dict[str, object]]:
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(KWOK_STAGES)}


def test_every_stage_is_a_kwok_stage() -> None:
    stages = _stages()
    assert stages
    assert {d["kind"] for d in stages.values()} == {"Stage"}


def test_kwok_finishes_no_deletion_of_a_dead_nodes_pod() -> None:
    gone = _stages()["healer-pod-gone"]
    exprs = gone["spec"]["selector"]["matchExpressions"]  # type: ignore[index]
    assert {"key": f'.metadata.annotations["{DEAD_NODE_POD}"]',
            "operator": "DoesNotExist"} in exprs
