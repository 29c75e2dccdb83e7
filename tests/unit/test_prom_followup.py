"""Server-side filters, the recovery follow-up and the XID pre-query (PrometheusSource)."""

from __future__ import annotations

import json
from typing import Any

from healer.adapters.prometheus import (
    TAG_LABEL,
    XID_GAUGE,
    PrometheusSource,
    host_regexes,
    server_filter,
)
from healer.core.model import GpuRef, Severity, Signal, SignalKind
from healer.core.policy import LabelSelector as Sel
from healer.core.policy import MetricRule, Op, Policy, PolicySet, XidRule

T = 1_700_000_000.0
TEMP = "DCGM_FI_DEV_GPU_TEMP"


def body(result: list[Any], kind: str = "vector") -> bytes:
    return json.dumps({"status": "success",
                       "data": {"resultType": kind, "result": result}}).encode()


def labels(node: str, gpu: int) -> dict[str, str]:
    return {"Hostname": node, "instance": f"{node}:9400", "gpu": str(gpu),
            "UUID": f"GPU-{node}-{gpu}"}


def source(*rules: MetricRule | XidRule) -> PrometheusSource:
    return PrometheusSource("http://127.0.0.1:1",
                            PolicySet((Policy("p", Sel(), tuple(rules)),)), stale_after=60)


def test_server_filter_loosest_threshold_per_direction() -> None:
    assert server_filter("E", ((Op.GT, 90.0), (Op.GE, 95.0))) == "(E) > 90.0"
    assert server_filter("E", ((Op.GT, 90.0), (Op.GE, 90.0))) == "(E) >= 90.0"
    assert server_filter("E", ((Op.LT, 5.0), (Op.LE, 3.0))) == "(E) < 5.0"
    assert server_filter("E", ((Op.GT, 5.0), (Op.LT, 1.0))) == "E"  # opposite ops
    assert server_filter("E", ((Op.EQ, 1.0),)) == "E"
    src = source(MetricRule("hot", Severity.DEGRADING, TEMP, Op.GE, 90.0))
    try:
        (q,) = src.plan.metrics
        assert q.expr == f"({q.base}) >= 90.0"
        assert src.poll_queries(T)[1:] == [q.expr]
    finally:
        src.close()


def test_host_regexes_escape_and_chunk() -> None:
    assert host_regexes([("Hostname", "a.b"), ("Hostname", "c"), ("hostname", "x")]) == [
        {"Hostname": "a\\.b|c"}, {"hostname": "x"}]
    chunks = host_regexes([("Hostname", f"node-{i:04d}") for i in range(1000)], limit=500)
    assert len(chunks) > 1
    assert all(len(c["Hostname"]) <= 500 for c in chunks)
    assert sum(len(c["Hostname"].split("|")) for c in chunks) == 1000


def heartbeat(now: float, *gpus: tuple[str, int]) -> bytes:
    return body([{"metric": labels(n, g), "value": [now, str(now - 1)]} for n, g in gpus])


def test_recovery_of_an_absent_series_is_one_targeted_follow_up() -> None:
    src = source(MetricRule("hot", Severity.DEGRADING, TEMP, Op.GE, 90.0))
    fleet = (("a", 0), ("a", 1), ("b.x", 0))
    try:
        now = T
        (q,) = src.plan.metrics
        hot = body([{"metric": labels("b.x", 0), "value": [now, "95"]}])
        sigs = src.parse_poll(now, {src.freshness_query: heartbeat(now, *fleet), q.expr: hot})
        assert [(s.node, s.value) for s in sigs if s.kind is SignalKind.METRIC] == [
            ("b.x", 95.0)]
        assert src.follow_up_queries(now) == []
        now += 15  # cooled: absent from the filtered answer, its GPU fresh
        sigs = src.parse_poll(now, {src.freshness_query: heartbeat(now, *fleet),
                                    q.expr: body([])})
        assert [s for s in sigs if s.kind is SignalKind.METRIC] == []
        (follow,) = src.follow_up_queries(now)
        assert follow == (f'label_replace(max by (Hostname, hostname, instance, gpu, UUID, '
                          f'uuid, DCGM_FI_DEV_SERIAL) ({TEMP}{{Hostname=~"b\\\\.x"}}), '
                          f'"{TAG_LABEL}", "0", "", "")')
        answer = body([{"metric": {**labels("b.x", 0), TAG_LABEL: "0"}, "value": [now, "60"]},
                       {"metric": {**labels("b.x", 1), TAG_LABEL: "0"}, "value": [now, "50"]}])
        sigs = src.parse_poll(now, {follow: answer})
        assert [(s.node, s.gpu, s.value) for s in sigs] == [
            ("b.x", GpuRef(0, "GPU-b.x-0"), 60.0)]  # the one recovery, the real value
        assert src.follow_up_queries(now) == []
        assert src.last_poll is not None
        assert src.last_poll.rounds == 2
        assert src.last_poll.queries == src.plan.queries_per_poll + 1
        now += 15
        src.parse_poll(now, {src.freshness_query: heartbeat(now, *fleet), q.expr: body([])})
        assert src.follow_up_queries(now) == []  # recovered: nothing owed
    finally:
        src.close()


