"""Fuzz: hostile Prometheus answers never crash a poll, blind the fleet or move a cursor wrongly.

The seam is :meth:`PrometheusSource.parse_poll`, where a poll's HTTP bodies become signals (the
same code :meth:`~PrometheusSource.poll_once` runs after its GETs). A four-node fleet answers
every query of every round correctly; the hostile material is *added* to one place of one
poll: entries of the freshness, metric, XID pre-query, raw XID or per-GPU answers, points
inside a series, or a whole answer's body. A hand-written corpus holds the inputs issue 12
names (NaN, ±Inf, negative and impossible XID codes, counts of millions, stamps far in the
future and past, absurd temperatures, non-numeric strings, wrong types, nulls, nesting, huge
arrays, HTML pages, truncated and non-JSON bodies); hypothesis adds random JSON near and far
from the right shape (seeded: ``derandomize=True``; a failure prints its example).

After every hostile poll: nothing but a :class:`HealerError` escaped (each poll runs under an
internal budget, so a hang fails with its example); ``ok-0``/``ok-1`` are FRESH, never STALE
(unless the freshness answer itself was unusable: then every node is unknown, by design) and
stay healthy; no XID signal carries an impossible code and no signal a stamp after the poll;
``xid-2``'s real XID 79, sent in the hostile poll, is reported exactly once (the cursor moved
past the good data, whatever else was in the answer) and ``victim``'s real XID 48, sent two
polls later, is reported exactly once (the cursor was not frozen); what was dropped is
counted. The source's only I/O is reading (HTTP GETs, see ``test_prom_hostile_http``); no
verdict that could lead to a write (FAILED/DEGRADING) comes from hostile data, and
``tests/component/test_hostile_telemetry.py`` runs such answers through the real controller on
fakes that record writes (none).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healer.adapters.prometheus import PrometheusSource
from healer.adapters.prometheus.promql import FRESH_MARK, XID_COUNT, XID_GAUGE
from healer.adapters.prometheus.sanity import MAX_XID, MAX_XID_EVENTS
from healer.core.health import evaluate_node
from healer.core.model import GpuRef, HealthState, Severity, Signal, SignalKind
from healer.core.rules import LabelSelector as Sel
from healer.core.rules import MetricRule, Op, Policy, PolicySet, XidRule
from healer.errors import HealerError

T = 1_700_000_000.0
TEMP = "DCGM_FI_DEV_GPU_TEMP"
GOOD = ("ok-0", "ok-1", "xid-2")
NODES = (*GOOD, "victim")
POSITIONS = ("freshness", "metric", "xid-pre", "xid-raw", "xid-points", "per-gpu")
BUDGET_S = 60.0  # per poll; a real poll of this fleet takes well under a millisecond
_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fuzz-prom")


def labels(node: str, gpu: int = 0) -> dict[str, str]:
    return {"Hostname": node, "instance": f"{node}:9400", "gpu": str(gpu),
            "UUID": f"GPU-{node}-{gpu}"}


def body(result: Any, kind: str = "vector") -> bytes:
    return json.dumps({"status": "success",
                       "data": {"resultType": kind, "result": result}}).encode()


@dataclass
class Hostile:
    """What one poll gets on top of the right answers: ``entries`` appended to the answer at
    ``where`` (``xid-points``: points appended to victim's XID gauge series), or ``whole``
    replacing the body of the query ``where`` names (``freshness``, ``metric``, ``xid-pre``,
    ``xid-raw``)."""

    where: str
    entries: list[Any] | None = None
    whole: bytes | None = None
    usable: bool = False  # the corpus knows the sample is a possible reading (-1 °C)


class Fleet:
    """Four one-GPU nodes polled every 15 s by a real source, answered by a fake Prometheus
    that honours every query of both rounds."""

    def __init__(self) -> None:
        rules = (MetricRule("hot", Severity.DEGRADING, TEMP, Op.GE, 90.0),
                 XidRule("x", Severity.FAILED, frozenset({79, 48})))
        self.policies = PolicySet((Policy("p", Sel(), rules),))
        self.src = PrometheusSource("http://127.0.0.1:1", self.policies, stale_after=60,
                                    forget_after=1e9)
        self.now = T
        self.code = dict.fromkeys(NODES, 0)  # each node's XID gauge now
        self.gauge: dict[str, list[tuple[float, int]]] = {n: [] for n in NODES}
        self.seen: dict[str, list[Signal]] = defaultdict(list)

    # -- answers ------------------------------------------------------------------------

    def freshness(self) -> list[Any]:
        rows: list[Any] = []
        for n in NODES:
            rows.append({"metric": {**labels(n), FRESH_MARK: "newest"},
                         "value": [self.now, str(self.now - 1)]})
            rows.append({"metric": {**labels(n), FRESH_MARK: "gpus"}, "value": [self.now, "1"]})
        return rows

    def per_gpu(self, hosts: set[str]) -> list[Any]:
        return [{"metric": labels(n), "value": [self.now, str(self.now - 1)]}
                for n in NODES if n in hosts]

    def xid_raw(self, window: float, hosts: set[str]) -> list[Any]:
        out: list[Any] = []
        for n in NODES:
            pts: list[Any] = [[t, str(c)] for t, c in self.gauge[n]
                              if self.now - window < t <= self.now]
            if n in hosts and pts:
                out.append({"metric": {**labels(n), "__name__": XID_GAUGE}, "values": pts})
        return out

    def answer(self, expr: str, hostile: Hostile | None) -> bytes:
        where = _kind(expr)
        if hostile is not None and hostile.whole is not None and hostile.where == where:
            return hostile.whole
        extra = list(hostile.entries or []) if hostile is not None and \
            hostile.where == where else []
        if where == "freshness":
            return body(self.freshness() + extra)
        if where == "metric":
            return body(extra)  # every GPU at 50 °C: the filtered answer is empty
        if where == "xid-pre":  # every GPU listed: harmless, and its raw series are read
            return body([{"metric": labels(n), "value": [self.now, "1"]} for n in NODES]
                        + extra)
        hosts = _hosts(expr)
        if where == "per-gpu":
            return body(self.per_gpu(hosts) + extra)
        if where == "xid-raw":
            raw = self.xid_raw(_window(expr), hosts)
            if hostile is not None and hostile.where == "xid-points":
                for e in raw:
                    if e["metric"]["Hostname"] == "victim":
                        e["values"] = e["values"] + list(hostile.entries or [])
            return body(raw + extra, "matrix")
        return body([])  # a recovery query: nothing was violating

    # -- polls --------------------------------------------------------------------------

    def poll(self, hostile: Hostile | None = None) -> list[Signal]:
        self.now += 15
        for n in NODES:
            self.gauge[n].append((self.now - 1, self.code[n]))
        src, now = self.src, self.now
        signals: list[Signal] = within_budget(lambda: src.parse_poll(
            now, {e: self.answer(e, hostile) for e in src.poll_queries(now)}))
        follow = src.follow_up_queries(now)
        if follow:
            signals += within_budget(lambda: src.parse_poll(
                now, {e: self.answer(e, hostile) for e in follow}))
        for s in signals:
            self.seen[s.node].append(s)
        return signals

    def xids(self, signals: list[Signal], node: str) -> list[float]:
        return [s.value for s in signals if s.kind is SignalKind.XID and s.node == node]

    def close(self) -> None:
        self.src.close()


def _kind(expr: str) -> str:
    if "healer_fresh" in expr:
        return "freshness"
    if expr.startswith("max by") and "XID" in expr:
        return "xid-pre"
    if f'__name__=~"{XID_GAUGE}|{XID_COUNT}"' in expr:
        return "xid-raw"
    if "timestamp(" in expr:
        return "per-gpu"
    if "healer_q" in expr:
        return "recovery"
    return "metric"


def _hosts(expr: str) -> set[str]:
    m = re.search(r'Hostname=~"([^"]*)"', expr)
    return set(m.group(1).replace("\\", "").split("|")) if m else set()


def _window(expr: str) -> float:
    m = re.search(r"\[(\d+)(ms|s|m|h|d)\]", expr)
    assert m is not None
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def within_budget(fn: Callable[[], list[Signal]]) -> list[Signal]:
    """Run one parse with an internal time budget: a hang fails with its example."""
    return _pool.submit(fn).result(timeout=BUDGET_S)


def check(hostile: Hostile) -> Fleet:
    """One hostile poll between clean ones, and every invariant of the module docstring."""
    f = Fleet()
    try:
        f.poll()
        f.poll()  # every node known, fetched, judged from its two rows; XID baselines set
        dropped_before = f.src.drops.total()
        f.code["xid-2"] = 79
        try:
            got = f.poll(hostile)
        except HealerError:
            got = []  # healer's own error types may end a poll (none does today)
        # the freshness answer replaced whole: no node's rows are left, every node is unknown
        blind = hostile.where == "freshness" and hostile.whole is not None
        for node in ("ok-0", "ok-1"):
            kinds = {s.kind for s in got if s.node == node}
            if blind:
                assert kinds == {SignalKind.STALE}, (node, got)
            else:
                assert SignalKind.FRESH in kinds, (node, got)
                assert SignalKind.STALE not in kinds, (node, got)
        now = f.now
        for s in got:
            assert s.observed_at <= now + 1
            if s.kind is SignalKind.XID:
                assert s.value == int(s.value)
                assert 1 <= s.value <= MAX_XID
            if s.kind is SignalKind.METRIC:
                assert math.isfinite(s.value)
        assert len(got) < 64 + 4 * MAX_XID_EVENTS  # no explosion of signals
        for key, cur in f.src.xids._cursors.items():
            assert cur.t <= now, key  # never from the future
        if hostile.whole is None:  # past the good data, whatever else the answers held
            assert f.src.xids._cursors[("xid-2", labels_ref("xid-2"))].t == now - 1
        after = f.poll()
        f.code["victim"] = 48
        later = f.poll()
        assert f.xids(got + after + later, "xid-2") == [79.0]  # once: not skipped, not twice
        assert f.xids(later, "victim") == [48.0]  # the cursor is not frozen
        for node in ("ok-0", "ok-1"):
            v = evaluate_node(node, f.seen[node], f.policies.policies, f.now)
            assert v.state in (HealthState.HEALTHY, HealthState.STALE), v
        if hostile.whole is not None and not _is_answer(hostile.whole):
            assert f.src.drops.total() > dropped_before
        if any(_junk(e, hostile.where) for e in hostile.entries or ()):
            assert f.src.drops.total() > dropped_before  # counted, whatever else it held
        return f
    finally:
        f.close()


def _junk(entry: Any, where: str) -> bool:
    """Whether an injected entry cannot be a series (a point, for ``xid-points``) at all."""
    if where == "xid-points":
        return not (isinstance(entry, list) and len(entry) == 2)
    return not isinstance(entry, dict)


def labels_ref(node: str) -> GpuRef:
    return GpuRef(0, f"GPU-{node}-0")


def _is_answer(raw: bytes) -> bool:
    """Whether ``raw`` is an API answer with a list result (what the source accepts)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and doc.get("status", "success") == "success" and \
        isinstance(doc.get("data"), dict) and isinstance(doc["data"].get("result"), list)


# -- the corpus -------------------------------------------------------------------------------

V = labels("victim")
XG = {**V, "__name__": XID_GAUGE}
XC = {**V, "__name__": XID_COUNT, "xid": "79"}
BAD_VALUES: list[Any] = ["NaN", "+Inf", "-Inf", "-1", "1e300", "-1e300", "79.5", "abc", "", "0x4f",
              "1e999", None, True, [], {}, [1], 10**30]
BAD_TIMES: list[Any] = [1e300, -1e300, 0, -1, "now", None, [], 9e15, T - 1e9, "1e999"]


def _corpus() -> list[tuple[str, Hostile]]:
    cases: list[tuple[str, Hostile]] = []
    # single bad samples, of every kind, in every answer
    for v in BAD_VALUES:
        cases.append((f"temp {v!r}", Hostile("metric", [{"metric": V, "value": [T, v]}],
                                             usable=v in ("-1", "79.5"))))
        cases.append((f"good node's temp {v!r}",
                      Hostile("metric", [{"metric": labels("ok-0"), "value": [T, v]}],
                              usable=v in ("-1", "79.5"))))
        cases.append((f"xid point {v!r}", Hostile("xid-points", [[T + 40, v]])))
        cases.append((f"xid count {v!r}",
                      Hostile("xid-raw", [{"metric": XC, "values": [[T + 40, v]]}])))
        cases.append((f"heartbeat {v!r}", Hostile("freshness", [
            {"metric": {**labels("ok-0"), FRESH_MARK: "newest"}, "value": [T, v]},
            {"metric": {**V, FRESH_MARK: "gpus"}, "value": [T, v]}])))
        cases.append((f"per-GPU row {v!r}", Hostile("per-gpu", [{"metric": V, "value": [T, v]}])))
    for t in BAD_TIMES:
        cases.append((f"xid time {t!r}", Hostile("xid-points", [[t, "79"]])))
        cases.append((f"xid count time {t!r}",
                      Hostile("xid-raw", [{"metric": XC, "values": [[t, "5"]]}])))
        cases.append((f"heartbeat time {t!r}", Hostile("freshness", [
            {"metric": {**labels("ok-1"), FRESH_MARK: "newest"}, "value": [T, str(t)]}])))
    cases += [
        ("absurd temperature", Hostile("metric", [{"metric": V, "value": [T, "1e6"]}])),
        ("negative XID code", Hostile("xid-points", [[T + 40, "-79"]])),
        ("XID beyond any real code", Hostile("xid-points", [[T + 40, "4096"]])),
        ("XID label beyond any real code",
         Hostile("xid-raw", [{"metric": {**XC, "xid": "99999"}, "values": [[T + 40, "1"]]}])),
        ("count of a million", Hostile("xid-raw", [{"metric": XC,
                                                    "values": [[T + 40, "0"],
                                                               [T + 41, "1000000"]]}])),
        ("count jumping by 90,000", Hostile("xid-raw", [{"metric": XC,
                                                         "values": [[T + 40, "0"],
                                                                    [T + 41, "90000"]]}])),
        ("XID from the future", Hostile("xid-points", [[T + 10**9, "79"]])),
        ("XID from 1970", Hostile("xid-points", [[1, "79"]])),
        ("null metric", Hostile("xid-raw", [{"metric": None, "values": None}])),
        ("labels a list", Hostile("freshness", [{"metric": ["Hostname"], "value": [T, "1"]}])),
        ("unhashable instance", Hostile("freshness", [
            {"metric": {**V, "healer_up": "0", "instance": ["x"]}, "value": [T, "0"]}])),
        ("nested garbage", Hostile("metric", [[[[[[[[[[{"a": [None]}]]]]]]]]]])),
        ("entry a string", Hostile("xid-pre", ["Hostname"])),
        ("huge array", Hostile("xid-points", [[T + 40, "0"]] * 200_000, usable=True)),
        ("many garbage entries", Hostile("metric", [{"metric": V}] * 50_000)),
    ]
    wholes = [b"", b"<html><body>502 Bad Gateway</body></html>", b"not json", b"{",
              body([{"metric": V, "value": [T, "1"]}])[:-7], b"null", b"[]", b"[1, 2]",
              b'{"status": "error", "error": "boom"}', b'{"data": {"result": "x"}}',
              b'{"data": {"result": {"a": 1}}}', b'{"data": null}', b"\xff\xfe\x00",
              b"[" * 100_000 + b"]" * 100_000, b'{"data": {"result": [NaN, Infinity]}}',
              b'{"status": "success", "data": {"result": [{"metric": {}, "value": [1, NaN]}]}}']
    for i, w in enumerate(wholes):
        for where in ("freshness", "metric", "xid-pre", "xid-raw"):
            cases.append((f"whole answer #{i} to {where}", Hostile(where, whole=w)))
    return cases


CORPUS = _corpus()


@pytest.mark.parametrize("hostile", [c for _, c in CORPUS], ids=[n for n, _ in CORPUS])
def test_corpus(hostile: Hostile) -> None:
    f = check(hostile)
    if hostile.entries and hostile.where in ("metric", "xid-points") and not hostile.usable:
        # every corpus sample there is unusable: dropped and counted, never a reading
        assert f.src.drops.total() > 0
        assert not [s for s in f.seen["victim"] if s.kind is SignalKind.METRIC]


def test_corpus_victim_stays_healthy_on_bad_samples() -> None:
    """Only unusable samples reach victim in the corpus' sample cases: no verdict from them."""
    for name, hostile in CORPUS:
        if hostile.whole is not None or hostile.where not in ("metric", "xid-points"):
            continue
        f = Fleet()
        try:
            f.poll()
            f.poll(hostile)
            f.poll()
            v = evaluate_node("victim", f.seen["victim"], f.policies.policies, f.now)
            assert v.state is HealthState.HEALTHY, (name, v)
        finally:
            f.close()


# -- hypothesis ---------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=4),
    max_leaves=16)
