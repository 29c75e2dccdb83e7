"""The development command line: ``python -m healer_dev demo|bench|devstack|grafana``, run from
the repository root (``make demo``, ``make bench``, ``make stack``, ``make grafana``). Never
shipped.

The flags ``healer demo|bench|devstack`` had before they left the shipped CLI; the same one-line
errors and exit codes (the shipped CLI's ``Parser`` and ``dispatch``).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from healer import __version__, flags
from healer.cli import Parser, dispatch

PROG = "python -m healer_dev"


def _cmd_demo(args: argparse.Namespace) -> int:
    from healer_dev.demo import run_demo

    return asyncio.run(run_demo(args.scenario, keep=args.keep,
                                operator_version=args.operator_version))


def _cmd_bench(args: argparse.Namespace) -> int:
    from healer_dev.bench.runner import cmd_bench

    return cmd_bench(args)


def _cmd_grafana(args: argparse.Namespace) -> int:
    import sys

    from healer_dev.grafana.render import stale, write

    if args.check:
        bad = stale()
        for rel in bad:
            print(f"stale: {rel} (run make grafana)", file=sys.stderr)
        return 1 if bad else 0
    for rel in write(datasource_uid=args.grafana_datasource_uid):
        print(f"wrote {rel}")
    return 0


def add_demo_flags(d: argparse.ArgumentParser) -> None:
    d.add_argument("--scenario", default="xid79",
                   choices=["xid79", "storm", "degrading", "fabric", "slurm", "dead-node"],
                   help="xid79 (default): XID 79 → warm spare; storm: the guardrails hold a "
                        "fault storm; degrading: checkpoint a job before replacing its node; "
                        "fabric: an InfiniBand port down → warm spare; slurm: Slurm's health "
                        "check drains a node → incident with its reason, the swap holds until "
                        "the owner clears the drain; dead-node: a node dies outright → fenced, "
                        "out of service, its Slurm node serving from a spare")
    d.add_argument("--keep", action="store_true",
                   help="keep the work directory (logs, kubeconfig, slurm.conf) afterwards")
    d.add_argument("--operator-version", default="v1.1.0", choices=["v1.1.0", "v1.0.0"],
                   help="SchedMD slurm-operator version to run (default v1.1.0; built from the "
                        "Go module proxy on first use)")


def add_bench_flags(b: argparse.ArgumentParser) -> None:
    b.add_argument("--repeats", type=flags.integer(1, 1000), default=None,
                   help="runs per figure, printed as min / median / max (default 3; 1 with "
                        "--smoke)")
    b.add_argument("--seed", type=flags.integer(0, 2**32 - 1), default=1,
                   help="seed of the synthetic inputs (default 1)")
    b.add_argument("--only", default=None,
                   help="comma-separated groups to run (default: "
                        "telemetry,engine,stack,promql,shards,deadnode; with --smoke, all but "
                        "deadnode, which needs the machine's one slurm-operator stack)")
    b.add_argument("--smoke", action="store_true",
                   help="tiny sizes, about a minute (what `make test` runs)")
    b.add_argument("--nodes", type=flags.integer(1, 100_000), default=None,
                   help="kwok nodes of the stack group (default 10000; smoke 50)")
    b.add_argument("--burst", type=flags.integer(1, 100_000), default=None,
                   help="stack group: faults at once (default 1,000; --smoke 20)")
    b.add_argument("--kube-api-qps", type=flags.number(0, 100_000), default=0.0,
                   help="stack group: the daemon's client-side rate limit (default 0: none, "
                        "healer's own ceiling; the chart's default is 200, burst 1000)")
    b.add_argument("--long-polls", type=flags.integer(1, 1_000_000), default=None,
                   help="polls of the flat-over-time telemetry run (default 1000; smoke 20)")
    b.add_argument("--json", default="", metavar="FILE", help="also write the figures to FILE")


def build_parser() -> argparse.ArgumentParser:
    from healer_dev.devstack.cli import register as register_devstack

    p: argparse.ArgumentParser = Parser(prog=PROG, description=__doc__,
                                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"healer {__version__}")
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of an unexpected error ($HEALER_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True)

    dm = sub.add_parser("demo", help="start the local real stack, inject a fault and watch "
                                     "healer remediate it end to end")
    add_demo_flags(dm)
    dm.set_defaults(fn=_cmd_demo)

    bn = sub.add_parser("bench", help="measure healer on this machine: telemetry CPU and "
                                      "memory, engine throughput, latency on the local real "
                                      "stack (figures printed with their targets, never "
                                      "asserted)")
    add_bench_flags(bn)
    bn.set_defaults(fn=_cmd_bench)

    gf = sub.add_parser("grafana", help="write the dashboards and the Grafana and "
                                         "prometheus-operator alert files (healer_dev/grafana/), "
                                         "and the chart's copies")
    gf.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 naming each generated file that is stale")
    gf.add_argument("--grafana-datasource-uid", default="prometheus", metavar="UID",
                    help="the Prometheus data source the Grafana alert rules query (default: "
                         "prometheus, kube-prometheus-stack's; --check compares against it)")
    gf.set_defaults(fn=_cmd_grafana)

    register_devstack(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one development command (:func:`healer.cli.dispatch` over :func:`build_parser`)."""
    return dispatch(build_parser(), argv)
