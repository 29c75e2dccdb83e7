"""pytest fixtures for real local Slurm clusters (``healer_dev.devstack.slurm.LocalSlurm``):
Slurm 22.05 (the host's Debian packages), 24.11 and 26.05 (Debian roots, ADR 0017).

Load them from a conftest with ``from tests.integration.slurm_fixtures import *`` (as
``tests/integration/slurm/conftest.py`` does) or list this module in a top-level
``pytest_plugins``.

* ``slurm_clusters`` (session): ``clusters(version)`` starts, once per session, slurmctld + 4
  slurmd (gpu-0..3) + slurmrestd with JWT of that Slurm; all are stopped at the end of the
  session. If one cannot start, every test using it FAILS with the reason (the daemon and the
  tail of its log); nothing is skipped.
* ``local_slurm`` (session): the 22.05 one; ``slurm`` (function): it, reset before the test (no
  jobs, every node idle).
* ``any_slurm`` (function, parametrized over :data:`VERSIONS`): each version's cluster in turn,
  reset before the test.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from healer.errors import ConfigError
from healer_dev.devstack.slurm import LocalSlurm, SlurmVersion

__all__ = ["HOLD_SCRIPT", "VERSIONS", "any_slurm", "local_slurm", "release", "running_slurm",
           "slurm", "slurm_clusters", "wait_for_file"]

#: every Slurm the local stack runs, each the real program
VERSIONS = tuple(SlurmVersion)

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
def slurm_clusters(tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Callable[[SlurmVersion], LocalSlurm]]:
    started: dict[SlurmVersion, LocalSlurm] = {}

    def cluster(version: SlurmVersion) -> LocalSlurm:
        if version not in started:
            c = LocalSlurm(tmp_path_factory.mktemp(f"slurm-{version.value}"), with_restd=True,
                           version=version)
            try:
                c.start()
            except ConfigError as e:
                pytest.fail(f"the local Slurm {version} cluster did not start:\n{e}",
                            pytrace=False)
            started[version] = c
        return started[version]

    try:
        yield cluster
    finally:
        for c in started.values():
            c.stop()


def _reset(cluster: LocalSlurm) -> LocalSlurm:
    try:
        cluster.reset()
    except ConfigError as e:
        pytest.fail(f"the local Slurm {cluster.version} cluster could not be reset:\n{e}",
                    pytrace=False)
    return cluster


@pytest.fixture(scope="session")
def local_slurm(slurm_clusters: Callable[[SlurmVersion], LocalSlurm]) -> LocalSlurm:
    return slurm_clusters(SlurmVersion.V22_05)


@pytest.fixture
def slurm(local_slurm: LocalSlurm) -> LocalSlurm:
    return _reset(local_slurm)


@pytest.fixture(params=VERSIONS, ids=[f"slurm-{v.value}" for v in VERSIONS])
def any_slurm(request: pytest.FixtureRequest,
              slurm_clusters: Callable[[SlurmVersion], LocalSlurm]) -> LocalSlurm:
    return _reset(slurm_clusters(request.param))


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
