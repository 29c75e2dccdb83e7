"""Server-side filters, the recovery follow-up and the XID pre-query (PrometheusSource)."""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from healer.adapters.prometheus import PrometheusSource
from healer.adapters.prometheus.promql import (
    TAG_LABEL,
    XID_COUNT,
    XID_GAUGE,
    host_regexes,
    server_filter,
)
from healer.core.model import GpuRef, Severity, Signal, SignalKind
from healer.core.rules import LabelSelector as Sel
from healer.core.rules import MetricRule, Op, Policy, PolicySet, XidRule

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
    assert server_filter("E", ((Op.EQ, 1.0),)) == "(E) == 1.0"
    assert server_filter("E", ((Op.NE, 5.0),)) == "(E) != 5.0"
    assert server_filter("E", ((Op.NE, 5.0), (Op.EQ, 1.0))) == "E"
    assert server_filter("E", ((Op.NE, 5.0), (Op.GT, 7.0))) == "E"
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
        # the change is still in the (overlapping) window: listed again, reported once
        assert p.poll([("b", 0)], [xid("b", 0, (n + 14, "79"), (n + 29, "79"))]) == []
        assert p.poll([], []) == []
        assert p.fetched == []  # stuck at 79, nothing new: not fetched
        # the return to 0 is a change: listed, fetched, nothing to report
        assert p.poll([("b", 0)], [xid("b", 0, (n + 44, "79"), (n + 59, "0"))]) == []
        assert p.fetched
        assert p.poll([], []) == []
        assert p.fetched == []
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


SCRAPE_S = 10.0  # the simulated scrape interval (the source's xid_overlap is 30 s)
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


Steps = list[tuple[float, float | None]]  # (from, value); None: the series is gone


def _steps_at(steps: Steps, t: float) -> float | None:
    v = None
    for since, value in steps:
        if since <= t:
            v = value
    return v


@dataclass
class SimGpu:
    """One GPU's XID series: step changes ``(from, value)`` of the gauge and of each
    ``xid`` count series (a series exists from its first step on)."""

    node: str
    gpu: int
    gauge: Steps = field(default_factory=list)
    counts: dict[int, Steps] = field(default_factory=dict)

    def series(self) -> list[tuple[dict[str, str], Steps]]:
        lb = labels(self.node, self.gpu)
        out = [({**lb, "__name__": XID_GAUGE}, self.gauge)]
        out += [({**lb, "__name__": XID_COUNT, "xid": str(x)}, steps)
                for x, steps in sorted(self.counts.items())]
        return out


def _samples(steps: Steps, a: float, b: float) -> list[tuple[float, float]]:
    """Scrapes (every SCRAPE_S) in ``(a, b]``."""
    out = []
    t = math.floor(a / SCRAPE_S) * SCRAPE_S + SCRAPE_S
    while t <= b:
        v = _steps_at(steps, t)
        if v is not None:
            out.append((t, v))
        t += SCRAPE_S
    return out


class XidWorld:
    """A fake Prometheus that honours the XID pre-query's semantics (first poll or later)
    and answers the raw host-restricted XID queries from the simulated series."""

    def __init__(self, *gpus: SimGpu) -> None:
        self.gpus = list(gpus)
        self.src = source(XidRule("x", Severity.FAILED, frozenset({79})))
        self.now = T
        self.fetched: list[set[str]] = []  # per poll: the hosts whose raw series came

    def prequery(self, expr: str, now: float) -> bytes:
        m = re.search(r"\[(\d+)(ms|s|m|h|d)\]", expr)
        assert m is not None
        w = int(m.group(1)) * _UNIT[m.group(2)]
        first = "offset" not in expr
        listed = []
        for g in self.gpus:
            new = False
            for lb, steps in g.series():
                vals = [v for _, v in _samples(steps, now - w, now)]
                before = _samples(steps, now - 2 * w, now - w)
                changed = any(x != y for x, y in itertools.pairwise(vals))
                if lb["__name__"] == XID_GAUGE:
                    if first:
                        new |= (bool(vals) and max(vals) > 0) or changed
                    else:
                        new |= changed or (bool(vals) and not before and max(vals) > 0)
                elif first:
                    new |= bool(vals)
                else:  # changed, appeared or gone
                    new |= changed or (bool(vals) and not before) or (not vals and bool(before))
            if new:
                listed.append({"metric": labels(g.node, g.gpu), "value": [now, "1"]})
        return body(listed)

    def raw(self, expr: str, now: float) -> bytes:
        m = re.search(r"\[(\d+)(ms|s|m|h|d)\]", expr)
        h = re.search(r'Hostname=~"([^"]*)"', expr)
        assert m is not None
        assert h is not None
        w = int(m.group(1)) * _UNIT[m.group(2)]
        hosts = re.compile(h.group(1).replace("\\\\", "\\"))
        out = []
        for g in self.gpus:
            if not hosts.fullmatch(g.node):
                continue
            for lb, steps in g.series():
                pts = _samples(steps, now - w, now)
                if pts:
                    out.append({"metric": lb, "values": [[t, str(v)] for t, v in pts]})
        self.fetched[-1] |= {str(e["metric"]["Hostname"]) for e in out}
        return body(out, "matrix")

    def poll(self) -> list[float]:
        self.now += 15
        now = self.now
        self.fetched.append(set())
        exprs = self.src.poll_queries(now)
        fleet = [(g.node, g.gpu) for g in self.gpus]
        sigs: list[Signal] = self.src.parse_poll(
            now, {exprs[0]: heartbeat(now, *fleet), exprs[1]: self.prequery(exprs[1], now)})
        follow = self.src.follow_up_queries(now)
        if follow:
            sigs += self.src.parse_poll(now, {e: self.raw(e, now) for e in follow})
        return [s.value for s in sigs if s.kind is SignalKind.XID]

    def run(self, polls: int) -> list[float]:
        return [v for _ in range(polls) for v in self.poll()]