def xid(node: str, gpu: int, *points: tuple[float, str]) -> dict[str, Any]:
    return {"metric": {**labels(node, gpu), "__name__": XID_GAUGE},
            "values": [[t, v] for t, v in points]}


class XidPoller:
    """Polls 15 s apart; ``flagged`` answers the pre-query, ``raw`` the follow-up."""

    def __init__(self) -> None:
        self.src = source(XidRule("x", Severity.FAILED, frozenset({79})))
        self.now = T
        self.fetched: list[str] = []

    def poll(self, flagged: list[tuple[str, int]], raw: list[dict[str, Any]]) -> list[float]:
        self.now += 15
        exprs = self.src.poll_queries(self.now)
        pre = body([{"metric": labels(n, g), "value": [self.now, "1"]} for n, g in flagged])
        sigs: list[Signal] = self.src.parse_poll(
            self.now, {exprs[0]: heartbeat(self.now, ("a", 0), ("b", 0)), exprs[1]: pre})
        follow = self.src.follow_up_queries(self.now)
        self.fetched = follow
        if follow:
            sigs += self.src.parse_poll(self.now, {e: body(raw, "matrix") for e in follow})
        return [s.value for s in sigs if s.kind is SignalKind.XID]


def test_xid_pre_query_and_host_restricted_raw_query() -> None:
    p = XidPoller()
    try:
        assert p.src.poll_queries(T)[1].startswith("max by (")
        assert p.poll([], []) == []
        assert p.fetched == []  # nothing to report anywhere: no raw query at all
        n = p.now
        got = p.poll([("b", 0)], [xid("b", 0, (n + 5, "0"), (n + 14, "79"))])
        assert got == [79.0]
        (raw,) = p.fetched
        assert 'Hostname=~"b"' in raw
        assert raw.endswith("]")
        # the cursor holds 79: fetched while it does, reported once
        assert p.poll([("b", 0)], [xid("b", 0, (n + 14, "79"), (n + 29, "79"))]) == []
        assert p.poll([], [xid("b", 0, (n + 44, "0"))]) == []
        assert p.fetched  # fetched once more, to see the return to 0 ...
        assert p.poll([], []) == []
        assert p.fetched == []  # ... then no more
    finally:
        p.src.close()


def test_xid_on_a_gpu_never_fetched_is_reported_once_even_as_its_first_sample() -> None:
    p = XidPoller()
    try:
        assert p.poll([], []) == []  # a and b known from the freshness answer
        assert p.poll([], []) == []
        n = p.now
        # first fetched sample of b/0 is already 79: implicit baseline "code 0, no counts"
        assert p.poll([("b", 0)], [xid("b", 0, (n + 14, "79"))]) == [79.0]
        assert p.poll([("b", 0)], [xid("b", 0, (n + 14, "79"), (n + 29, "79"))]) == []
        # the same with a 0 before it
        assert p.poll([("a", 0)], [xid("a", 0, (n + 40, "0"), (n + 44, "79"))]) == [79.0]
        assert p.poll([("a", 0)], [xid("a", 0, (n + 44, "79"), (n + 59, "79"))]) == []
    finally:
        p.src.close()


def test_first_poll_keeps_the_first_sample_as_the_baseline() -> None:
    p = XidPoller()
    try:
        n = p.now
        # the first poll: no previous poll, so the first sample is the baseline (lookback)
        assert p.poll([("b", 0)], [xid("b", 0, (n - 100, "79"), (n + 10, "79"))]) == []
        assert p.poll([("b", 0)], [xid("b", 0, (n + 10, "79"), (n + 20, "48"))]) == [48.0]
    finally:
        p.src.close()


def test_abandoned_follow_up_loses_no_xid() -> None:
    p = XidPoller()
    try:
        assert p.poll([], []) == []
        p.now += 15
        exprs = p.src.poll_queries(p.now)
        pre = body([{"metric": labels("b", 0), "value": [p.now, "1"]}])
        p.src.parse_poll(p.now, {exprs[0]: heartbeat(p.now, ("a", 0), ("b", 0)),
                                 exprs[1]: pre})
        assert p.src.follow_up_queries(p.now)  # never answered
        n = p.now
        assert p.poll([("b", 0)], [xid("b", 0, (n - 1, "79"), (n + 14, "79"))]) == [79.0]
    finally:
        p.src.close()
