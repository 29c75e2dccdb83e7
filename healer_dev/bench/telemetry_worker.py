"""The telemetry loop the ``telemetry`` group measures, run in a fresh process.

``python -m healer_dev.bench.telemetry_worker --url URL --nodes N --polls P`` builds the real
:class:`~healer.adapters.prometheus.PrometheusSource` for the default policies (act mode),
polls the synthetic Prometheus at ``URL`` ``P`` times in simulated time (15 s apart: every
query evaluated at that instant), feeds each poll's signals to the engine through
:class:`healer.sim.engine.Replay` and runs it to the poll's time. Per poll it records the CPU
seconds (``time.process_time``: parse + evaluate, HTTP client included), the part of them the
garbage collector took (``gc.callbacks``; a full collection of this heap costs about as much as
a poll, and which poll it lands in is an accident of allocation counts) and the resident set
size (VmRSS). Prints one JSON object on stdout. Nothing else runs in this process, so its RSS
is the telemetry path's own.

Where the source has the no-HTTP entry point (``poll_queries`` + ``parse_poll``), the raw bodies
are fetched first, outside the timed window, and the CPU is that of ``parse_poll`` + the
engine: parse + evaluate only. Otherwise the timed window is ``poll_once`` (HTTP client
included) + the engine. The result says which (``path``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from healer.adapters.prometheus import PrometheusSource
from healer.core.model import Signal
from healer.core.topology import DOMAIN_LABEL
from healer.sim.engine import Replay
from healer.sim.world import SimNode

from .engine import CachedWorld
from .policies import load_default
from .promsynth import SCRAPE

START = 1_767_600_000.0


def rss_mb() -> float:
    """This process' resident set size (VmRSS), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


class GcClock:
    """CPU seconds spent inside :meth:`window` (``cpu``), the garbage collector's part of them
    (``gc``), and all it has taken in this process so far (``spent``, from ``gc.callbacks``)."""

    def __init__(self) -> None:
        self.spent = 0.0
        self.cpu = 0.0
        self.gc = 0.0
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.spent += time.process_time() - self._started

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        """Count the CPU (and the collector's part) of what runs inside."""
        c0, g0 = time.process_time(), self.spent
        try:
            yield
        finally:
            self.cpu += time.process_time() - c0
            self.gc += self.spent - g0

    def take(self) -> tuple[float, float]:
        """``(cpu, gc)`` counted since the last take, and start again from zero."""
        out = (self.cpu, self.gc)
        self.cpu = self.gc = 0.0
        return out

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)


def fetch(url: str, expr: str, at: float) -> bytes:
    """One raw answer of the synthetic Prometheus (outside the timed window)."""
    # POST: the heartbeat query of a large fleet (finite samples only, since issue 12)
    # outgrows a request line, which the synthetic server (aiohttp) caps at 8 KiB
    q = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"}).encode()
    with urllib.request.urlopen(f"{url}/api/v1/query", data=q, timeout=600) as r:
        body: bytes = r.read()
        return body


async def main_async(url: str, nodes: int, polls: int, warm: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="healer-bench-") as tmp:
        policies = load_default(Path(tmp), permissive=True)
    names = [f"gpu-{i:05d}" for i in range(nodes)]
    world = CachedWorld([SimNode(n, {"nvidia.com/gpu.present": "true",
                                     DOMAIN_LABEL: f"nvl-{i // 8:05d}"})
                         for i, n in enumerate(names)])
    decisions = [0]
    replay = Replay(policies, world, START,
                    on_decision=lambda *_: decisions.__setitem__(0, decisions[0] + 1))
    add_batch = getattr(replay, "add_signals", None)
    # the daemon's settings (healer.app): defaults but the poll interval; a long timeout,
    # because the synthetic server shares this machine's cores
    src = PrometheusSource(url, policies, poll_interval=SCRAPE, timeout=300.0)
    clock = GcClock()
    cpu: list[float] = []
    gc_cpu: list[float] = []
    rss: list[float] = []
    signals: list[int] = []
    no_http = hasattr(src, "parse_poll") and hasattr(src, "poll_queries")
    try:
        for i in range(polls):
            now = START + warm * SCRAPE + i * SCRAPE
            if no_http:
                sigs: list[Signal] = []
                exprs = src.poll_queries(now)
                for _ in range(4):  # round 1, then the follow-ups it calls for (if any)
                    if not exprs:
                        break
                    bodies = {e: await asyncio.to_thread(fetch, url, e, now) for e in exprs}
                    with clock.window():
                        sigs += src.parse_poll(now, bodies)
                    del bodies
                    follow = getattr(src, "follow_up_queries", None)
                    exprs = follow(now) if follow is not None else []
            with clock.window():
                if not no_http:
                    sigs = await src.poll_once(now)
                if add_batch is not None:
                    add_batch(now, sigs)
                else:
                    for s in sigs:
                        replay.add_signal(s)
                replay.run(now)
            spent, gc_spent = clock.take()
            cpu.append(spent)
            gc_cpu.append(gc_spent)
            rss.append(rss_mb())
            signals.append(len(sigs))
    finally:
        src.close()
        clock.close()
    stats = src.last_poll
    return {"path": "parse_poll" if no_http else "poll_once", "nodes": nodes, "polls": polls,
            "cpu": cpu, "gc_cpu": gc_cpu, "rss_mb": rss, "signals": signals,
            "decisions": decisions[0], "open": len(replay.records),
            "queries_per_poll": src.plan.queries_per_poll,
            "failed_queries": stats.failed_queries if stats else None,
            "stale_nodes": stats.stale_nodes if stats else None}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--polls", type=int, required=True)
    p.add_argument("--warm", type=int, default=8, help="scrapes already in Prometheus")
    args = p.parse_args()
    out = asyncio.run(main_async(args.url, args.nodes, args.polls, args.warm))
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
