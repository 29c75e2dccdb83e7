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
from .floors import (
    REFERENCE_LOOP_S,
    REFERENCE_RTT_S,
    per_floor,
    reference_loop,
    write_round_trip,
)
from .policies import write_stack_policy
from .report import Figure

#: Targets on ratios to the floors measured in the same run (:mod:`.floors`), so "met" means
#: the same on every machine: each is the absolute target over the floor this project's 2-core
#: machine measured (one API write round trip with 10,000 kwok nodes, the reference loop). A
#: faster API server or CPU lowers the floor, and the absolute target with it.
CORDON_P99_RTTS = 0.100 / REFERENCE_RTT_S     # condition -> cordoned p99 <= 100 ms
BURST_RTTS = 5.0 / REFERENCE_RTT_S            # 1,000 faults cordoned + drain requested <= 5 s
NODE_P99_RTTS = 3.0 / REFERENCE_RTT_S         # the same, p99 per node <= 3 s
IDLE_LOOPS_PER_MIN = 0.02 * 60 / REFERENCE_LOOP_S  # idle CPU < 2 % of a core


@dataclass(frozen=True)
class StackSizes:
    nodes: int
    trials: int
    burst: int
    idle_seconds: float
    qps: float = 0.0
    """The daemon's client-side rate limit (0: none, the bench measures healer's ceiling)."""
    api_burst: int = 1000


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _per_remediation(before: dict[tuple[str, str, str], int],
                     after: dict[tuple[str, str, str], int], n: int
                     ) -> tuple[dict[str, float], float, float]:
    """Writes per remediation by what the daemon was doing, all writes, all reads."""
    by: dict[str, float] = {}
    writes = reads = 0.0
    for key, count in after.items():
        d = count - before.get(key, 0)
        if d <= 0:
            continue
        doing, verb, resource = key
        if resource == "leases":
            continue
        if verb in WRITES:
            by[doing] = by.get(doing, 0.0) + d / n
            writes += d / n
        else:
            reads += d / n
    return by, writes, reads


