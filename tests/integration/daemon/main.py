"""The real daemon (healer.app.run) with file-backed fakes for Slurm, the workload move,
checkpoints, validation and telemetry, so a test can kill -9 it and start it again.

    python -m tests.integration.daemon.main <healer run flags> --fake-slurm S.json --signals F

With ``--real-slurm`` the Slurm drivers, the workload move and the checkpoints are the real
ones the settings and the policies' SlurmNodeSet documents name (telemetry and validation stay
file-backed).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from healer.app import Overrides, run
from healer.cli import _settings, add_run_flags
from healer.ports import SlurmHandles
from healer.runtime.controller import RuntimeSettings
from healer_dev.testing import FakeCheckpoint, FakeSlurm, FakeValidator, FakeWorkload, FileSignals
from tests.integration.daemon_process import crash_hooks


def main() -> int:
    p = argparse.ArgumentParser()
    add_run_flags(p)
    p.add_argument("--fake-slurm", default=None, help="FakeSlurm state file (JSON)")
    p.add_argument("--real-slurm", action="store_true",
                   help="the real Slurm drivers (no --fake-slurm)")
    p.add_argument("--signals", required=True, help="JSON lines of signals to feed")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--crash-log", default=None,
                   help="kill -9 this very process at the first step boundary not listed in "
                        "this file (and list it): right after a write that advanced the "
                        "remediation, or right after a step's action ran, before its outcome "
                        "was persisted")
    p.add_argument("--real-checkpoint-hooks", action="store_true",
                   help="the real checkpoint hooks (webhook, job, slurm-signal on the fake "
                        "Slurm) instead of the file-backed fake")
    args = p.parse_args()
    hooks = crash_hooks(Path(args.crash_log) if args.crash_log else None)
    telemetry = [FileSignals(Path(args.signals))]
    runtime = RuntimeSettings(warmup_seconds=args.warmup, retry_delay=1.0)
    if args.real_slurm:
        return asyncio.run(run(_settings(args), Overrides(
            validator=FakeValidator(), telemetry=telemetry, runtime=runtime, **hooks)))
    if not args.fake_slurm:
        p.error("--fake-slurm or --real-slurm is required")
    slurm = FakeSlurm(path=Path(args.fake_slurm))
    # the fake lists its nodes by Kubernetes node, holds and deletes records (no job history)
    handles = SlurmHandles(slurm, states=slurm, hold=slurm, records=slurm)
    overrides = Overrides(slurm=handles, workload=FakeWorkload(slurm),
                          checkpoint=None if args.real_checkpoint_hooks
                          else FakeCheckpoint(slurm), validator=FakeValidator(),
                          telemetry=telemetry, runtime=runtime, **hooks)
    return asyncio.run(run(_settings(args), overrides))


if __name__ == "__main__":
    raise SystemExit(main())
