"""The per-node freshness answer and the per-GPU follow-up rows (PrometheusSource)."""

from __future__ import annotations

import json
import re
from typing import Any

from healer.adapters.prometheus import PrometheusSource
from healer.adapters.prometheus.promql import FRESH_MARK, JOB_LABEL
from healer.core.model import GpuRef, Severity, Signal, SignalKind
from healer.core.rules import LabelSelector as Sel
from healer.core.rules import MetricRule, Op, Policy, PolicySet

T = 1_700_000_000.0
TEMP = "DCGM_FI_DEV_GPU_TEMP"


def body(result: list[Any]) -> bytes:
    return json.dumps({"status": "success",
                       "data": {"resultType": "vector", "result": result}}).encode()


def node_labels(node: str) -> dict[str, str]:
    return {"Hostname": node, "instance": f"{node}:9400"}


def gpu_labels(node: str, gpu: int) -> dict[str, str]:
    return {**node_labels(node), "gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}"}


def ref(node: str, gpu: int) -> GpuRef:
    return GpuRef(gpu, f"GPU-{node}-{gpu}")


class Fleet:
    """A source fed the per-node answer and, in the follow-up, the per-GPU rows asked for."""

    def __init__(self, nodes: dict[str, int], forget_after: float = 1e9,
                 rule: MetricRule | None = None) -> None:
        rules = (rule or MetricRule("hot", Severity.DEGRADING, TEMP, Op.GE, 90.0),)
        self.src = PrometheusSource("http://127.0.0.1:1", PolicySet((Policy("p", Sel(), rules),)),
                                    stale_after=60, forget_after=forget_after)
        self.gpus = {n: list(range(k)) for n, k in nodes.items()}  # node → GPU indices up
        self.ages: dict[tuple[str, int], float] = {}  # (node, GPU) → heartbeat age (1)
        self.jobs: dict[tuple[str, int], str] = {}
        self.hot: dict[tuple[str, int], float] = {}  # violating metric values
        self.now = T
        self.round1: list[Signal] = []
        self.round2: list[Signal] = []
        self.fetched: set[str] = set()  # nodes whose per-GPU rows the follow-up asked for

    def ts(self, node: str, g: int) -> float:
        return self.now - self.ages.get((node, g), 1.0)

    def summary(self) -> bytes:
        rows: list[Any] = []
        for node, gpus in self.gpus.items():
            if not gpus:
                continue
            newest = max(self.ts(node, g) for g in gpus)
            rows.append({"metric": {**node_labels(node), FRESH_MARK: "newest"},
                         "value": [self.now, str(newest)]})
            n = sum(1 for g in gpus if self.now - self.ts(node, g) <= 60)
            if n:
                rows.append({"metric": {**node_labels(node), FRESH_MARK: "gpus"},
                             "value": [self.now, str(n)]})
        return body(rows)

    def per_gpu(self, hosts: set[str]) -> bytes:
        rows = []
        for node in sorted(hosts & self.gpus.keys()):
            for g in self.gpus[node]:
                lb = gpu_labels(node, g)
                if (node, g) in self.jobs:
                    lb[JOB_LABEL] = self.jobs[(node, g)]
                rows.append({"metric": lb, "value": [self.now, str(self.ts(node, g))]})
        return body(rows)

    def poll(self) -> list[Signal]:
        self.now += 15
        exprs = self.src.poll_queries(self.now)
        (metric,) = self.src.plan.metrics
        hot = body([{"metric": gpu_labels(n, g), "value": [self.now, str(v)]}
                    for (n, g), v in self.hot.items()])
        self.round1 = self.src.parse_poll(self.now, {exprs[0]: self.summary(),
                                                     metric.expr: hot})
        self.round2 = []
        self.fetched = set()
        follow = self.src.follow_up_queries(self.now)
        if follow:
            answers: dict[str, bytes] = {}
            for e in follow:
                m = re.search(r'Hostname=~"([^"]*)"', e)
                hosts = set(m.group(1).replace("\\", "").split("|")) if m else set()
                if "timestamp(" in e:
                    self.fetched |= hosts
                    answers[e] = self.per_gpu(hosts)
                else:
                    answers[e] = body([])
            self.round2 = self.src.parse_poll(self.now, answers)
        return self.round1 + self.round2

    def close(self) -> None:
        self.src.close()


def kinds(sigs: list[Signal], kind: SignalKind = SignalKind.FRESH) -> list[str]:
    return sorted(s.node for s in sigs if s.kind is kind)


def test_new_nodes_are_fetched_once_then_judged_from_two_rows_each() -> None:
    f = Fleet({"a": 2, "b": 2})
    try:
        f.poll()
        assert f.round1 == []  # both new: their FRESH waits for their per-GPU rows
        assert f.fetched == {"a", "b"}
        assert kinds(f.round2) == ["a", "b"]
        assert f.src.last_poll is not None
        assert f.src.last_poll.fresh_nodes == 2
        f.poll()
        assert kinds(f.round1) == ["a", "b"]  # nothing changed: no follow-up at all
        assert f.src.follow_up_queries(f.now) == []
        assert f.fetched == set()
    finally:
        f.close()


