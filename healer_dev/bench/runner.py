"""``python -m healer_dev bench``: groups run, the table out (and ``--json``). The flags are in
:mod:`healer_dev.cli` (``python -m healer_dev bench --help``).

Sizes: the full run (default) and ``--smoke`` (tiny sizes, one repeat unless ``--repeats``
says otherwise; what ``make test`` runs). A group that cannot start a component fails the
bench with the reason; nothing is skipped. Every process a group starts is stopped by that
group (also on an error, Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from healer.errors import ConfigError

from . import deadnode, engine, floors, promql, shards, stack, telemetry
from .report import Figure, table, write_json

GROUPS = ("telemetry", "engine", "stack", "promql", "shards", "deadnode")
#: what --smoke runs by default: every group but deadnode (it needs the machine's one
#: slurm-operator stack, which the integration suite holds while it runs)
SMOKE_GROUPS = ("telemetry", "engine", "stack", "promql", "shards")


def _groups(only: str) -> list[str]:
    wanted = [g.strip() for g in only.split(",") if g.strip()]
    bad = [g for g in wanted if g not in GROUPS]
    if bad or not wanted:
        raise ConfigError(f"--only: unknown group(s) {', '.join(bad) or '(none)'}; "
                          f"choose from {', '.join(GROUPS)}")
    return wanted


async def run_bench(args: argparse.Namespace, say: Callable[[str], None]) -> list[Figure]:
    smoke = bool(args.smoke)
    repeats = args.repeats if args.repeats is not None else (1 if smoke else 3)
    if repeats < 1:
        raise ConfigError("--repeats must be at least 1")
    figures: list[Figure] = []
    only = args.only if args.only is not None else ",".join(SMOKE_GROUPS if smoke else GROUPS)
    for g in _groups(only):
        t0 = time.monotonic()
        say(f"[{g}]")
        if g in ("telemetry", "engine"):  # the machine's speed, just before the group runs
            loops = [await asyncio.to_thread(floors.reference_loop) for _ in range(repeats)]
        if g == "telemetry":
            sizes = (telemetry.TelemetrySizes(100, 200, 4, args.long_polls or 20) if smoke
                     else telemetry.TelemetrySizes(1000, 10_000, 16, args.long_polls or 1000))
            tel = await telemetry.run_group(sizes, repeats, args.seed, say)
            figures += tel + _telemetry_ratios(tel, loops)
        elif g == "engine":
            eng = await asyncio.to_thread(
                engine.run_group, [1000, 2000] if smoke else [10_000, 100_000], repeats,
                args.seed, say)
            figures += eng + _engine_ratios(eng, loops)
        elif g == "stack":
            qps = float(getattr(args, "kube_api_qps", 0.0) or 0.0)
            st = (stack.StackSizes(args.nodes or 50, 10, args.burst or 20, 5.0, qps) if smoke
                  else stack.StackSizes(args.nodes or 10_000, 50, args.burst or 1000, 30.0, qps))
            figures += await stack.run_group(st, repeats, args.seed, say)
        elif g == "deadnode":
            figures += await deadnode.run_group(repeats, say)
        elif g == "shards":
            figures += await asyncio.to_thread(
                shards.run_group, 800 if smoke else 10_000, [1, 4, 16], args.seed, say)
        else:
            figures += await promql.run_group(promql.PromqlSizes(1 if smoke else 3), repeats,
                                              args.seed, say)
        say(f"  ({g}: {time.monotonic() - t0:.0f}s)")
    return figures


def _telemetry_ratios(figs: list[Figure], loops: list[float]) -> list[Figure]:
    """Each CPU-per-poll figure over the reference loop (target: the 250 ms at 10,000 nodes
    over this project's machine's loop, :data:`floors.REFERENCE_LOOP_S`)."""
    out = [floors.per_floor(f, loops, "reference loop", scale=1 / 1000, unit="loops",
                            target=(f.target / 1000 / floors.REFERENCE_LOOP_S
                                    if f.target else None))
           for f in figs if f.unit == "ms" and f.name.startswith("CPU per poll")]
    loop = Figure("telemetry", "floor: reference loop, 10M additions", "s")
    for v in loops:
        loop.add(v)
    return [loop, *out]


def _engine_ratios(figs: list[Figure], loops: list[float]) -> list[Figure]:
    """decisions/s times the reference loop: decisions per loop (the same on any machine)."""
    return [floors.per_floor(f, [1 / x for x in loops], "reference loop speed", unit="/loop",
                             target=(f.target * floors.REFERENCE_LOOP_S if f.target else None),
                             bound=">=")
            for f in figs if f.unit == "1/s"]


async def _main(args: argparse.Namespace) -> int:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)

    def say(text: str) -> None:
        print(text, flush=True)

    started = time.time()
    try:
        figures = await run_bench(args, say)
    except ConfigError as e:
        print(f"healer bench: failed: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
    print()
    print(f"healer bench ({'smoke' if args.smoke else 'full'}, seed {args.seed}, "
          f"{os.cpu_count()} CPUs, {platform.python_implementation()} "
          f"{platform.python_version()}); figures are reported, never asserted")
    for line in table(figures):
        print(line)
    if args.json:
        meta: dict[str, Any] = {"smoke": bool(args.smoke), "seed": args.seed,
                                "started": started, "cpus": os.cpu_count(),
                                "python": platform.python_version()}
        write_json(args.json, figures, meta)
        print(f"wrote {args.json}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("healer bench: interrupted; everything it started was stopped", file=sys.stderr)
        return 130
