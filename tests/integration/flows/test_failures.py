"""Failure injection mid-flow on the real stack (issue 5): slurmctld restarted, the API server
restarted, the daemon killed with SIGKILL at every step boundary. Each flow must still finish,
with every action exactly once: one Slurm drain with healer's reason (slurmctld's own log),
one signal to the job (its USR1 trap counts them), one eviction (the Slurm node's pod uid
changes once), one spare claimed, one Event per action, one ledger entry per step."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.daemon_process import Daemon
from tests.integration.flows.checks import (
    FLOW_STEPS,
    assert_ledger_once,
    assert_no_busy_pod_deleted,
    incident_of,
    ledger,
    print_timeline,
)
from tests.integration.flows.conftest import Flow, FlowFactory
from tests.integration.waiting import wait_for

PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
#: Events every replacement flow records about the bad node
FLOW_EVENTS = ("IncidentOpened", "RemediationStarted")


async def _exactly_once(f: Flow, bad: str, sn: str, rec: dict[str, Any]) -> None:
    """One Slurm drain with healer's reason, one spare claimed, every Event of the flow there
    exactly once."""
    inc = incident_of(rec)
    assert len(f.healer_drains(sn)) == 1, f.ctld_reasons(sn)
    assert len(f.ctld_returns_to_service(sn)) <= 1, f.ctld_returns_to_service(sn)
    assert await f.claimed_by(inc) == [f.lay.spare_a]
    reasons = await f.event_reasons(bad)
    keys = await f.event_keys(bad)
    print(f"Events about {bad}: {dict(reasons)}")
    assert all(n == 1 for n in reasons.values()), reasons
    assert all(n == 1 for n in keys.values()), keys
    for reason in FLOW_EVENTS:
        assert reasons[reason] == 1, (reason, reasons)


async def _draining_with_job(f: Flow, bad: str, sn: str) -> tuple[Daemon, int, float]:
    """A daemon running, a job on ``sn`` that ignores USR1, an XID on ``bad`` (when: the
    third item), and Slurm draining ``sn`` while the job runs."""
    d = f.start_daemon()
    await f.ready(d)
    job = await f.submit(sn, exit_on_usr1=False)
    t0 = time.time()
    f.xid(bad)
    await f.wait_slurm(sn, lambda s: s.drain and s.busy, within=120, remediated=bad,
                       what="draining while the job runs")
    return d, job, t0


async def _restart_slurmctld(f: Flow) -> float:
    def restart() -> float:
        t = time.monotonic()
        with f.slurm_lock:
            f.slurm.restart_slurmctld()
        return time.monotonic() - t

    return await asyncio.to_thread(restart)


async def _awaiting_replacement(f: Flow, d: Daemon, bad: str, polls: float) -> float:
    """Wait until healer is in Swapping and has polled the replacement ``polls`` times
    without finding it ready; fails at once when it moves on. Returns the poll count."""
    async def waiting() -> float | None:
        phase = await f.phase(bad)
        if phase not in ("Healthy", "Failed", "Draining", "Cordoned", "Swapping"):
            spare = (await f.record(bad))["status"].get("spare", "")
            sn = await f.slurm_name_on(spare) if spare else ""
            raise AssertionError(
                f"healer declared the replacement ready ({phase}) while its slurmd was held "
                f"back: Slurm says {await f.slurm_state(sn) if sn else '?'}\n"
                f"{await f.diagnose(bad)}")
        n = await d.metric("healer_actions_total", action="await-replacement",
                           status="pending") or 0
        return n if phase == "Swapping" and n >= polls else None

    got = await wait_for(waiting, timeout=120, description="healer waiting in Swapping")
    assert got is not None
    return got


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("mode", "driver", "while_swapping"), [
    pytest.param("StatefulSet", "slinky", True, id="StatefulSet-slinky"),
    pytest.param("DaemonSet", "scontrol", False, id="DaemonSet-scontrol"),
])
async def test_slurmctld_restarted_mid_flow(flows: FlowFactory, mode: str, driver: str,
                                            while_swapping: bool) -> None:
    """slurmctld is restarted while healer waits for the job in Draining (scontrol driver:
    healer polls slurmctld itself; slinky: through the operator's pod conditions and the
    scontrol job backend) and, in StatefulSet mode, again while the replacement's slurmd is
    held back (Swapping)."""
    f = await flows(mode, driver)
    lay = f.lay
    bad = lay.gpus[1]
    sn = await f.slurm_name_on(bad)
    new_sn = sn if mode == "StatefulSet" else lay.spare_a
    d, job, t0 = await _draining_with_job(f, bad, sn)
    took = await _restart_slurmctld(f)
    print(f"slurmctld restarted in {took:.1f}s while {bad} was {await f.phase(bad)}")
    await f.wait_slurm(sn, lambda s: s.drain and s.busy, remediated=bad,
                       what="still draining with the job after the restart")
    if while_swapping:
        f.gate.clear()  # hold the replacement's slurmd start: the flow waits in Swapping
    f.release(job)
    if while_swapping:
        await _awaiting_replacement(f, d, bad, 2)
        took = await _restart_slurmctld(f)
        print(f"slurmctld restarted in {took:.1f}s while {bad} was {await f.phase(bad)}")
        before = await d.metric("healer_actions_total", action="await-replacement",
                                status="pending") or 0
        await _awaiting_replacement(f, d, bad, before + 2)
        f.gate.set()
    rec = await f.wait_phase(bad, "Repair", within=180, also=f.step_done(bad, "mark-repair"))
    print_timeline(f"slurmctld restarts {mode}/{driver}", rec, t0)
    print(f"Slurm samples that failed during the restarts: {f.slurm_history.failures}")
    assert_ledger_once(rec, FLOW_STEPS)
    assert rec["status"]["spare"] == lay.spare_a
    await f.job_completed(job)
    end = f.job_end(job)
    assert end is not None
    assert "released" in f.job_file("end", job)
    await assert_no_busy_pod_deleted(f, end)
    if mode == "StatefulSet":
        pods = f.pods.of(sn)
        assert [p.host for p in pods] == [bad, lay.spare_a], pods  # evicted exactly once
    else:
        assert f.pods.deleted() == []  # the bad node's slurmd pod stays
        old = await f.slurm_state(sn)
        assert old is not None
        assert old.drain
        assert incident_of(rec) in old.reason
    await f.wait_slurm(new_sn, lambda s: s.base == "IDLE" and s.registered and not s.drain,
                       what="idle and undrained")
    assert await f.sinfo(new_sn) == f"{new_sn} idle"
    await _exactly_once(f, bad, sn, rec)
    await f.finish_repair(bad)


async def test_slurmctld_restart_while_swapping_daemonset_waits_for_the_new_slurmd(
        flows: FlowFactory) -> None:
    f = await flows("DaemonSet", "slinky")
    lay = f.lay
    bad = lay.gpus[1]
    d = f.start_daemon()
    await f.ready(d)
    f.gate.clear()  # the operator cannot start the spare's slurmd for now
    f.xid(bad)
    polls = await _awaiting_replacement(f, d, bad, 2)  # FUTURE: healer waits, rightly
    took = await _restart_slurmctld(f)
    st = await f.slurm_state(lay.spare_a)
    print(f"slurmctld restarted in {took:.1f}s; {lay.spare_a} is now {st}")
    await _awaiting_replacement(f, d, bad, polls + 2)
    f.gate.set()
    rec = await f.wait_phase(bad, "Repair", within=120, also=f.step_done(bad, "mark-repair"))
    started = [at for node, up, at in f.slurmd_calls if node == lay.spare_a and up]
    assert started
    assert ledger(rec)["await-replacement"]["finishedAt"] >= started[0]


@pytest.mark.timeout(360)
async def test_apiserver_restarted_while_draining_and_while_swapping(
        flows: FlowFactory) -> None:
    """slinky driver, StatefulSet mode (everything goes through the API server): the API
    server (with the controller manager, scheduler and kwok) is restarted while healer waits
    for the job in Draining, and again while the slurmd pod is moving to the spare."""
    f = await flows("StatefulSet", "slinky")
    stack = f.stack
    bad = f.lay.gpus[1]
    sn = await f.slurm_name_on(bad)
    _, job, t0 = await _draining_with_job(f, bad, sn)
    took = await asyncio.to_thread(stack.restart_apiserver)
    print(f"kube-apiserver restarted in {took:.1f}s while {bad} was {await f.phase(bad)}")
    f.gate.clear()  # hold the slurmd start on the spare: the flow waits in Swapping
    f.release(job)
    await f.wait_phase(bad, "Swapping", within=120, also=f.step_done(bad, "claim-spare"))
    took = await asyncio.to_thread(stack.restart_apiserver)
    print(f"kube-apiserver restarted in {took:.1f}s while {bad} was {await f.phase(bad)}")
    f.gate.set()
    rec = await f.wait_phase(bad, "Repair", within=180, also=f.step_done(bad, "mark-repair"))
    print_timeline("API server restarts", rec, t0)
    print(f"pod list re-done {f.pods.relists} times")
    assert_ledger_once(rec, FLOW_STEPS)
    assert rec["status"]["spare"] == f.lay.spare_a
    await f.job_completed(job)
    end = f.job_end(job)
    assert end is not None
    pods = f.pods.of(sn)
    assert [p.host for p in pods] == [bad, f.lay.spare_a], pods  # evicted exactly once
    await assert_no_busy_pod_deleted(f, end)
    assert await f.sinfo(sn) == f"{sn} idle"
    await _exactly_once(f, bad, sn, rec)
    await f.finish_repair(bad)
    # the shared control plane is fully back for the tests after this one, and so is the
    # operator: its client-go reflectors may still be backing off from the two outages, which
    # the next test's fresh NodeSet would otherwise wait out (a restarted operator pod)
    await wait_for(lambda: f.core.list_namespace(), timeout=60, description="API answers")
    await asyncio.to_thread(f.sstack.restart_operator)


@pytest.mark.timeout(900)  # ~20 daemons, each resuming across the real operator's 30 s re-list
async def test_daemon_killed_at_every_step_boundary_finishes_exactly_once(
        flows: FlowFactory, tmp_path: Path) -> None:
    """slinky driver, StatefulSet mode, a checkpointing policy: each daemon SIGKILLs itself at
    the first step boundary no earlier daemon died at (after a write that advanced the
    remediation, or after a step's action ran and before its outcome was persisted); the next
    one resumes from the NodeRemediation. The job's USR1 trap counts signals and does not
    exit; the test acknowledges the checkpoint through the job comment, as a job would."""
    f = await flows("StatefulSet", "slinky")
    bad = f.lay.gpus[1]
    sn = await f.slurm_name_on(bad)
    job = await f.submit(sn, exit_on_usr1=False)
    crash_log = tmp_path / "crashes.txt"
    t0 = time.time()
    f.metric(bad, PENDING, 1)
    acked = released = False

    async def drive() -> str:
        """What the world does between crashes: the job acknowledges the checkpoint once it
        got USR1, finishes once Slurm drains it, the repair reports back."""
        nonlocal acked, released
        phase = await f.phase(bad)
        if phase in ("Healthy", "Degrading", "Checkpointing", "Draining"):
            f.metric(bad, PENDING, 1)  # telemetry keeps reporting (samples age out)
        if not acked and f.job_file("usr1", job):
            inc = incident_of(await f.record(bad))
            await asyncio.to_thread(f.slurm.run, ["scontrol", "update", f"jobid={job}",
                                                  f"comment=healer-ack:{inc}"])
            acked = True
        if not released and phase == "Draining":
            st = await f.slurm_state(sn)
            if st is not None and st.drain:
                f.release(job)
                released = True
        await f.play_repair(bad)
        return phase

    crashes = 0
    phases: list[str] = []
    started = time.monotonic()
    for _ in range(120):
        if await drive() == "Done":
            break
        d = f.start_daemon(crash_log=crash_log)

        async def died(d: object = d) -> bool:
            phase = await drive()
            return d.proc.poll() is not None or phase == "Done"  # type: ignore[attr-defined]

        await wait_for(died, timeout=120, interval=0.1, description="the daemon's crash")
        if d.proc.poll() is None:
            d.kill9()
        elif d.proc.returncode == -9:
            crashes += 1
        phases.append(await f.phase(bad))
    print(f"{crashes} daemons killed in {time.monotonic() - started:.1f}s; phase after each: "
          f"{phases}")
    f.start_daemon()  # one left alone finishes whatever remains

    async def done() -> bool:
        return await drive() == "Done"

    await wait_for(done, timeout=120, description="a daemon left alone reaches Done")
    rec = await f.wait_phase(bad, "Done", within=120)
    print_timeline("kill -9 at every boundary", rec, t0)
    points = crash_log.read_text().splitlines()
    inc = incident_of(rec)
    steps = ledger(rec)
    for step in steps:  # every step: killed right after its action ran ...
        assert f"action {inc}/{step}" in points, (step, points)
    writes = [p for p in points if p.startswith("write ")]  # ... and after intents/outcomes
    assert len(writes) >= len(steps), points
    assert_ledger_once(rec, ["checkpoint", *FLOW_STEPS, "return-to-pool"])
    # the job got exactly one USR1, acknowledged, ran to its end, never killed
    assert len(f.job_file("usr1", job).splitlines()) == 1, f.job_file("usr1", job)
    await f.job_completed(job)
    end = f.job_end(job)
    assert end is not None
    pods = f.pods.of(sn)
    assert [p.host for p in pods] == [bad, f.lay.spare_a], pods  # evicted exactly once
    await assert_no_busy_pod_deleted(f, end)
    # Events: every one exactly once, also those of a transition whose daemon died right after
    # persisting it (they ride with the intent and are re-emitted on resume)
    await _exactly_once(f, bad, sn, rec)
    assert len(await f.remediations(bad)) == 1
    assert await f.sinfo(sn) == f"{sn} idle"


@pytest.mark.timeout(180)
async def test_events_of_a_transition_survive_a_crash_right_after_its_intent_was_written(
        flows: FlowFactory, tmp_path: Path) -> None:
    f = await flows("StatefulSet", "slinky")
    bad = f.lay.gpus[1]
    crash_log = tmp_path / "crashes.txt"
    f.xid(bad)
    d = f.start_daemon(crash_log=crash_log)  # dies at the first boundary: the first write
    await wait_for(lambda: d.proc.poll() is not None, timeout=90,
                   description="the daemon's crash after its first write")
    assert d.proc.returncode == -9
    assert crash_log.read_text().splitlines() == ["write Draining drain:open"]
    f.start_daemon()
    rec = await f.wait_phase(bad, "Repair", within=120, also=f.step_done(bad, "mark-repair"))
    assert rec["status"]["spare"] == f.lay.spare_a
    reasons = await f.event_reasons(bad)
    print(f"Events about {bad} after one crash: {dict(reasons)}")
    for reason in FLOW_EVENTS:
        assert reasons[reason] == 1, (reason, reasons)
