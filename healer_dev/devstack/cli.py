"""``python -m healer_dev devstack up|down|env|status``: a detached local control plane for the
demo and for poking at healer by hand (``make stack`` / ``make stack-down``).

``up`` starts :class:`~healer_dev.devstack.kube.KubeStack` in ``--dir`` (default ``.devstack``),
records pids and ports in ``DIR/state.json`` and returns, leaving the processes running; it
prints ``export`` lines, so ``eval "$(python -m healer_dev devstack up)"`` points kubectl at it.
``down`` stops what ``DIR`` records (logs stay unless ``--purge``). Every function returns an
exit code.

Also runnable on its own: ``python -m healer_dev.devstack.cli up``.
"""

from __future__ import annotations

import argparse
import http.client
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from healer import flags
from healer.errors import ConfigError
from healer_dev.devstack.kube import STATE_FILE, KubeStack

DEFAULT_DIR = ".devstack"
#: written into a directory ``up`` owns; ``up`` only ever wipes a directory that has it
MARKER = ".healer-devstack"


def _stack_dir(args: argparse.Namespace) -> Path:
    return Path(args.dir).expanduser().resolve()


def _export_lines(stack: KubeStack) -> list[str]:
    dirs = ":".join(str(d) for d in stack.binaries.dirs())
    return [
        f"export KUBECONFIG={shlex.quote(str(stack.kubeconfig))}",
        f'export PATH={shlex.quote(dirs)}:"$PATH"',
    ]


def _recorded(d: Path) -> KubeStack | None:
    """The stack recorded in ``d``, or None when nothing is recorded there."""
    if not (d / STATE_FILE).is_file():
        return None
    return KubeStack.from_state(d)


def _prepare_dir(d: Path) -> None:
    """Make ``d`` an empty directory that ``up`` owns (refusing a foreign, non-empty one)."""
    if d.exists():
        if not d.is_dir():
            raise ConfigError(f"{d} exists and is not a directory")
        if any(d.iterdir()) and not (d / MARKER).exists():
            raise ConfigError(
                f"{d} is not empty and was not made by `python -m healer_dev devstack up`; "
                "pick another --dir or remove it"
            )
        shutil.rmtree(d)
    d.mkdir(parents=True)
    (d / MARKER).write_text("made by `python -m healer_dev devstack up`; "
                            "`python -m healer_dev devstack down` stops it\n")


def cmd_up(args: argparse.Namespace) -> int:
    d = _stack_dir(args)
    old = _recorded(d)
    if old is not None:
        running = old.running()
        if running and all(running.values()):
            print(f"devstack already running in {d}", file=sys.stderr)
            for line in _export_lines(old):
                print(line)
            return 0
        print(f"devstack in {d} is partly gone; stopping what is left", file=sys.stderr)
        old.stop()
    _prepare_dir(d)
    stack = KubeStack(
        d,
        controllers=not args.no_controllers,
        kwok=not args.no_kwok,
        start_timeout=args.timeout,
    )
    print(f"starting the local control plane in {d} ...", file=sys.stderr)
    stack.start()
    stack.write_state()
    took = stack.timings.get("start", 0.0)
    print(f"devstack up in {took:.1f}s: {stack.server}", file=sys.stderr)
    for line in stack.describe():
        print(f"  {line}", file=sys.stderr)
    for line in _export_lines(stack):
        print(line)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    d = _stack_dir(args)
    stack = _recorded(d)
    if stack is None:
        print(f"no devstack recorded in {d}; nothing to stop", file=sys.stderr)
    else:
        names = ", ".join(stack.pids) or "nothing"
        stack.stop()
        print(f"stopped {names} ({stack.timings.get('stop', 0.0):.1f}s)", file=sys.stderr)
    if args.purge and d.is_dir() and (d / MARKER).exists():
        shutil.rmtree(d)
        print(f"removed {d}", file=sys.stderr)
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    d = _stack_dir(args)
    stack = _recorded(d)
    if stack is None:
        print(f"no devstack recorded in {d}; run `python -m healer_dev devstack up` first",
              file=sys.stderr)
        return 1
    for line in _export_lines(stack):
        print(line)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    d = _stack_dir(args)
    stack = _recorded(d)
    if stack is None:
        print(f"no devstack recorded in {d}")
        return 1
    print(f"devstack in {d}: {stack.server}")
    for line in stack.describe():
        print(f"  {line}")
    running = stack.running()
    try:
        status, body = stack.request("GET", "/readyz")
        ready = status == 200
        print(f"  /readyz: HTTP {status} {body if isinstance(body, str) else ''}".rstrip())
    except (OSError, http.client.HTTPException) as e:
        ready = False
        print(f"  /readyz: unreachable ({e})")
    return 0 if ready and running and all(running.values()) else 1


def register(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Add ``devstack`` (with ``up``, ``down``, ``env``, ``status``) to a parser's subcommands.

    Each leaf sets ``fn`` (``args.fn(args) -> int``), as the other healer commands do.
    """
    p = subparsers.add_parser(
        "devstack", help="a local Kubernetes control plane (etcd, kube-apiserver, kwok, ...)"
    )
    sub = p.add_subparsers(dest="devstack_command", required=True)

    def with_dir(q: argparse.ArgumentParser) -> argparse.ArgumentParser:
        q.add_argument(
            "--dir", default=DEFAULT_DIR, help=f"state directory (default {DEFAULT_DIR})"
        )
        return q

    up = with_dir(sub.add_parser("up", help="start the stack detached; prints export lines"))
    up.add_argument(
        "--no-controllers",
        action="store_true",
        help="no kube-controller-manager or kube-scheduler (a bare apiserver, like envtest)",
    )
    up.add_argument("--no-kwok", action="store_true", help="no kwok (no fake Nodes)")
    up.add_argument(
        "--timeout", type=flags.seconds(1, 3600), default=60.0,
        help="seconds each component may take to start"
    )
    up.set_defaults(fn=cmd_up)

    down = with_dir(sub.add_parser("down", help="stop everything the state directory records"))
    down.add_argument("--purge", action="store_true", help="also remove the state directory")
    down.set_defaults(fn=cmd_down)

    env = with_dir(sub.add_parser("env", help="print the export lines (KUBECONFIG, PATH)"))
    env.set_defaults(fn=cmd_env)

    status = with_dir(sub.add_parser("status", help="pids, ports and /readyz of the stack"))
    status.set_defaults(fn=cmd_status)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m healer_dev.devstack.cli up|down|env|status`` (= ``python -m healer_dev
    devstack``)."""
    parser = argparse.ArgumentParser(prog="python -m healer_dev")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["devstack", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.fn(args))
    except ConfigError as e:
        print(f"healer: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