VALUES = st.sampled_from(BAD_VALUES) | JSON
TIMES = st.sampled_from(BAD_TIMES) | st.floats() | JSON
POINTS = st.lists(st.one_of(TIMES, VALUES), min_size=2, max_size=2) | JSON
LABEL_KEYS = st.sampled_from(["Hostname", "hostname", "gpu", "UUID", "uuid", "__name__", "xid",
                              "instance", FRESH_MARK, "healer_up", "healer_q", "hpc_job"])


def _not_good(labels: Any) -> bool:
    """Hostile series belong to victim or to no node: a *good* node's series with a valid
    value would be real data about it."""
    if not isinstance(labels, dict):
        return True
    return not any(isinstance(labels.get(k), str) and labels[k].strip() in GOOD
                   for k in ("Hostname", "hostname"))


LABELS = (st.just(V) | st.just(XG) | st.just(XC)
          | st.dictionaries(LABEL_KEYS, JSON | st.sampled_from(["victim", XID_GAUGE, XID_COUNT,
                                                                "newest", "gpus", "0", "79"]),
                            max_size=6)
          | JSON).filter(_not_good)
ENTRIES = st.one_of(
    JSON,
    st.fixed_dictionaries({"metric": LABELS, "value": POINTS}),
    st.fixed_dictionaries({"metric": LABELS, "values": st.lists(POINTS, max_size=6)}),
)
FUZZ = settings(max_examples=250, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.sampled_from(POSITIONS), st.lists(ENTRIES, min_size=1, max_size=6))
def test_hostile_entries(where: str, entries: list[Any]) -> None:
    if where == "xid-points":
        entries = [e for e in entries if not _valid_victim_xid(e)]
    check(Hostile(where, entries))


def _valid_victim_xid(point: Any) -> bool:
    """A point that is a real XID sample in the window (real data about victim, not hostile)."""
    try:
        t, v = float(point[0]), float(point[1])
    except (TypeError, ValueError, IndexError, KeyError, OverflowError):
        return False
    return len(point) == 2 and T < t <= T + 100 and v == int(v) and 0 <= v <= MAX_XID


@FUZZ
@given(st.sampled_from(("freshness", "metric", "xid-pre", "xid-raw")),
       st.one_of(st.binary(max_size=300),
                 JSON.map(lambda j: json.dumps(j).encode()),
                 st.fixed_dictionaries({"status": JSON, "data": JSON}).map(
                     lambda j: json.dumps(j).encode()),
                 st.fixed_dictionaries({"data": st.fixed_dictionaries({"result": JSON})}).map(
                     lambda j: json.dumps(j).encode())))
def test_hostile_whole_answers(where: str, whole: bytes) -> None:
    check(Hostile(where, whole=whole))