def test_a_missing_gpu_is_named_and_only_its_node_is_fetched() -> None:
    f = Fleet({"a": 2, "b": 2, "c": 2})
    try:
        f.poll()
        f.poll()
        f.gpus["b"] = [0]
        sigs = f.poll()
        assert kinds(f.round1) == ["a", "c"]
        assert f.fetched == {"b"}
        stale = [s for s in sigs if s.kind is SignalKind.STALE]
        assert [(s.node, s.gpu, s.get("reason")) for s in stale] == [
            ("b", ref("b", 1), "gpu-missing")]
        f.poll()  # still missing: fetched again, still named
        assert f.fetched == {"b"}
        assert [(s.node, s.gpu) for s in f.round2 if s.kind is SignalKind.STALE] == [
            ("b", ref("b", 1))]
        f.gpus["b"] = [0, 1]
        f.poll()  # back: judged from its rows once (it was stale), then from two rows
        assert kinds(f.round2) == ["b"]
        f.poll()
        assert kinds(f.round1) == ["a", "b", "c"]
        assert f.fetched == set()
    finally:
        f.close()


def test_an_old_gpu_heartbeat_and_an_old_node() -> None:
    f = Fleet({"a": 2, "b": 2})
    try:
        f.poll()
        f.ages[("a", 1)] = 100.0  # one GPU's series old: fewer fresh GPUs than known
        f.poll()
        assert [(s.node, s.gpu, s.get("reason")) for s in f.round2
                if s.kind is SignalKind.STALE] == [("a", ref("a", 1), "series-old")]
        f.ages[("b", 0)] = f.ages[("b", 1)] = 100.0  # the whole node: judged from its rows
        f.poll()
        assert [(s.node, s.gpu, s.get("reason")) for s in f.round1
                if s.kind is SignalKind.STALE and s.node == "b"] == [("b", None, "series-old")]
        assert "b" not in f.fetched
    finally:
        f.close()


def test_vanished_node_is_series_missing_and_forgotten() -> None:
    f = Fleet({"a": 2, "b": 2}, forget_after=100)
    try:
        f.poll()
        f.gpus["b"] = []
        f.poll()
        assert [(s.node, s.get("reason")) for s in f.round1 if s.kind is SignalKind.STALE] == [
            ("b", "series-missing")]
        for _ in range(8):
            f.poll()
        assert f.src.freshness.nodes == ["a"]
    finally:
        f.close()


def test_metric_signals_wait_for_their_nodes_rows_gpu_stamp_and_jobs() -> None:
    f = Fleet({"a": 2, "b": 2})
    try:
        f.poll()
        f.poll()
        f.hot[("a", 1)] = 95.0
        f.jobs[("a", 1)] = "4242"
        f.ages[("a", 1)] = 3.0
        f.poll()
        assert [s for s in f.round1 if s.kind is SignalKind.METRIC] == []
        assert f.fetched == {"a"}
        (m,) = [s for s in f.round2 if s.kind is SignalKind.METRIC]
        assert (m.node, m.gpu, m.value) == ("a", ref("a", 1), 95.0)
        assert m.observed_at == f.now - 3.0  # its GPU's scrape time, not the node's newest
        assert m.get(JOB_LABEL) == "4242"
        del f.hot[("a", 1)]
        f.poll()  # absent from the filtered answer: its recovery (the follow-up) is owed
        assert "a" in f.fetched
    finally:
        f.close()


def test_samples_of_a_node_or_gpu_without_heartbeat_are_dropped() -> None:
    f = Fleet({"a": 2, "b": 2})
    try:
        f.poll()
        f.poll()
        f.gpus["b"] = [0]
        f.hot[("b", 1)] = 95.0  # range functions still see the missing GPU's samples
        f.hot[("z", 0)] = 99.0  # a node without any heartbeat
        f.poll()
        assert [s for s in f.round1 + f.round2 if s.kind is SignalKind.METRIC] == []
        assert f.src.last_poll is not None
        assert f.src.last_poll.stale_samples == 2
    finally:
        f.close()


def test_inventory_refresh_is_spread_over_the_polls() -> None:
    nodes = {f"n{i:03d}": 1 for i in range(200)}
    f = Fleet(nodes, forget_after=4 * 15 * 20)  # every node once per 20 polls
    try:
        f.poll()
        seen: dict[str, int] = {}
        for _ in range(20):
            f.poll()
            assert kinds(f.round1) == sorted(nodes)  # all FRESH at once, refresh or not
            assert len(f.fetched) < 40  # about 200 / 20 per poll, never all at once
            for n in f.fetched:
                seen[n] = seen.get(n, 0) + 1
            assert f.fetched == {n for n in nodes if f.src.live.refresh_due(n)}
        assert seen == dict.fromkeys(nodes, 1)
    finally:
        f.close()
