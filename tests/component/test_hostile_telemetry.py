"""Hostile Prometheus answers through the real runtime on fakes: nothing is written.

A real :class:`PrometheusSource` parses the answers of a fake Prometheus (NaN and ±Inf
temperatures, XID codes no GPU sends, counts of millions, stamps from the future, HTML pages,
truncated bodies, garbage entries) about a fleet of four GPU nodes, and hands every poll's
signals to the real :class:`Controller` in ``mode: act`` with every port a fake that records
calls. None of it may cause a write: no NodeRemediation, no cordon, no drain, no Event. Then a
real XID 79 on the node the hostile samples named, through the same path, opens a remediation
and writes (the fakes and the pipeline are live, and no hostile stamp froze its XID cursor).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from healer.adapters.prometheus import PrometheusSource
from healer.adapters.prometheus.promql import FRESH_MARK, XID_COUNT, XID_GAUGE
from healer.core import rules as cp
from healer.core.model import NodeView, Severity
from healer.core.phases import Phase
from healer.runtime.controller import Controller
from healer.runtime.executor import Executor, Ports
from healer.runtime.node_events import NodeEvents
from healer_dev.testing import FakeStore, ManualClock, fake_ports, settle
from tests.builders import GPU_LABELS, policies, policy

NODES = ("gpu-0", "gpu-1", "gpu-2", "gpu-3")
TEMP = "DCGM_FI_DEV_GPU_TEMP"
#: calls that only read (every other recorded call on a fake is a write)
READS = {"get", "list", "jobs_on", "state", "replacement_ready"}


def labels(node: str) -> dict[str, str]:
    return {"Hostname": node, "instance": f"{node}:9400", "gpu": "0", "UUID": f"GPU-{node}-0"}


def body(result: Any, kind: str = "vector") -> bytes:
    return json.dumps({"status": "success",
                       "data": {"resultType": kind, "result": result}}).encode()


Answer = Callable[[str, float], bytes | None]  # (query kind, now) → a hostile body or None


class Prom:
    """Correct answers for the fleet (all at 50 °C), each XID gauge as ``code``, plus
    ``hostile`` material for the next poll."""

    def __init__(self) -> None:
        self.code = dict.fromkeys(NODES, 0)
        self.gauge: dict[str, list[tuple[float, int]]] = {n: [] for n in NODES}
        self.extra: dict[str, list[Any]] = {}  # query kind → entries appended
        self.whole: dict[str, bytes] = {}  # query kind → the whole body

    def answer(self, expr: str, now: float) -> bytes:
        kind = ("freshness" if "healer_fresh" in expr else
                "xid-pre" if expr.startswith("max by") and "XID" in expr else
                "xid-raw" if XID_GAUGE in expr and "[" in expr and "max by" not in expr else
                "per-gpu" if "timestamp(" in expr else
                "recovery" if "healer_q" in expr else "metric")
        if kind in self.whole:
            return self.whole[kind]
        extra = self.extra.get(kind, [])
        if kind == "freshness":
            rows: list[Any] = [{"metric": {**labels(n), FRESH_MARK: m}, "value": [now, v]}
                    for n in NODES for m, v in (("newest", str(now - 1)), ("gpus", "1"))]
            return body(rows + extra)
        if kind == "per-gpu":
            return body([{"metric": labels(n), "value": [now, str(now - 1)]}
                         for n in NODES] + extra)
        if kind == "xid-pre":
            return body([{"metric": labels(n), "value": [now, "1"]} for n in NODES] + extra)
        if kind == "xid-raw":
            raw: list[Any] = [{"metric": {**labels(n), "__name__": XID_GAUGE},
                    "values": [[t, str(c)] for t, c in self.gauge[n] if now - 60 < t <= now]}
                   for n in NODES]
            return body(raw + extra, "matrix")
        return body(extra)


async def test_hostile_telemetry_writes_nothing_and_real_telemetry_does() -> None:
    clock = ManualClock()
    fleet = [NodeView(n, dict(GPU_LABELS)) for n in NODES]
    fakes = fake_ports(fleet)
    store = FakeStore()
    rules = (cp.XidRule("fatal", Severity.FAILED, frozenset({79, 48})),
             cp.MetricRule("hot", Severity.FAILED, TEMP, cp.Op.GE, 90.0))
    ps = policies(policy(rules=rules, steps=cp.Steps(poll_interval=5)))
    ctl = Controller(policies=ps, executor=Executor(Ports(**fakes), clock), store=store,
                     clock=clock)
    src = PrometheusSource("http://127.0.0.1:1", ps, stale_after=60, forget_after=1e9)
    prom = Prom()

    task = asyncio.create_task(NodeEvents(fakes["nodes"], ctl).run())

    async def poll() -> None:
        await clock.advance(15)
        now = clock.now()
        for n in NODES:
            prom.gauge[n].append((now - 1, prom.code[n]))
        signals = src.parse_poll(now, {e: prom.answer(e, now) for e in src.poll_queries(now)})
        follow = src.follow_up_queries(now)
        if follow:
            signals += src.parse_poll(now, {e: prom.answer(e, now) for e in follow})
        prom.extra.clear()
        prom.whole.clear()
        await ctl.on_signals(signals)
        await settle()

    def writes() -> list[tuple[str, str]]:
        return [(name, m) for name, fake in fakes.items()
                for m, _ in getattr(fake, "calls", []) if m not in READS]

    try:
        await settle()
        await ctl.start_leading()
        await poll()
        await poll()
        v = labels("gpu-1")
        bad_temps: tuple[Any, ...] = ("NaN", "+Inf", "1e6", "abc", None, True, [], "-1e300")
        hostile: list[tuple[str, list[Any] | bytes]] = [
            ("metric", [{"metric": v, "value": [0, x]} for x in bad_temps]),
            ("xid-raw", [{"metric": {**v, "__name__": XID_GAUGE},
                          "values": [[clock.now() + 14, x] for x in
                                     ("+Inf", "NaN", "-79", "1e300", "79.5", "4096")]
                          + [[clock.now() + 10**9, "79"], [1, "79"]]},
                         {"metric": {**v, "__name__": XID_COUNT, "xid": "79"},
                          "values": [[clock.now() + 13, "0"], [clock.now() + 14, "1e6"]]},
                         {"metric": {**v, "__name__": XID_COUNT, "xid": "99999"},
                          "values": [[clock.now() + 14, "1"]]}, None, "x", [1]]),
            ("freshness", [{"metric": {**labels("gpu-2"), FRESH_MARK: "newest"},
                            "value": [0, str(clock.now() + 10**9)]}, {"metric": []}, 7]),
            ("metric", b"<html><body>502 Bad Gateway</body></html>"),
            ("xid-raw", b'{"status":"success","data":{"result":[{"metric":'),
            ("freshness", b"not json"),
            ("xid-pre", b'{"status":"error","error":"boom"}'),
        ]
        for where, what in hostile:
            if isinstance(what, bytes):
                prom.whole[where] = what
            else:
                prom.extra[where] = what
            await poll()
        await poll()
        await clock.advance(600)
        await settle()
        assert src.drops.total() > 20
        assert store.writes == 0, store.objects
        assert writes() == []
        assert all(ctl.records.get(n) is None for n in NODES)

        # a real XID on the node that got the hostile samples, through the same path: its
        # cursor was not frozen by them, and the remediation writes
        prom.code["gpu-1"] = 79
        await poll()
        await clock.advance(30)
        await settle()
        assert store.writes > 0
        recs = [r for r, _ in store.objects.values() if r.node == "gpu-1"]
        assert recs
        assert Phase(recs[-1].phase) is not Phase.HEALTHY
        assert writes()  # the fakes record writes: the hostile phase had none
    finally:
        await ctl.stop_leading()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        src.close()
