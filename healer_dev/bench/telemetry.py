"""The ``telemetry`` group: CPU and memory of one poll, parse + evaluate, at fleet scale.

The synthetic Prometheus (:mod:`healer_dev.bench.promsynth`) is served from this process on
127.0.0.1 (:func:`healer.obs.http.serve`); the telemetry loop runs in a fresh subprocess
(:mod:`healer_dev.bench.telemetry_worker`) so that its CPU and RSS are its own, not the server's.
The first poll of a worker (XID lookback on start, plan warm-up) is reported apart; the CPU
per poll figure is the median of the polls after it.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from healer.errors import ConfigError
from healer.obs.http import serve
from healer_dev.devstack.net import LOOPBACK, free_port

from .promsynth import SCRAPE, Answers, Fleet, make_app
from .report import Figure

ROOT = Path(__file__).resolve().parents[2]
WARM = 8  # scrapes "already in Prometheus" before the first poll


@dataclass(frozen=True)
class TelemetrySizes:
    small: int  # nodes for the first CPU figure and the flat-over-time run
    large: int  # nodes for the CPU-per-poll and RSS targets
    polls: int  # polls per worker at each size
    long_polls: int  # the flat-over-time run


def per_poll(cpu: list[float]) -> float:
    """CPU per poll: the mean of the polls after the first (the first, the XID lookback on
    start, has its own figure). The mean, not the median: a full collection of a 10,000-node
    heap costs about a poll's CPU and lands in one poll of several, so a median over a few
    polls says whether that poll was in the middle, not what a poll costs."""
    rest = cpu[1:] or cpu
    return statistics.fmean(rest)


async def run_worker(nodes: int, polls: int, seed: int) -> dict[str, Any]:
    """Serve a synthetic fleet of ``nodes`` and run one telemetry worker against it."""
    start = 1_767_600_000.0
    fleet = Fleet(nodes, seed=seed, fault_at=start + (WARM + 2) * SCRAPE)
    answers = Answers(fleet)
    port = free_port()
    runner = await serve(make_app(answers), LOOPBACK, port)
    proc: asyncio.subprocess.Process | None = None
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "healer_dev.bench.telemetry_worker",
            "--url", f"http://{LOOPBACK}:{port}", "--nodes", str(nodes), "--polls", str(polls),
            "--warm", str(WARM), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, cwd=str(ROOT))
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise ConfigError(f"telemetry worker ({nodes} nodes) exited {proc.returncode}:\n"
                              + err.decode(errors="replace")[-2000:])
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        result["server_requests"] = answers.requests
        result["unknown_queries"] = answers.unknown
        return result
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        await runner.cleanup()


async def run_group(sizes: TelemetrySizes, repeats: int, seed: int,
                    say: Callable[[str], None]) -> list[Figure]:
    small, large = sizes.small, sizes.large
    cpu_small = Figure("telemetry", f"CPU per poll, {small:,} nodes x 8 GPUs", "ms")
    cpu_large = Figure("telemetry", f"CPU per poll, {large:,} nodes x 8 GPUs", "ms", 250.0)
    gc_large = Figure("telemetry", f"of which garbage collection, {large:,} nodes", "ms")
    first = Figure("telemetry", f"CPU of the first poll, {large:,} nodes", "ms")
    rss_large = Figure("telemetry", f"steady RSS, {large:,} nodes", "MiB", 300.0)
    rss_growth = Figure("telemetry", f"RSS growth, poll 3 -> {sizes.long_polls:,}, "
                                     f"{small:,} nodes", "MiB", 10.0)
    w = max(3, sizes.long_polls // 10)
    cpu_drift = Figure("telemetry", f"CPU/poll, median last {w} / polls 2-{w + 1}, "
                                    f"{small:,} nodes", "x", 1.2)
    path = "poll_once"
    for r in range(repeats):
        res = await run_worker(small, sizes.polls, seed + r)
        path = res["path"]
        cpu_small.add(1000 * per_poll(res["cpu"]))
        res = await run_worker(large, sizes.polls, seed + r)
        cpu_large.add(1000 * per_poll(res["cpu"]))
        gc_large.add(1000 * per_poll(res["gc_cpu"]))
        first.add(1000 * res["cpu"][0])
        rss_large.add(res["rss_mb"][-1])
        say(f"  telemetry repeat {r + 1}: {large:,} nodes: {res['queries_per_poll']} queries "
            f"per poll, {statistics.median(res['signals'][1:]):,.0f} signals per poll, "
            f"{res['decisions']} decisions, {res['open']} open, stale nodes "
            f"{res['stale_nodes']}")
        if r == 0:  # the long run once: 1,000 polls take minutes
            t0 = time.monotonic()
            res = await run_worker(small, sizes.long_polls, seed + r)
            cpu, rss = res["cpu"], res["rss_mb"]
            rss_growth.add(rss[-1] - rss[2])
            cpu_drift.add(statistics.median(cpu[-w:]) / statistics.median(cpu[1:w + 1]))
            say(f"  telemetry flat-over-time: {sizes.long_polls:,} polls at {small:,} nodes in "
                f"{time.monotonic() - t0:.0f}s; RSS {rss[2]:.0f} -> {rss[-1]:.0f} MiB")
    rss_growth.note = "one run (the first repeat): RSS after the last poll - after the third"
    cpu_large.note = ("one poll = every query of policies/default.yaml's plan, answered by "
                      "a synthetic Prometheus (dcgm-exporter label sets), parsed by "
                      f"PrometheusSource.{path} and evaluated by Replay; process_time of a "
                      "fresh worker process; the mean of the polls after the first, so a full "
                      "garbage collection is spread over the polls, not in or out of a median "
                      "by chance")
    return [cpu_small, cpu_large, gc_large, first, rss_large, rss_growth, cpu_drift]
