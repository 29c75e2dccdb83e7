"""The ``shards`` group: the sharding plan of docs/scaling.md, checked by simulation.

The same fault trace (1 % of the nodes failing over a day, 3 % in a five-minute storm) runs
through one leader for the whole fleet and through 4 and 16 failure-domain shards, each with
its share of the count limits (:mod:`healer_dev.sim.shards`). Figures: the most remediations in
flight at once and the most nodes out at once, fleet-wide, against the limits the operator set;
how many faults a spare replaced, and how fast. A static split is safe only while every count
limit is at least the number of shards: the rows show where it is not.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from healer_dev.sim.shards import default_guardrails, simulate, trace

from .policies import load_default
from .report import Figure


def run_group(nodes: int, shard_counts: list[int], seed: int,
              say: Callable[[str], None]) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="healer-bench-") as tmp:
        policies = default_guardrails(load_default(Path(tmp), permissive=False))
    faults = trace(nodes, seed)
    figs: list[Figure] = []
    for k in shard_counts:
        f = simulate(policies, nodes, k, faults)
        who = "one leader" if k == 1 else f"{k} shards, split limits"
        say(f"  shards: {who}: {f.replaced} of {f.faults} faults replaced, in flight at most "
            f"{f.peak_active} (limit {f.max_concurrent}), out at most {f.peak_out} "
            f"(limit {f.limit})")
        active = Figure("shards", f"most in flight at once, {who}", "",
                        float(f.max_concurrent))
        out = Figure("shards", f"most nodes out at once, {who}", "", float(f.limit))
        done = Figure("shards", f"faults replaced, {who}", "")
        p50 = Figure("shards", f"fault -> spare serving p50, {who}", "s")
        p99 = Figure("shards", f"fault -> spare serving p99, {who}", "s")
        for fig, v in ((active, f.peak_active), (out, f.peak_out), (done, f.replaced),
                       (p50, f.replace_p50), (p99, f.replace_p99)):
            fig.add(v)
        done.note = f"of {f.faults} faults in the trace"
        active.note = (f"{nodes:,} simulated nodes; the target is the maxConcurrent of the "
                       f"policy the faults fall under (or the fleet's, if lower); "
                       f"{f.held_by_breaker} storm faults held by a breaker")
        figs += [active, out, done, p50, p99]
    return figs
