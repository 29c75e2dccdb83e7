"""``healer backtest``: its flags (:func:`add_backtest_flags`) and the command
(:func:`cmd_backtest`: parse the flags, read and replay the history, print the report; 0, or 2
with one line on bad flags, bad policies or an unreachable Prometheus). What the command does
is in the package's docstring (:mod:`healer.backtest`). Light to import: the replay, the
simulator it drives and the Prometheus client are imported when the command runs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from healer.backtest.inputs import (
    DEFAULT_NODE_LABELS,
    MAX_RANGE_DAYS,
    MAX_STEPS,
    MIN_STEP,
    check_range,
    parse_labels,
    parse_seconds,
    parse_time,
)
from healer.core.timefmt import rfc3339
from healer.errors import ConfigError, HealerError


def add_backtest_flags(p: argparse.ArgumentParser) -> None:
    """The flags of ``healer backtest``."""
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="Prometheus (or Thanos/Mimir) URL holding the DCGM history")
    p.add_argument("--policies", nargs="+", required=True, metavar="PATH",
                   help="policy files or directories")
    p.add_argument("--from", dest="start", required=True, metavar="TIME",
                   help="start: RFC3339 (2026-01-05T09:00:00Z), epoch seconds or now-7d; from "
                        f"1970 on, at most {MAX_RANGE_DAYS} days before --to")
    p.add_argument("--to", dest="end", default="now", metavar="TIME",
                   help="end (default: now)")
    p.add_argument("--step", default="60s",
                   help=f"evaluation step (default: 60s; at least {MIN_STEP:g}s, at most "
                        f"{MAX_STEPS:,} steps in the range)")
    p.add_argument("--json", action="store_true", help="the report as JSON (stable, sorted)")
    p.add_argument("--spares", type=int, default=None, metavar="N",
                   help="warm spares in the pool (default: unlimited; the report says how many "
                        "were needed)")
    p.add_argument("--node-labels", default=DEFAULT_NODE_LABELS, metavar="K=V,...",
                   help="labels of every node seen in the telemetry, when no --kubeconfig "
                        f"(default: {DEFAULT_NODE_LABELS})")
    p.add_argument("--kubeconfig", default=None,
                   help="read the real Nodes' labels from this cluster")
    p.add_argument("--as-configured", action="store_true",
                   help="keep observe/dryRun modes (default: evaluate every policy as act)")
    p.add_argument("--action-latency", default="1s",
                   help="how long every simulated action takes (default: 1s)")
    p.add_argument("--replacement-latency", default="45s",
                   help="a moved slurmd serves on the spare after this long (default: 45s)")
    p.add_argument("--validation-latency", default="2m",
                   help="a validation passes after this long (default: 2m)")
    p.add_argument("--repair-after", default=None, metavar="DURATION",
                   help="repairs pass after this long (default: no repair result arrives)")
    p.add_argument("--bearer-token-file", default=None,
                   help="Prometheus bearer token file, sent with every query (read before the "
                        "first and again before each, so a rotated token is picked up)")
    p.add_argument("--ca-file", default=None, help="CA bundle for Prometheus' TLS")
    p.add_argument("--insecure-skip-verify", action="store_true",
                   help="do not verify Prometheus' TLS certificate")


def cmd_backtest(args: argparse.Namespace, *, out: Callable[[str], Any] | None = None) -> int:
    """``healer backtest``: 0 on success, 2 on bad flags/policies or an unreachable Prometheus."""
    import asyncio

    from healer.adapters.clock import SYSTEM_CLOCK
    from healer.adapters.prometheus.access import read_bearer_token
    from healer.backtest.replay import backtest
    from healer.errors import PolicyError
    from healer.obs.logging import setup
    from healer.policy.load import load_policy_set
    from healer.sim.world import Latencies

    write = out or (lambda text: sys.stdout.write(text))
    try:
        now = SYSTEM_CLOCK.now()
        start = parse_time(args.start, now)
        end = parse_time(args.end, now)
        step = parse_seconds(args.step, "--step")
        lat = Latencies(parse_seconds(args.action_latency, "--action-latency"),
                        parse_seconds(args.replacement_latency, "--replacement-latency"),
                        parse_seconds(args.validation_latency, "--validation-latency"))
        repair = None if args.repair_after is None else parse_seconds(args.repair_after,
                                                                      "--repair-after")
        check_range(start, end, step, now)
        if args.spares is not None and args.spares < 0:
            raise ConfigError("--spares: expected a count ≥ 0")
        labels = parse_labels(args.node_labels)
        opts: dict[str, Any] = {}
        if args.bearer_token_file:
            read_bearer_token(args.bearer_token_file)  # fails now, not after the first query
            opts["bearer_token_file"] = args.bearer_token_file
        policies = load_policy_set(args.policies)
        if args.ca_file:
            opts["ca_file"] = args.ca_file
        if args.insecure_skip_verify:
            opts["verify"] = False
        setup("warning")  # logs go to stderr: stdout is the report
        report = asyncio.run(backtest(
            args.prometheus, policies, start, end, step=step, node_labels=labels,
            kubeconfig=args.kubeconfig, spares=args.spares, as_configured=args.as_configured,
            latencies=lat, repair_after=repair, source_options=opts))
    except PolicyError as e:
        print(f"healer backtest: invalid policies:\n{e}", file=sys.stderr)
        return 2
    except HealerError as e:
        print(f"healer backtest: {e}", file=sys.stderr)
        return 2
    write(report.to_json() if args.json else report.table())
    if not report.signals:
        print(f"healer backtest: no telemetry between {rfc3339(start, millis=True)} and "
              f"{rfc3339(end, millis=True)} "
              "(check the range, the Prometheus retention and the host labels)",
              file=sys.stderr)
    t = report.timings
    print(f"healer backtest: {report.signals} signals fetched in {t.get('fetch', 0):.1f}s, "
          f"replayed in {t.get('replay', 0):.1f}s", file=sys.stderr)
    return 0