def test_gpu_stuck_at_79_for_hours_is_not_fetched_once_nothing_changes() -> None:
    b = SimGpu("b", 0, gauge=[(T - 3600, 0.0), (T + 100, 79.0)], counts={79: [(T + 100, 1.0)]})
    w = XidWorld(SimGpu("a", 0, gauge=[(T - 3600, 0.0)]), b)
    try:
        got = w.run(480)  # two hours, 15 s apart
        assert got == [79.0]  # gauge and count in one scrape: one occurrence
        busy = [i for i, hosts in enumerate(w.fetched) if hosts]
        assert all(w.fetched[i] == {"b"} for i in busy)
        assert len(busy) <= 3  # while the change is in the (overlapping) window
        assert busy[-1] < 10  # then never again
    finally:
        w.src.close()


def test_stuck_at_79_then_13_is_one_occurrence_of_13_and_none_of_79() -> None:
    def stuck(node: str) -> SimGpu:
        return SimGpu(node, 0, gauge=[(T - 7200, 0.0), (T - 3600, 79.0), (T + 1000, 13.0)],
                      counts={79: [(T - 3600, 1.0)], 13: [(T + 1000, 1.0)]})

    w = XidWorld(SimGpu("a", 0, gauge=[(T - 7200, 0.0)]), stuck("b"), stuck("c"))
    try:
        # the first poll fetches both (lookback): their first samples are the baseline
        assert w.poll() == []
        assert w.fetched[0] == {"b", "c"}
        assert w.run(5) == []
        assert not any(w.fetched[1:])  # stuck at 79: not fetched
        # c's cursor lost (as for a GPU known but never fetched): its baseline is its
        # samples from before the previous XID poll, not "code 0"
        w.src.xids.forget("c")
        got = w.run(240)
        assert got == [13.0, 13.0]  # once per GPU
        busy = [i for i, hosts in enumerate(w.fetched) if hosts][1:]
        assert len(busy) <= 3  # while the change is in the (overlapping) window
        assert all(w.fetched[i] == {"b", "c"} for i in busy)
        assert busy[-1] < 1000 / 15 + 4  # then never again
    finally:
        w.src.close()


def test_brand_new_gpu_whose_first_sample_is_79_is_one_occurrence() -> None:
    # c known from the freshness answer; its XID series appear after a poll, already at 79
    c = SimGpu("c", 0, gauge=[(T + 200, 79.0)], counts={79: [(T + 200, 1.0)]})
    w = XidWorld(SimGpu("a", 0, gauge=[(T - 3600, 0.0)]), c)
    try:
        got = w.run(100)
        assert got == [79.0]
        busy = [i for i, hosts in enumerate(w.fetched) if hosts]
        assert 1 <= len(busy) <= 3  # while it is new in the (overlapping) window
        assert busy[-1] < 200 / 15 + 4  # then never again
    finally:
        w.src.close()


def test_same_xid_again_after_its_count_series_left_the_window_is_reported() -> None:
    # dcgm-exporter counts per XID in a sliding window: the xid="79" series goes, and comes
    # back at 1 when 79 occurs again; the gauge stays at 79 all along
    b = SimGpu("b", 0, gauge=[(T - 3600, 0.0), (T + 100, 79.0)],
               counts={79: [(T + 100, 1.0), (T + 400, None), (T + 1000, 1.0)]})
    w = XidWorld(SimGpu("a", 0, gauge=[(T - 3600, 0.0)]), b)
    try:
        assert w.run(200) == [79.0, 79.0]
        assert not any(w.fetched[1000 // 15 + 4:])
    finally:
        w.src.close()
