"""pytest fixtures for a real local Slurm 22.05 (``healer_dev.devstack.slurm.LocalSlurm``).

Load them from a conftest with ``from tests.integration.slurm_fixtures import *`` (as
``tests/integration/slurm/conftest.py`` does) or list this module in a top-level
``pytest_plugins``.

* ``local_slurm`` (session): slurmctld + 4 slurmd (gpu-0..3) + slurmrestd v0.0.38 with JWT;
  stopped at the end of the session. If Slurm cannot start, every test using it FAILS with
  the reason (the daemon and the tail of its log); nothing is skipped.
* ``slurm`` (function): the same cluster, reset before the test (no jobs, every node idle).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from healer.errors import ConfigError
from healer_dev.devstack.slurm import LocalSlurm

__all__ = ["HOLD_SCRIPT", "local_slurm", "release", "running_slurm", "slurm", "wait_for_file"]

#: A job that traps USR1 (appending to ``$OUTDIR/usr1-<jobid>``) and runs until the test
#: creates ``$OUTDIR/release-<jobid>`` (at most 60 s). Short sleeps so the trap runs promptly.
HOLD_SCRIPT = """
trap 'echo "USR1 $(date +%s.%N)" >> "$OUTDIR/usr1-$SLURM_JOB_ID"' USR1
for _ in $(seq 1 600); do
  [ -e "$OUTDIR/release-$SLURM_JOB_ID" ] && exit 0
  sleep 0.1
done
"""


@contextmanager
def running_slurm(workdir: Path, **options: Any) -> Iterator[LocalSlurm]:
    """A started ``LocalSlurm(workdir, **options)``, stopped on exit; the test FAILS with the
    reason when it cannot start."""
    cluster = LocalSlurm(workdir, **options)
    try:
        cluster.start()
    except ConfigError as e:
        pytest.fail(f"the local Slurm cluster did not start:\n{e}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    with running_slurm(tmp_path_factory.mktemp("slurm"), with_restd=True) as cluster:
        yield cluster


@pytest.fixture
def slurm(local_slurm: LocalSlurm) -> LocalSlurm:
    try:
        local_slurm.reset()
    except ConfigError as e:
        pytest.fail(f"the local Slurm cluster could not be reset:\n{e}", pytrace=False)
    return local_slurm


def release(cluster: LocalSlurm, job_id: int) -> None:
    """Let a HOLD_SCRIPT job finish."""
    (cluster.jobdir / f"release-{job_id}").touch()


def wait_for_file(path: Path, timeout: float = 10.0) -> str:
    """Poll until ``path`` exists and is not empty; its text."""
    deadline = time.monotonic() + timeout
    while True:
        if path.exists() and path.stat().st_size:
            return path.read_text()
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.02)