async def run_group(sizes: StackSizes, repeats: int, seed: int,
                    say: Callable[[str], None]) -> list[Figure]:
    per_repeat = sizes.trials + sizes.burst
    nodes = max(sizes.nodes, per_repeat * repeats + 1)
    n = f"{nodes:,} nodes"
    b = f"{sizes.burst:,}"
    nr50 = Figure("stack", f"condition -> NodeRemediation p50, {n}", "ms")
    nr99 = Figure("stack", f"condition -> NodeRemediation p99, {n}", "ms")
    c50 = Figure("stack", f"condition -> cordoned p50, {n}", "ms")
    c99 = Figure("stack", f"condition -> cordoned p99, {n}", "ms", 100.0)
    burst = Figure("stack", f"burst of {b}: all cordoned + drain requested", "s", 5.0)
    node99 = Figure("stack", f"burst of {b}: p99 per node, cordoned + drain requested", "s", 3.0)
    idle = Figure("stack", f"daemon idle CPU, {b} open", "% core", 2.0)
    rss = Figure("stack", f"daemon RSS, {n}, {b} open", "MiB", 300.0)
    heal = Figure("stack", f"{b} healed -> all remediations closed", "s")
    first = Figure("stack", "first fault after the daemon started -> cordoned", "ms")
    rtt = Figure("stack", "floor: one API write round trip p50 (bench client)", "ms")
    background = Figure("stack", f"API server's own write load before the burst, {n} "
                        "(kwok's node Leases)", "1/s")
    inject = Figure("stack", f"bench: sending the {b} condition patches", "s")
    loop = Figure("stack", "floor: reference loop, 10M additions", "s")
    writes = Figure("stack", "API writes per remediation (burst, to held), all", "1/rem")
    reads = Figure("stack", "API reads per remediation (burst, to held), all", "1/rem")
    steps: dict[str, Figure] = {}
    opens: list[int] = []
    rtts: list[float] = []
    loops: list[float] = []
    with tempfile.TemporaryDirectory(prefix="healer-bench-stack-") as tmp:
        work = Path(tmp)
        cl = BenchCluster(work, f"b{secrets.token_hex(3)}", say)
        try:
            await cl.start_kube()
            names = await cl.create_nodes(nodes)
            await cl.start_daemon(write_stack_policy(work / "policies", cl.run),
                                  qps=sizes.qps, burst=sizes.api_burst)
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
                assert cl.api is not None
                rtts.append(await write_round_trip(cl.api))
                rtt.add(1000 * rtts[-1])
                loops.append(await asyncio.to_thread(reference_loop))
                loop.add(loops[-1])
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
                counted = await cl.requests()
                bg = await cl.apiserver_writes_per_second(10.0)
                background.add(bg)
                t0 = time.monotonic()
                sem = asyncio.Semaphore(64)
                sent: dict[str, float] = {}

                async def fault(node: str, sem: asyncio.Semaphore = sem,
                                sent: dict[str, float] = sent) -> None:
                    async with sem:
                        sent[node] = time.monotonic()
                        await cl.set_condition(node)

                await asyncio.gather(*(fault(x) for x in burst_nodes))
                inject.add(time.monotonic() - t0)

                def all_done(batch: list[str] = burst_nodes) -> bool:
                    return all(x in cl.seen.cordoned and x in cl.seen.drain for x in batch)

                await wait_until(all_done, 120 + sizes.burst, f"{sizes.burst} nodes cordoned",
                                 interval=0.05)
                burst.add(max(max(cl.seen.cordoned[x], cl.seen.drain[x])
                              for x in burst_nodes) - t0)
                per_node = [max(cl.seen.cordoned[x], cl.seen.drain[x]) - sent[x]
                            for x in burst_nodes]
                node99.add(percentile(per_node, 99))
                opens.append(cl.seen.open())

                def all_held(batch: list[str] = burst_nodes) -> bool:
                    return all(cl.seen.node_phase.get(x) == "HeldForCapacity" for x in batch)

                # idle means nothing left to do: every remediation has reached its wait
                await wait_until(all_held, 120 + sizes.burst, f"{sizes.burst} nodes held",
                                 interval=0.1)
                # ... and its Events are written (the queue writes them after the actions)
                last: list[int] = [-1]

                async def quiet(last: list[int] = last) -> bool:
                    now = sum(c for (_, verb, res), c in (await cl.requests()).items()
                              if res != "leases" and verb in WRITES)
                    done, last[0] = now == last[0], now
                    return done

                await wait_until(quiet, 120 + sizes.burst, "the daemon's writes to stop",
                                 interval=1.0)
                by, w, rd = _per_remediation(counted, await cl.requests(), sizes.burst)
                writes.add(w)
                reads.add(rd)
                for doing, v in by.items():
                    steps.setdefault(doing, Figure(
                        "stack", f"API writes per remediation: {doing}", "1/rem")).add(v)
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
                    left = sum(1 for x in burst_nodes if not cl.seen.closed(x))
                    heal.note = (f"repeat {r + 1}: {left} of {sizes.burst} remediations still "
                                 f"open {limit:g}s after their nodes were healed; the "
                                 f"remaining repeats were not run (they need a daemon with "
                                 f"nothing open)")
                    say(f"  stack: {heal.note}")
                    break
                heal.add(time.monotonic() - t_heal)
                slow = max(range(len(to_cordon)), key=to_cordon.__getitem__)
                say(f"  stack repeat {r + 1}: {sizes.trials} trials (slowest: #{slow + 1}, "
                    f"{to_cordon[slow]:.0f} ms), burst of {sizes.burst} in {burst.values[-1]:.1f}s"
                    f", {opens[-1]} remediations open, idle window {sizes.idle_seconds:g}s, "
                    f"{w:.1f} writes per remediation")
        finally:
            await cl.stop()
    rate = (f"client-side rate limit {sizes.qps:g} QPS, burst {sizes.api_burst}"
             if sizes.qps else "no client-side rate limit (--kube-api-qps 0: healer's ceiling)")
    note = ("Slurm stood in for by an in-memory driver in the daemon process (every node idle, "
            "drain accepted at once); times from just before the status PATCH to the watch "
            f"event, after one uncounted warm-up fault; each trial's node healed (admin "
            f"uncordon) before the next; {rate}")
    idle.note = (f"over {sizes.idle_seconds:g}s, the burst's remediations open (held: no "
                 f"spare offered); open per repeat: {', '.join(map(str, opens))}")
    writes.note = ("every write the daemon sent from the burst's first fault until all were "
                   "held and their Events written (Leases left out), over the burst's "
                   "remediations; the rows below split it by what the daemon was doing (a "
                   "record's write, an action, the Event queue)")
    c99.note = note
    ratios = [
        per_floor(c99, rtts, "write round trip", scale=1 / 1000, unit="RTT",
                  target=CORDON_P99_RTTS),
        per_floor(burst, rtts, "write round trip", unit="RTT", target=BURST_RTTS),
        per_floor(node99, rtts, "write round trip", unit="RTT", target=NODE_P99_RTTS),
        per_floor(idle, loops, "reference loop", scale=60 / 100, unit="loops/min",
                  target=IDLE_LOOPS_PER_MIN),
    ]
    node99.note = ("per node, from just before its condition PATCH was sent to its cordon "
                   "and drain seen; 'all cordoned' runs from the first PATCH, so it includes "
                   "the bench's own sending (the row 'bench: sending ...')")
    return [rtt, loop, background, inject, first, nr50, nr99, c50, c99, burst, node99, idle,
            rss, heal, *ratios, writes, *sorted(steps.values(), key=lambda f: f.name), reads]
