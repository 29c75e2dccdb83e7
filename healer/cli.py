"""The ``healer`` command line. Flags in, one call out; no logic of its own.

The development commands (``demo``, ``bench``, ``devstack``) are not part of ``healer``: they
are ``python -m healer_dev``, run from a checkout.

Every failure is one line on stderr and a non-zero exit: a bad flag (``healer.flags`` types;
usage errors are one line too), a bad file, kubeconfig or URL (a HealerError), and anything
unexpected (``healer: internal error: …``, exit 2; ``--debug`` or ``HEALER_DEBUG=1`` adds the
traceback).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NoReturn

from healer import __version__, flags
from healer.core.slurm_drivers import DRIVERS, SlurmDriverKind
from healer.errors import ConfigError, HealerError, PolicyError
from healer.settings import Settings


def _cmd_validate(args: argparse.Namespace) -> int:
    from healer.policy.load import load_policy_set

    try:
        ps = load_policy_set(args.paths)
    except PolicyError as e:
        for problem in e.problems:  # a file's control characters never reach the terminal
            text = str(problem)
            print("".join(c if c.isprintable() else repr(c)[1:-1] for c in text),
                  file=sys.stderr)
        print(f"{len(e.problems)} problem(s); nothing loaded", file=sys.stderr)
        return 1
    for p in ps.policies:
        print(f"ok  {p.name:28s} mode={p.mode.value:8s} rules={len(p.rules):2d}  {p.source}")
    for n in ps.nodesets.items:
        where = f"{n.namespace}/{n.nodeset}" if n.nodeset else "-"
        print(f"ok  nodeset {n.name:20s} cluster={n.cluster} driver={n.slurm.driver} "
              f"nodeSet={where}  {n.source}")
    more = f", {len(ps.nodesets.items)} NodeSets" if ps.nodesets else ""
    print(f"{len(ps.policies)} policies valid{more} (digest {ps.digest})")
    if not args.kubeconfig:
        return 0
    from healer.selection import live_report

    live = asyncio.run(live_report(ps, args.kubeconfig, args.context))
    for line in live.lines:
        print(line)
    for found in live.problems:
        print(_one_line(found), file=sys.stderr)
    if live.problems:
        print(f"{len(live.problems)} problem(s) on the cluster", file=sys.stderr)
        return 1
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
    paths = args.policies
    if paths is None:  # not given: the policies/ directory here, if there is one
        paths = ["policies"] if os.path.isdir("policies") else []
    text, known = explain_xid(args.code, paths)  # policies given and invalid: PolicyError
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

    changed = write_generated(not args.write, build_parser)
    if changed and not args.write:
        print("stale: " + ", ".join(changed), file=sys.stderr)
        return 1
    for c in changed:
        print(f"wrote {c}")
    return 0


def _settings(args: argparse.Namespace) -> Settings:
    from healer.settings import (
        HttpSettings,
        KubeSettings,
        LeaderSettings,
        SlurmSettings,
        TelemetrySettings,
        TopologySettings,
    )

    leader = LeaderSettings(enabled=not args.no_leader_election, lease_name=args.lease_name,
                            lease_duration=args.lease_duration,
                            renew_deadline=args.renew_deadline, retry_period=args.retry_period)
    if args.identity:
        leader = replace(leader, identity=args.identity)
    return Settings(
        policies=tuple(args.policies), dry_run=args.dry_run, log_level=args.log_level,
        policy_reload_seconds=args.policy_reload_interval,
        policy_load_timeout=args.policy_load_timeout,
        policy_load_memory_mb=args.policy_load_memory,
        log_json=None if args.log_format == "auto" else args.log_format == "json",
        shutdown_grace=args.shutdown_grace, callback_url=args.callback_url,
        kube=KubeSettings(kubeconfig=args.kubeconfig, context=args.context,
                          namespace=args.namespace,
                          install_crd=args.install_crd, api_qps=args.kube_api_qps,
                          api_burst=args.kube_api_burst),
        leader=leader,
        slurm=SlurmSettings(driver=args.slurm_driver, slurmrestd_url=args.slurmrestd_url,
                            token_secret=args.slurmrestd_token_secret,
                            slurm_conf=args.slurm_conf, nodeset_namespace=args.slurm_namespace,
                            nodeset=args.nodeset, state_interval=args.slurm_state_interval),
        topology=TopologySettings(source=args.topology_source,
                                  topograph_url=args.topograph_url,
                                  topograph_request=args.topograph_request),
        telemetry=TelemetrySettings(
            prometheus_url=args.prometheus_url, poll_interval=args.poll_interval,
            bearer_token_file=args.prometheus_bearer_token_file,
            ca_file=args.prometheus_ca_file,
            insecure_skip_verify=args.prometheus_insecure_skip_verify,
            host_labels=tuple(args.host_labels or ("Hostname", "hostname"))),
        http=HttpSettings(host=args.http_host, port=args.http_port,
                          debug_state=args.debug_state),
    )


def add_run_flags(r: argparse.ArgumentParser) -> None:
    env = os.environ.get
    k = r.add_argument_group("Kubernetes")
    k.add_argument("--kubeconfig", default=env("KUBECONFIG"),
                   help="kubeconfig file ($KUBECONFIG; default: the in-cluster ServiceAccount)")
    k.add_argument("--context", default=None, help="kubeconfig context (default: current)")
    k.add_argument("--namespace", default=env("POD_NAMESPACE", "healer-system"),
                   type=flags.dns_label,
                   help="namespace of healer's Lease and hook Jobs ($POD_NAMESPACE; default "
                        "healer-system)")
    k.add_argument("--kube-api-qps", type=flags.number(0, 100_000), default=200.0,
                   metavar="QPS",
                   help="client-side rate limit: API requests per second once the burst is "
                        "spent, as client-go's (0: none; Lease renewals are exempt; the API "
                        "server's 429 Retry-After is honoured either way; default 200)")
    k.add_argument("--kube-api-burst", type=flags.integer(1, 1_000_000), default=1000,
                   metavar="N",
                   help="client-side rate limit: API requests that may be sent at once "
                        "(default 1000)")
    k.add_argument("--install-crd", action="store_true",
                   help="create the NodeRemediation CRD if it is missing (development only; "
                        "install it from deploy/crds/ in production)")
    p = r.add_argument_group("policies")
    p.add_argument("--policies", nargs="+", default=[env("HEALER_POLICIES", "policies")],
                   help="policy files or directories, reloaded when they change "
                        "($HEALER_POLICIES; default policies)")
    p.add_argument("--dry-run", action="store_true",
                   help="cap every policy at dryRun: record every step as intent, change "
                        "nothing")
    p.add_argument("--policy-reload-interval", type=flags.seconds(0.1, 86400), default=10.0,
                   metavar="SECONDS",
                   help="how often the policy files are looked at; they are reloaded when "
                        "they changed (default 10)")
    p.add_argument("--policy-load-timeout", type=flags.seconds(1, 3600), default=30.0,
                   metavar="SECONDS",
                   help="a policy load (its own child process) is stopped after this long and "
                        "the policies in force stay (default 30)")
    p.add_argument("--policy-load-memory", type=flags.integer(64, 1 << 20), default=512,
                   metavar="MIB",
                   help="address space of the policy loader's child process; a load that "
                        "needs more fails and the policies in force stay (default 512)")
    le = r.add_argument_group("leader election (a coordination.k8s.io Lease)")
    le.add_argument("--no-leader-election", action="store_true",
                    help="act without a Lease (one replica only)")
    le.add_argument("--lease-name", default="healer-leader", type=flags.dns_subdomain,
                    help="default healer-leader")
    le.add_argument("--identity", default="", type=flags.text_value(128),
                    help="this replica's identity (default: $POD_NAME, else host-pid)")
    le.add_argument("--lease-duration", type=flags.seconds(1, 3600), default=15.0,
                    help="seconds a lease is valid without renewal; longer than "
                        "--renew-deadline (default 15)")
    le.add_argument("--renew-deadline", type=flags.seconds(1, 3600), default=10.0,
                    help="seconds the leader keeps trying to renew before it stops acting "
                         "(default 10)")
    le.add_argument("--retry-period", type=flags.seconds(1, 600), default=2.0,
                    help="seconds between lease attempts (default 2)")
    sl = r.add_argument_group("Slurm")
    sl.add_argument("--slurm-driver", choices=list(DRIVERS),
                    default=env("HEALER_SLURM_DRIVER", SlurmDriverKind.SLINKY),
                    help="how healer drains and undrains ($HEALER_SLURM_DRIVER; default "
                         f"{SlurmDriverKind.SLINKY}): " + "; ".join(
                             f"{k}: {d.summary}" for k, d in DRIVERS.items()))
    sl.add_argument("--slurmrestd-url", default=env("HEALER_SLURMRESTD_URL", ""), type=flags.url,
                    help="slurmrestd base URL, e.g. http://slurm-restapi.slurm:6820 "
                         "($HEALER_SLURMRESTD_URL); with the slinky driver it lists and "
                         "signals jobs")
    sl.add_argument("--slurmrestd-token-secret", default=env("HEALER_SLURMRESTD_TOKEN", ""),
                    type=flags.secret_ref,
                    help="NAMESPACE/NAME[:KEY] of the Secret holding the slurmrestd JWT "
                         "(Slinky's Token secret; $HEALER_SLURMRESTD_TOKEN)")
    sl.add_argument("--slurm-conf", default=env("SLURM_CONF", ""), type=flags.regular_file,
                    help="slurm.conf for the scontrol driver ($SLURM_CONF)")
    sl.add_argument("--slurm-namespace", default=env("HEALER_SLURM_NAMESPACE", "slurm"),
                    type=flags.dns_label,
                    help="namespace of the Slinky NodeSet ($HEALER_SLURM_NAMESPACE; default "
                         "slurm)")
    sl.add_argument("--nodeset", default=env("HEALER_NODESET", ""), type=flags.dns_subdomain,
                    help="the Slinky NodeSet whose slurmd pods move to spares "
                         "($HEALER_NODESET)")
    sl.add_argument("--slurm-state-interval", type=flags.seconds(1, 3600, zero=True),
                    default=10.0,
                    help="seconds between reads of every Slurm node's state, which the "
                         "guardrails count (drained, DOWN, NOT_RESPONDING, ...); 0: none, "
                         "only Kubernetes is counted (default 10)")
    tp = r.add_argument_group("topology (the replacement's topology.slinky.slurm.net/spec)")
    tp.add_argument("--topology-source", choices=["labels", "topograph"],
                    default=env("HEALER_TOPOLOGY_SOURCE", "labels"),
                    help="labels: computed from the Node's topograph fabric labels; topograph: "
                         "POST topograph's /v1/generate once per incident and wait until it "
                         "annotates the Node ($HEALER_TOPOLOGY_SOURCE; default labels)")
    tp.add_argument("--topograph-url", default=env("HEALER_TOPOGRAPH_URL", ""), type=flags.url,
                    help="topograph's API, e.g. http://topograph.topograph:49021 "
                         "($HEALER_TOPOGRAPH_URL)")
    tp.add_argument("--topograph-request", default=env("HEALER_TOPOGRAPH_REQUEST", ""),
                    type=flags.regular_file,
                    metavar="FILE",
                    help="JSON body of /v1/generate: provider, engine (slinky with "
                         "useDynamicNodes: true), nodes; mount it from a Secret when it holds "
                         "provider credentials ($HEALER_TOPOGRAPH_REQUEST)")
    t = r.add_argument_group("telemetry (DCGM through Prometheus)")
    t.add_argument("--prometheus-url", default=env("HEALER_PROMETHEUS_URL", ""), type=flags.url,
                   help="Prometheus-compatible query URL (Prometheus, Thanos, Mimir; "
                        "$HEALER_PROMETHEUS_URL); empty: node conditions only")
    t.add_argument("--poll-interval", type=flags.seconds(0.1, 3600), default=15.0,
                   help="seconds between polls, one query per rule for the whole fleet "
                        "(default 15)")
    t.add_argument("--prometheus-bearer-token-file", default=env("HEALER_PROMETHEUS_TOKEN_FILE",
                                                                 ""), type=flags.regular_file,
                   help="file holding a bearer token, re-read every poll (managed "
                        "Prometheus; $HEALER_PROMETHEUS_TOKEN_FILE)")
    t.add_argument("--prometheus-ca-file", default="", type=flags.regular_file,
                   help="CA bundle that signs Prometheus' serving certificate")
    t.add_argument("--prometheus-insecure-skip-verify", action="store_true",
                   help="do not verify Prometheus' TLS certificate (logged once)")
    t.add_argument("--host-label", action="append", dest="host_labels", default=None,
                   type=flags.label_name,
                   help="label naming the node in DCGM series; repeat for several "
                        "(default: Hostname and hostname)")
    h = r.add_argument_group("HTTP (/metrics, /healthz, /readyz, /debug/state, hook acks)")
    h.add_argument("--http-host", default=env("HEALER_HTTP_HOST", "127.0.0.1"), type=flags.host,
                   help="the one address to serve on (default 127.0.0.1; in a pod, its IP; "
                        "$HEALER_HTTP_HOST)")
    h.add_argument("--debug-state", action="store_true",
                   help="serve /debug/state (redacted JSON of workers and remediations; "
                        "default off)")
    h.add_argument("--http-port", type=flags.port, default=8080, help="default 8080")
    h.add_argument("--callback-url", default=env("HEALER_CALLBACK_URL", ""), type=flags.url,
                   help="this controller's /v1/hooks/ack URL as webhook receivers reach it "
                        "($HEALER_CALLBACK_URL)")
    o = r.add_argument_group("process")
    o.add_argument("--log-level", default="info", type=str.lower,
                   choices=["debug", "info", "warning", "error"],
                   help="debug, info, warning, error")
    o.add_argument("--log-format", choices=["auto", "json", "console"], default="auto",
                   help="auto: JSON unless stderr is a terminal")
    o.add_argument("--shutdown-grace", type=flags.seconds(0, 3600), default=10.0,
                   help="seconds in-flight actions get after SIGTERM (default 10)")


def _cmd_run(args: argparse.Namespace) -> int:
    from healer.app import run
    from healer.run_checks import check_run_settings

    settings = _settings(args)
    check_run_settings(settings)  # flags that cannot work together: one line, exit 2
    return asyncio.run(run(settings))


def _cmd_status(args: argparse.Namespace) -> int:
    from healer.status import status

    return asyncio.run(status(args.kubeconfig, show_all=args.all, as_json=args.json))


def _cmd_report(args: argparse.Namespace) -> int:
    from healer.report import report

    return asyncio.run(report(args.kubeconfig, since=args.since, fmt=args.format,
                              nodes=tuple(args.nodes or ()), gpus_per_node=args.gpus_per_node))


def _cmd_backtest(args: argparse.Namespace) -> int:
    from healer.backtest.cli import cmd_backtest

    return cmd_backtest(args)


def _backtest_flags(p: argparse.ArgumentParser) -> None:
    from healer.backtest.cli import add_backtest_flags

    add_backtest_flags(p)


def _cmd_agent(args: argparse.Namespace) -> int:
    from healer.agent.main import cmd_agent

    return cmd_agent(args)


def _agent_flags(p: argparse.ArgumentParser) -> None:
    from healer.agent.main import add_agent_flags

    add_agent_flags(p)


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (the full usage is one ``--help`` away), and flags
    added when first needed: ``add_flags`` (a subcommand's, importing its module) runs before
    this parser first parses or prints its help."""

    def __init__(self, *args: Any,
                 add_flags: Callable[[argparse.ArgumentParser], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._add_flags = add_flags

    def _flags_now(self) -> None:
        if self._add_flags is not None:
            add, self._add_flags = self._add_flags, None
            add(self)

    def format_help(self) -> str:
        self._flags_now()
        return super().format_help()

    def format_usage(self) -> str:
        self._flags_now()
        return super().format_usage()

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        self._flags_now()
        ns, rest = super().parse_known_args(args, namespace)
        for a in self._actions:  # Python 3.11 turns `--flag=--` into [] past the flag's type
            if isinstance(a, argparse._StoreAction) and a.nargs is None \
                    and isinstance(getattr(ns, a.dest, None), list):
                self.error(f"argument {'/'.join(a.option_strings) or a.dest}: expected one "
                           "value, got '--'")
        return ns, rest

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """Every shipped command. Subcommands import lazily: a command's module when it runs
    (``_cmd_*``), the flags of ``agent`` and ``backtest`` (defined beside their commands) when
    that subcommand is parsed or its help printed, so ``healer run`` imports neither the agent
    (NVML) nor the backtest (tests/unit/test_shipping.py)."""
    p: argparse.ArgumentParser = Parser(prog="healer", description=__doc__,
                                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"healer {__version__}")
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of an unexpected error ($HEALER_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="validate policy files (exit 1 on any problem)")
    v.add_argument("paths", nargs="+", help="policy files or directories")
    v.add_argument("--kubeconfig", default=None, metavar="FILE",
                   help="also list the cluster's Nodes and print, per NodeSet and policy, how "
                        "many nodes and warm spares it selects now; a node that is both a "
                        "NodeSet's node and a spare, or a NodeSet that serves nothing, is a "
                        "problem (exit 1)")
    v.add_argument("--context", default=None, help="kubeconfig context (default: current)")
    v.set_defaults(fn=_cmd_validate)

    w = sub.add_parser("workflow", help="print the remediation state machine (Mermaid)")
    w.add_argument("--json", action="store_true", help="the transition table as JSON")
    w.add_argument("--markdown", action="store_true", help="docs/workflow.md as generated")
    w.set_defaults(fn=_cmd_workflow)

    x = sub.add_parser("xid", help="what an XID means and what healer will do about it")
    x.add_argument("code", nargs="?", type=flags.integer(0, 1 << 31))
    x.add_argument("--policies", nargs="*", default=None,
                   help="policy files or directories (default: ./policies if it exists); "
                        "any that cannot be loaded is an error (exit 2)")
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

    r = sub.add_parser("run", help="run the controller")
    add_run_flags(r)
    r.set_defaults(fn=_cmd_run)

    st = sub.add_parser("status", help="open and recent remediations, from the API")
    st.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    st.add_argument("--all", action="store_true", help="include closed remediations")
    st.add_argument("--json", action="store_true")
    st.set_defaults(fn=_cmd_status)

    rp = sub.add_parser("report", help="outcomes, measured: time to detect, per step and to "
                                       "replacement (p50/p90/p99), GPU-hours lost, time "
                                       "between incidents, false-positive rate")
    rp.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    rp.add_argument("--since", type=flags.duration(1, 400 * 86400), default=7 * 86400.0,
                    metavar="DURATION",
                    help="incidents opened this long ago or later: 12h, 7d, 2w (default 7d)")
    rp.add_argument("--format", choices=["text", "json"], default="text",
                    help="text: tables; json: every figure and every incident, sorted keys")
    rp.add_argument("--node", action="append", dest="nodes", type=flags.dns_subdomain,
                    metavar="NODE", help="only this node's incidents; repeat for several "
                                         "(NodeRemediations are cluster-scoped: there is no "
                                         "namespace to choose)")
    rp.add_argument("--gpus-per-node", type=flags.integer(1, 1024), default=8, metavar="N",
                    help="GPUs of a node whose Node has no nvidia.com/gpu capacity or "
                         "nvidia.com/gpu.count label, or no longer exists (default 8)")
    rp.set_defaults(fn=_cmd_report)

    bt = sub.add_parser("backtest", help="replay historical telemetry from Prometheus through "
                                         "the engine: what healer would have done, and when",
                        add_flags=_backtest_flags)
    bt.set_defaults(fn=_cmd_backtest)

    ag = sub.add_parser("agent", help="the node agent (DaemonSet): GPUHealthy condition and "
                                      "XID Events from NVML", add_flags=_agent_flags)
    ag.set_defaults(fn=_cmd_agent)
    return p


def _one_line(text: object, limit: int = 600) -> str:
    """``text`` on one line: whitespace runs become one space, control characters (a
    terminal escape in a file name, say) are shown escaped, long text is cut."""
    line = " ".join(str(text).split())
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)
    return line if len(line) <= limit else line[:limit] + "…"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``healer`` command (:func:`dispatch` over :func:`build_parser`)."""
    return dispatch(build_parser(), argv)


def dispatch(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command it names (``args.fn``); every failure is a short
    message on stderr, prefixed with the parser's ``prog``, and a non-zero exit: 2 for bad
    input (flags, files, settings, policies) and unexpected errors, 1 for a HealerError while
    running (an unreachable API server, a refused request). The development CLI
    (``python -m healer_dev``) runs its commands through this too."""
    prog = parser.prog
    debug = os.environ.get("HEALER_DEBUG", "") not in ("", "0") or "--debug" in (
        sys.argv[1:] if argv is None else argv)
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help/--version (0) or a one-line usage error (2)
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        return int(args.fn(args))
    except PolicyError as e:  # one line per problem: each names file:line and field
        for problem in e.problems:
            print(f"{prog}: {_one_line(problem)}", file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"{prog}: {_one_line(e)}", file=sys.stderr)
        return 2
    except HealerError as e:
        print(f"{prog}: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except BaseException as e:  # never a traceback unless asked for
        if debug:
            traceback.print_exc()
        print(f"{prog}: internal error: {type(e).__name__}: {_one_line(e)} (run with --debug "
              "or HEALER_DEBUG=1 for the traceback)", file=sys.stderr)
        return 2
