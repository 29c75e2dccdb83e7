"""The ``stack`` group: the healer daemon against a real kube-apiserver with kwok nodes.

A node condition is patched (``GPUHealthy=False``, reason ``XidFatal``, as healer's agent
publishes it) and the bench watches the API for the NodeRemediation and for the cordon:

* latency, one fault at a time (``trials`` per repeat, each on a fresh node): from just before
  the status PATCH is sent to the watch event of the NodeRemediation's creation, and of the node
  turning unschedulable; p50 and p99 per repeat. After each trial the node is healed (condition
  back to True, then an admin's uncordon, which cancels the remediation) and the bench waits
  until the remediation is closed, so each fault meets an idle daemon;
* a burst: ``burst`` nodes patched at once (permissive guardrails): seconds until every one is
  cordoned and its drain step recorded (the drain is requested before the cordon: healer drains
  in Slurm first and cordons once Slurm reports the node drained);
* idle: once every one of the burst's remediations waits for a spare (HeldForCapacity, none
  offered), the daemon's RSS and its CPU over an idle window, as % of one core (from
  /proc/PID/stat). Then the burst's
  nodes are healed the same way and the next repeat starts with nothing open.

Slurm is stood in for by :class:`healer_dev.bench.daemon.MemorySlurm` (in the daemon process).
"""

from __future__ import annotations

import asyncio
import math
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from healer.errors import ConfigError

from .cluster import BenchCluster, wait_until
from .policies import write_stack_policy
from .report import Figure


@dataclass(frozen=True)
class StackSizes:
    nodes: int
    trials: int
    burst: int
    idle_seconds: float


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


async def run_group(sizes: StackSizes, repeats: int, seed: int,
                    say: Callable[[str], None]) -> list[Figure]:
    per_repeat = sizes.trials + sizes.burst
    nodes = max(sizes.nodes, per_repeat * repeats + 1)
    n = f"{nodes:,} nodes"
    nr50 = Figure("stack", f"condition -> NodeRemediation p50, {n}", "ms")
    nr99 = Figure("stack", f"condition -> NodeRemediation p99, {n}", "ms")
    c50 = Figure("stack", f"condition -> cordoned p50, {n}", "ms")
    c99 = Figure("stack", f"condition -> cordoned p99, {n}", "ms", 100.0)
    burst = Figure("stack", f"burst of {sizes.burst}: all cordoned + drain requested", "s", 10.0)
    idle = Figure("stack", f"daemon idle CPU, {sizes.burst} open", "% core", 2.0)
    rss = Figure("stack", f"daemon RSS, {sizes.burst} open", "MiB")
    heal = Figure("stack", f"{sizes.burst} healed -> all remediations closed", "s")
    first = Figure("stack", "first fault after the daemon started -> cordoned", "ms")
    opens: list[int] = []
    with tempfile.TemporaryDirectory(prefix="healer-bench-stack-") as tmp:
        work = Path(tmp)
        cl = BenchCluster(work, f"b{secrets.token_hex(3)}", say)
        try:
            await cl.start_kube()
            names = await cl.create_nodes(nodes)
            await cl.start_daemon(write_stack_policy(work / "policies", cl.run))
            await cl.start_watches()  # after the daemon installed the CRD
            # one warm-up fault, not counted: the first one after a start pays lazy setup
            warm = names[-1]
            t0 = time.monotonic()
            await cl.set_condition(warm)
            await wait_until(lambda: warm in cl.seen.cordoned, 60, f"{warm} cordoned (warm-up)")
            first.add(1000 * (cl.seen.cordoned[warm] - t0))
            await cl.heal([warm], 60)
            # the daemon has listed every node (readyz) and is idle: nothing is open yet
            for r in range(repeats):
                pool = names[r * per_repeat:(r + 1) * per_repeat]
                trial_nodes, burst_nodes = pool[:sizes.trials], pool[sizes.trials:]
                to_nr, to_cordon = [], []
                for node in trial_nodes:
                    t0 = time.monotonic()
                    await cl.set_condition(node)
                    await wait_until(lambda node=node: node in cl.seen.cordoned  # type: ignore[misc]
                                     and node in cl.seen.remediation, 60,
                                     f"{node} cordoned after its GPUHealthy=False")
                    to_nr.append(1000 * (cl.seen.remediation[node] - t0))
                    to_cordon.append(1000 * (cl.seen.cordoned[node] - t0))
                    await cl.heal([node], 60)
                nr50.add(percentile(to_nr, 50))
                nr99.add(percentile(to_nr, 99))
                c50.add(percentile(to_cordon, 50))
                c99.add(percentile(to_cordon, 99))
                t0 = time.monotonic()
                sem = asyncio.Semaphore(64)

                async def fault(node: str, sem: asyncio.Semaphore = sem) -> None:
                    async with sem:
                        await cl.set_condition(node)

                await asyncio.gather(*(fault(b) for b in burst_nodes))

                def all_done(batch: list[str] = burst_nodes) -> bool:
                    return all(b in cl.seen.cordoned and b in cl.seen.drain for b in batch)

                await wait_until(all_done, 120 + sizes.burst, f"{sizes.burst} nodes cordoned",
                                 interval=0.05)
                burst.add(max(max(cl.seen.cordoned[b], cl.seen.drain[b])
                              for b in burst_nodes) - t0)
                opens.append(cl.seen.open())

                def all_held(batch: list[str] = burst_nodes) -> bool:
                    return all(cl.seen.node_phase.get(b) == "HeldForCapacity" for b in batch)

                # idle means nothing left to do: every remediation has reached its wait
                await wait_until(all_held, 120 + sizes.burst, f"{sizes.burst} nodes held",
                                 interval=0.1)
                cpu0, w0 = cl.daemon_cpu_seconds(), time.monotonic()
                await asyncio.sleep(sizes.idle_seconds)  # the measurement window itself
                cpu1, w1 = cl.daemon_cpu_seconds(), time.monotonic()
                idle.add(100 * (cpu1 - cpu0) / (w1 - w0))
                rss.add(cl.daemon_rss_mb())
                t_heal = time.monotonic()
                limit = 60 + sizes.burst / 5
                try:
                    await cl.heal(burst_nodes, limit)
                except ConfigError:
                    left = sum(1 for b in burst_nodes if not cl.seen.closed(b))
                    heal.note = (f"repeat {r + 1}: {left} of {sizes.burst} remediations still "
                                 f"open {limit:g}s after their nodes were healed; the "
                                 f"remaining repeats were not run (they need a daemon with "
                                 f"nothing open)")
                    say(f"  stack: {heal.note}")
                    break
                heal.add(time.monotonic() - t_heal)
                slow = max(range(len(to_cordon)), key=to_cordon.__getitem__)
                say(f"  stack repeat {r + 1}: {sizes.trials} trials (slowest: #{slow + 1}, "
                    f"{to_cordon[slow]:.0f} ms), burst of {sizes.burst}, {opens[-1]} "
                    f"remediations open, idle window {sizes.idle_seconds:g}s")
        finally:
            await cl.stop()
    note = ("Slurm stood in for by an in-memory driver in the daemon process (every node idle, "
            "drain accepted at once); times from just before the status PATCH to the watch "
            "event, after one uncounted warm-up fault; each trial's node healed (admin "
            "uncordon) before the next")
    idle.note = (f"over {sizes.idle_seconds:g}s, the burst's remediations open (held: no "
                 f"spare offered); open per repeat: {', '.join(map(str, opens))}")
    c99.note = note
    return [first, nr50, nr99, c50, c99, burst, idle, rss, heal]
