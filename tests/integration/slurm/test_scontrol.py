"""ScontrolDriver against each real Slurm: 22.05 (the host's Debian packages), 24.11 and 26.05
(Debian roots, ADR 0017): slurmctld + 4 slurmd on loopback, with jobs. Their outputs differ
(``scontrol --json`` from 23.02 on, ``Topology=`` and ``INVALID_REG`` in 26.05's node lines);
every test runs on all three."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from healer.adapters.slurm import ScontrolDriver
from healer.errors import ConfigError, NotFoundError, PermanentError, TransientError
from healer.ports import SlurmNodeState, Undrain
from healer_dev.devstack.slurm import LocalSlurm, SlurmStartupError, SlurmVersion
from tests.integration.slurm_fixtures import HOLD_SCRIPT, release, wait_for_file

pytestmark = pytest.mark.integration

REASON = "healer: XID 79 on GPU 3 (incident inc-7f3a)"


@pytest.fixture
def slurm(any_slurm: LocalSlurm) -> LocalSlurm:
    """Every test here runs on each Slurm version (``any_slurm`` is parametrized)."""
    return any_slurm


@pytest.fixture
def driver(slurm: LocalSlurm) -> ScontrolDriver:
    return ScontrolDriver(env=slurm.env(), timeout=20)


async def poll(read: Callable[[], Awaitable[SlurmNodeState]],
               ok: Callable[[SlurmNodeState], bool], within: float = 15.0) -> SlurmNodeState:
    deadline = time.monotonic() + within
    while True:
        st = await read()
        if ok(st):
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"state never matched within {within} s; last: {st}")
        await asyncio.sleep(0.05)


async def test_drain_busy_node_is_draining_then_drained_then_undrained(
        slurm: LocalSlurm, driver: ScontrolDriver) -> None:
    job = slurm.submit(HOLD_SCRIPT, "gpu-1", name="train")
    slurm.wait_job(job, ["RUNNING"])
    assert [j.id for j in await driver.jobs_on("gpu-1")] == [job]

    assert await driver.drain("gpu-1", REASON) is True
    st = await driver.state("gpu-1")
    assert st.base in ("MIXED", "ALLOCATED")
    assert st.drain
    assert st.busy
    assert not st.drained  # DRAINING
    assert st.reason == REASON
    assert st.reason_is_ours
    assert st.reason_user == "root"
    assert await driver.drain("gpu-1", REASON) is True  # idempotent
    assert slurm.job_state(job) == "RUNNING"  # a drain never touches the running job

    release(slurm, job)
    t0 = time.monotonic()
    st = await poll(lambda: driver.state("gpu-1"), lambda s: s.drained)
    drained_after = time.monotonic() - t0
    assert st.base == "IDLE"
    assert st.reason == REASON
    assert drained_after < 10

    # not this incident
    assert await driver.undrain("gpu-1", incident="inc-other") is Undrain.NOT_OURS
    assert (await driver.state("gpu-1")).drained
    assert await driver.undrain("gpu-1", incident="inc-7f3a") is Undrain.CLEARED
    st = await poll(lambda: driver.state("gpu-1"), lambda s: not s.drain and s.registered)
    assert st.base == "IDLE"
    # 22.05 and 26.05 clear the reason with the drain; 24.11 keeps the last reason on the
    # undrained node (even across RESUME; ADR 0017): only the DRAIN flag says it is drained
    assert st.reason == (REASON if slurm.version is SlurmVersion.V24_11 else "")
    assert not st.drained_by_healer("inc-7f3a")
    # nothing left to undo
    assert await driver.undrain("gpu-1", incident="inc-7f3a") is Undrain.NOT_OURS


async def test_usr1_reaches_the_batch_script_trap(slurm: LocalSlurm,
                                                  driver: ScontrolDriver) -> None:
    job = slurm.submit(HOLD_SCRIPT, "gpu-2", name="ckpt")
    idle = slurm.submit(HOLD_SCRIPT, "gpu-3", name="elsewhere")
    slurm.wait_job(job, ["RUNNING"])
    slurm.wait_job(idle, ["RUNNING"])
    marker = slurm.jobdir / f"usr1-{job}"

    assert await driver.signal_jobs("gpu-2", "SIGUSR1", batch_only=True) == [job]
    assert wait_for_file(marker).count("USR1") == 1
    assert slurm.job_state(job) == "RUNNING"  # trapped: the job lives on

    assert await driver.signal_jobs("gpu-2", "usr1") == [job]  # --full: shell and children
    deadline = time.monotonic() + 10
    while marker.read_text().count("USR1") < 2:
        assert time.monotonic() < deadline, "second USR1 never reached the trap"
        await asyncio.sleep(0.02)
    assert slurm.job_state(job) == "RUNNING"
    assert not (slurm.jobdir / f"usr1-{idle}").exists()  # only gpu-2's job was signalled
    release(slurm, job)
    release(slurm, idle)


async def test_signal_with_no_running_job_signals_nothing(driver: ScontrolDriver) -> None:
    assert await driver.signal_jobs("gpu-0", "USR1") == []
    with pytest.raises(PermanentError):
        await driver.signal_jobs("gpu-0", "USR1; rm -rf /")


async def test_someone_elses_drain_is_never_overwritten_or_cleared(
        slurm: LocalSlurm, driver: ScontrolDriver) -> None:
    admin = "disk replacement ticket 4711 Key=val [x]"
    slurm.run(["scontrol", "update", "nodename=gpu-3", "state=drain", f"reason={admin}"])

    assert await driver.drain("gpu-3", REASON) is False
    st = await driver.state("gpu-3")
    assert st.drained
    assert st.reason == admin
    assert not st.reason_is_ours

    assert await driver.undrain("gpu-3") is Undrain.NOT_OURS
    assert await driver.undrain("gpu-3", incident="inc-7f3a") is Undrain.NOT_OURS
    st = await driver.state("gpu-3")
    assert st.drained
    assert st.reason == admin


async def test_a_down_node_with_someone_elses_reason_stays_theirs(
        slurm: LocalSlurm, driver: ScontrolDriver) -> None:
    """DOWN with an admin's reason is someone else's, like their drain (ADR 0016)."""
    slurm.run(["scontrol", "update", "nodename=gpu-0", "state=down", "reason=broken"])
    assert await driver.drain("gpu-0", REASON) is False
    st = await driver.state("gpu-0")
    assert st.down
    assert st.reason == "broken"
    assert await driver.undrain("gpu-0", incident="inc-7f3a") is Undrain.NOT_OURS
    st = await driver.state("gpu-0")
    assert st.down
    assert st.reason == "broken"


async def test_undrain_keeps_a_down_node_down(slurm: LocalSlurm, driver: ScontrolDriver) -> None:
    # DOWN with healer's own reason (Slurm took down a node healer was draining)
    slurm.run(["scontrol", "update", "nodename=gpu-0", "state=down", f"reason={REASON}"])
    assert await driver.drain("gpu-0", REASON) is True
    st = await driver.state("gpu-0")
    assert st.down
    assert st.drain
    assert st.reason == REASON
    assert await driver.undrain("gpu-0", incident="inc-7f3a") is Undrain.CLEARED
    st = await driver.state("gpu-0")
    assert st.down
    assert not st.drain  # UNDRAIN, not RESUME: still out of service


async def test_requeue_only_requeueable_jobs(slurm: LocalSlurm, driver: ScontrolDriver) -> None:
    yes = slurm.submit(HOLD_SCRIPT, "gpu-0", name="requeue me", args=["--requeue"])
    no = slurm.submit(HOLD_SCRIPT, "gpu-0", name="keep|me", args=["--no-requeue"])
    slurm.wait_job(yes, ["RUNNING"])
    slurm.wait_job(no, ["RUNNING"])
    jobs = {j.id: j for j in await driver.jobs_on("gpu-0")}
    assert jobs[yes].requeue
    assert not jobs[no].requeue
    assert jobs[no].name == "keep|me"
    assert jobs[no].nodes == ("gpu-0",)

    assert await driver.requeue_jobs("gpu-0") == [yes]
    assert slurm.wait_job(yes, ["PENDING", "REQUEUED", "CONFIGURING", "RUNNING"]) != ""
    assert "Restarts=1" in slurm.run(["scontrol", "show", "job", "-o", str(yes)]).stdout
    assert slurm.job_state(no) == "RUNNING"
    release(slurm, no)


async def test_errors_are_mapped(driver: ScontrolDriver) -> None:
    with pytest.raises(NotFoundError):
        await driver.state("gpu-99")
    with pytest.raises(NotFoundError):
        await driver.drain("gpu-99", REASON)
    with pytest.raises(NotFoundError):
        await driver.jobs_on("gpu-99")
    with pytest.raises(PermanentError, match="must start with"):
        await driver.drain("gpu-0", "XID 79")
    with pytest.raises(PermanentError, match="invalid Slurm node name"):
        await driver.state("gpu-[0-3]")
    with pytest.raises(PermanentError, match="not installed"):
        await ScontrolDriver(bindir="/nonexistent").state("gpu-0")


async def test_slurmctld_down_is_transient_then_recovers(slurm: LocalSlurm,
                                                         driver: ScontrolDriver) -> None:
    job = slurm.submit(HOLD_SCRIPT, "gpu-2", name="survivor")
    slurm.wait_job(job, ["RUNNING"])
    assert await driver.drain("gpu-2", REASON) is True

    slurm.stop_slurmctld()
    try:
        with pytest.raises(TransientError, match="Unable to contact slurm controller"):
            await driver.state("gpu-2")
        with pytest.raises(TransientError, match="timed out"):
            await ScontrolDriver(env=slurm.env(), timeout=0.5).drain("gpu-2", REASON)
    finally:
        slurm.start_slurmctld()

    st = await poll(lambda: driver.state("gpu-2"), lambda s: s.registered)
    assert st.drain
    assert st.busy
    assert st.reason == REASON  # state survived the restart
    assert [j.id for j in await driver.jobs_on("gpu-2")] == [job]
    release(slurm, job)
    await poll(lambda: driver.state("gpu-2"), lambda s: s.drained)
    assert await driver.undrain("gpu-2", incident="inc-7f3a") is Undrain.CLEARED


# ---------------------------------------------------------------------------------------------
# the devstack itself


async def test_a_killed_slurmd_comes_back(slurm: LocalSlurm, driver: ScontrolDriver) -> None:
    slurm.kill_slurmd("gpu-3")
    slurm.start_slurmd("gpu-3")
    st = await driver.state("gpu-3")
    assert st.registered
    assert st.base == "IDLE"


def test_a_cluster_that_cannot_start_names_the_daemon_and_its_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write = LocalSlurm._write_config

    def broken(self: LocalSlurm) -> None:
        write(self)
        with self.conf.open("a") as f:
            f.write("NoSuchOption=1\n")

    monkeypatch.setattr(LocalSlurm, "_write_config", broken)
    cluster = LocalSlurm(tmp_path / "broken", nodes=("gpu-0",), auth="none")
    with pytest.raises(SlurmStartupError, match=r"(?s)^slurmctld exited.*NoSuchOption"):
        cluster.start()
    with pytest.raises(ConfigError, match="node names"):
        LocalSlurm(tmp_path, nodes=("gpu 0",))
