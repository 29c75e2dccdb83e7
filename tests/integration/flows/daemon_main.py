"""The real daemon (``healer.app.run``, exactly as ``healer run`` builds it) for the flow tests.

Only the telemetry input and the runtime's timing are replaced: signals come from a JSON-lines
file (:class:`healer_dev.testing.FileSignals`) instead of Prometheus, and the warm-up is short.
The Slurm driver (slinky, scontrol or slurmrestd), the workload move, the spare pool, the
topology annotation, the checkpoint and repair hooks are the real adapters ``healer.app``
builds from the ``healer run`` flags.

    python -m tests.integration.flows.daemon_main <healer run flags> --signals F.jsonl
        [--warmup SECONDS] [--crash-log FILE]

``--crash-log FILE``: kill -9 this very process at the first step boundary not yet listed in
FILE (and list it): right after a write that advanced the remediation, or right after a
step's action ran, before its outcome was persisted. Started again and again, the daemon
visits every boundary once.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from healer.app import Overrides, run
from healer.cli import _settings, add_run_flags
from healer.runtime.controller import RuntimeSettings
from healer_dev.testing import FileSignals
from tests.integration.daemon_process import crash_hooks


def main() -> int:
    p = argparse.ArgumentParser()
    add_run_flags(p)
    p.add_argument("--signals", required=True, help="JSON lines of signals to feed")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--crash-log", default=None,
                   help="kill -9 this process at the first step boundary not listed here")
    args = p.parse_args()
    hooks = crash_hooks(Path(args.crash_log) if args.crash_log else None)

    overrides = Overrides(telemetry=[FileSignals(Path(args.signals))],
                          runtime=RuntimeSettings(warmup_seconds=args.warmup, retry_delay=1.0),
                          **hooks)
    return asyncio.run(run(_settings(args), overrides))


if __name__ == "__main__":
    raise SystemExit(main())
