"""The ``healer`` command line. Flags in, one call out; no logic of its own."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from healer import __version__
from healer.errors import ConfigError, PolicyError


def _cmd_validate(args: argparse.Namespace) -> int:
    from healer.policy.load import load_policy_set

    try:
        ps = load_policy_set(args.paths)
    except PolicyError as e:
        for problem in e.problems:
            print(problem, file=sys.stderr)
        print(f"{len(e.problems)} problem(s); nothing loaded", file=sys.stderr)
        return 1
    for p in ps.policies:
        print(f"ok  {p.name:28s} mode={p.mode.value:8s} rules={len(p.rules):2d}  {p.source}")
    print(f"{len(ps.policies)} policies valid (digest {ps.digest})")
    return 0


def _cmd_workflow(args: argparse.Namespace) -> int:
    from healer.docs import mermaid, workflow_markdown

    if args.json:
        from healer.core.machine import describe_table

        print(json.dumps(describe_table(), indent=2))
    elif args.markdown:
        print(workflow_markdown(), end="")
    else:
        print(mermaid(), end="")
    return 0


def _cmd_xid(args: argparse.Namespace) -> int:
    from healer.docs import explain_xid, xid_table

    if args.list:
        print(xid_table(), end="")
        return 0
    if args.code is None:
        print("healer xid: give an XID code or --list", file=sys.stderr)
        return 2
    text, known = explain_xid(args.code, args.policies)
    print(text, end="")
    return 0 if known else 1


def _cmd_schema(args: argparse.Namespace) -> int:
    from healer.policy.schema import json_schema

    print(json.dumps(json_schema(), indent=2, sort_keys=True))
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from healer.sim.scenario import simulate

    return simulate(args.scenario, verbose=args.verbose)


def _cmd_docs(args: argparse.Namespace) -> int:
    from healer.docs import write_generated

    changed = write_generated(check=not args.write)
    if changed and not args.write:
        print("stale: " + ", ".join(changed), file=sys.stderr)
        return 1
    for c in changed:
        print(f"wrote {c}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="healer", description=__doc__)
    p.add_argument("--version", action="version", version=f"healer {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="validate policy files (exit 1 on any problem)")
    v.add_argument("paths", nargs="+", help="policy files or directories")
    v.set_defaults(fn=_cmd_validate)

    w = sub.add_parser("workflow", help="print the remediation state machine (Mermaid)")
    w.add_argument("--json", action="store_true", help="the transition table as JSON")
    w.add_argument("--markdown", action="store_true", help="docs/workflow.md as generated")
    w.set_defaults(fn=_cmd_workflow)

    x = sub.add_parser("xid", help="what an XID means and what healer will do about it")
    x.add_argument("code", nargs="?", type=int)
    x.add_argument("--policies", nargs="*", default=["policies"],
                   help="policy files or directories (default: policies)")
    x.add_argument("--list", action="store_true", help="the whole catalog")
    x.set_defaults(fn=_cmd_xid)

    s = sub.add_parser("schema", help="print the JSON Schema of policy files")
    s.set_defaults(fn=_cmd_schema)

    sim = sub.add_parser("simulate", help="replay a scripted fault scenario through the engine")
    sim.add_argument("scenario", help="a scenarios/*.yaml file")
    sim.add_argument("-v", "--verbose", action="store_true", help="also print every action")
    sim.set_defaults(fn=_cmd_simulate)

    d = sub.add_parser("docs", help="check (or --write) the generated docs and schema")
    d.add_argument("--write", action="store_true")
    d.set_defaults(fn=_cmd_docs)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except ConfigError as e:
        print(f"healer: {e}", file=sys.stderr)
        return 2
    except PolicyError as e:
        print(f"healer: invalid policies:\n{e}", file=sys.stderr)
        return 2
