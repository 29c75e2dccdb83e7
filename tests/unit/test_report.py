"""healer.report: what the report says about a fleet (text and JSON), its coverage sentence
(retention), and each node's GPU count read from a Node object. The API reads are tested
against the real API server in tests/integration/daemon/test_report.py."""

from __future__ import annotations

import json

import pytest

from healer.core.outcomes import FleetOutcomes, summarize
from healer.report import RETENTION, as_json, as_text, coverage, gpus_of_node, span
from tests.unit.test_outcomes import ESCALATED, RECOVERED_EARLY, REPLACED, T0, at

NOW = T0 + 5000
WEEK = 7 * 86400.0


def fleet() -> FleetOutcomes:
    recs = [at(REPLACED, 0, "n1", ("A",)), at(RECOVERED_EARLY, 1000, "n1", ("A",)),
            at(ESCALATED, 3000, "n3", ("C",)), at(REPLACED, -40 * 86400, "n3", ("C",))]
    return summarize(recs, NOW, NOW - WEEK, lambda n: 4)


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0.04, "0.0s"), (0.4, "0.4s"), (9.96, "10.0s"), (45, "45s"),
    (750, "12m30s"), (11100, "3h5m"), (4 * 86400 + 7200 + 61, "4d2h")])
def test_span(seconds: float | None, text: str) -> None:
    assert span(seconds) == text


def test_text_report_names_the_figures() -> None:
    text = as_text(fleet(), WEEK, ())
    assert text.startswith("healer report: incidents opened since ")
    assert "(7d)" in text
    assert "incidents 3 (finished 3, open 0): replaced 1, repaired 0, recovered 1, " \
           "escalated 1, cancelled 0" in text
    assert "false-positive rate 33.3% (1 of 3 finished found nothing: recovered-before-" \
           "disruption 1, recovered-after-drain 0, repair-found-no-fault 0)" in text
    # 609 s (replaced) + 299 s (escalated) out of service, 4 GPUs each
    assert f"capacity lost {4 * 908 / 3600:.1f} GPU-hours" in text
    assert "time to replacement (spare)" in text
    assert "repeat nodes: n1 (2 incidents, shortest gap 16m40s), n3 (2 incidents" in text
    assert "OUT+: still out of service" in text  # the escalated node
    assert "4 record(s) read" in text


def test_json_report_is_stable_and_complete() -> None:
    a, b = as_json(fleet(), WEEK, ("n3", "n1")), as_json(fleet(), WEEK, ("n1", "n3"))
    assert a == b
    d = json.loads(a)
    assert d["window"]["nodes"] == ["n1", "n3"]
    assert d["window"]["retentionSeconds"] == RETENTION
    assert d["incidents"] == 3
    assert d["falsePositiveRate"] == 0.3333
    assert d["timeToReplacementSeconds"] == {"count": 1, "p50": 610.0, "p90": 610.0,
                                             "p99": 610.0, "max": 610.0}
    assert [i["closing"] for i in d["perIncident"]] == ["replaced", "recovered", "escalated"]


def test_coverage_says_when_retention_may_have_pruned_the_window() -> None:
    f = fleet()
    assert "no incident of the window was pruned" in coverage(f, WEEK, retention=30 * 86400)
    sentence = coverage(f, 60 * 86400, retention=30 * 86400)
    assert "longer than the daemon's retention (30d)" in sentence
    assert "may have been pruned and are missing" in sentence


@pytest.mark.parametrize(("node", "gpus"), [
    ({"status": {"capacity": {"nvidia.com/gpu": "8"}}}, 8),
    ({"metadata": {"labels": {"nvidia.com/gpu.count": "4"}}}, 4),
    ({"status": {"capacity": {"nvidia.com/gpu": "0"}},
      "metadata": {"labels": {"nvidia.com/gpu.count": "2"}}}, 2),
    ({"status": {"capacity": {"cpu": "64"}}}, None),
    ({"status": {"capacity": {"nvidia.com/gpu": "lots"}}}, None),
    ({}, None)])
def test_gpus_of_node(node: dict[str, object], gpus: int | None) -> None:
    assert gpus_of_node(node) == gpus
