"""Slurm as a detector (issue 14 item 1) on the fakes with a manual clock: the Slurm feed reads
FakeSlurm's ``node_states`` and an admin's or the HealthCheckProgram's drain becomes an
incident that carries their reason; healer never owns, clears or moves it; healer's own drain
is never a signal; unchanged reads cost nothing downstream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pytest

from healer.core import rules as cp
from healer.core.model import NodeRecord, Severity, Signal, SignalKind
from healer.core.phases import Phase
from healer.policy.checks import compile_regex
from healer.runtime.slurm_feed import SlurmFeed
from healer_dev.testing import FakeEvents, FakeNodes, FakeSlurm, fake_ports
from tests.builders import policies, policy
from tests.component.test_controller import Harness, fleet, make

NHC = "NHC: GPU 3 ECC double bit errors (check_nv_healthmon)"
WHEN = "2026-11-25T22:11:14"


@dataclass
class Rig:
    h: Harness
    slurm: FakeSlurm
    feed: SlurmFeed
    sent: list[Signal]
    task: asyncio.Task[None]

    @property
    def events(self) -> FakeEvents:
        return self.h.fakes["events"]  # type: ignore[return-value]

    @property
    def nodes(self) -> FakeNodes:
        return self.h.fakes["nodes"]  # type: ignore[return-value]

    def record(self, node: str) -> NodeRecord:
        recs = [r for r, _ in self.h.store.objects.values() if r.node == node]
        assert len(recs) == 1, recs
        return recs[0]

    def notes(self, node: str, reason: str) -> list[str]:
        return [note for n, r, _, note in self.events.events.values()
                if n == node and r == reason]


def rules(hold: float = 0.0) -> tuple[cp.Rule, ...]:
    return (cp.XidRule("fatal-xid", Severity.FAILED, frozenset({79})),
            cp.SlurmRule("nhc", Severity.FAILED, frozenset({"DRAIN", "FAIL"}),
                         compile_regex("^NHC:")),
            cp.SlurmRule("slurm-down", Severity.FAILED, frozenset({"DOWN", "NOT_RESPONDING"}),
                         None, hold))


async def rig_with(steps: cp.Steps, hold: float = 0.0) -> Rig:
    fakes = fake_ports(fleet())
    h = await make(policies(policy(rules=rules(hold), steps=steps)), fakes=fakes)
    slurm: FakeSlurm = fakes["slurm"]
    sent: list[Signal] = []
    real = h.ctl.on_signals

    class Sink:  # the controller, with the SLURM signals it is sent kept for the test
        on_slurm_states = staticmethod(h.ctl.on_slurm_states)

        @staticmethod
        async def on_signals(signals: Sequence[Signal]) -> None:
            sent.extend(signals)
            await real(signals)

    feed = SlurmFeed(slurm, Sink(), h.clock, interval=10)
    h.ctl.expect_slurm()
    task = asyncio.create_task(feed.run())
    await h.run(1, step=1)
    return Rig(h, slurm, feed, sent, task)


@pytest.fixture
async def swap() -> AsyncIterator[Rig]:
    r = await rig_with(cp.Steps(poll_interval=5))
    yield r
    r.task.cancel()
    await r.h.close()


@pytest.fixture
async def in_place() -> AsyncIterator[Rig]:
    r = await rig_with(cp.Steps(poll_interval=5, swap=cp.SwapStep(enabled=False)))
    yield r
    r.task.cancel()
    await r.h.close()


async def test_a_health_check_drain_opens_an_incident_that_carries_the_owners_reason(
        swap: Rig) -> None:
    r = swap
    r.slurm.set_reason("gpu-1", NHC, user="root", at=WHEN)
    await r.h.run(60)
    rec = r.record("gpu-1")
    inc = rec.incident
    assert inc.rules == ("nhc",)
    assert inc.summary == f'Slurm DRAIN: "{NHC}" (by root at {WHEN})'
    (ev,) = inc.evidence
    assert ev.kind is SignalKind.SLURM
    assert (ev.get("reason"), ev.get("user"), ev.get("reasonTime")) == (NHC, "root", WHEN)
    (opened,) = r.notes("gpu-1", "IncidentOpened")
    assert NHC in opened
    assert "by root" in opened
    # healer found the drain someone else's: not owned, not overwritten
    drain = rec.step("drain")
    assert drain is not None
    assert "owner=other" in drain.detail
    # the swap holds (ADR 0006): why, on the open step (status.reason) and in one Event
    assert rec.phase is Phase.SWAPPING
    move = rec.step("move-workload")
    assert move is not None
    assert not move.done
    assert NHC in move.error
    (held,) = r.notes("gpu-1", "StepHeld")
    assert NHC in held
    assert held.startswith("move-workload held: ")
    st = r.slurm.node_state("gpu-1")
    assert (st["reason"], st.get("host", "gpu-1")) == (NHC, "gpu-1")
    assert "DRAIN" in st["flags"]
    assert not any(e[0] in ("drain", "undrain", "move") for e in r.slurm.log)

    # the owner clears their drain: the swap goes on, and the finding does not follow the
    # Slurm node to the spare
    r.slurm.clear_reason("gpu-1")
    await r.h.run(60)
    assert r.record("gpu-1").phase is Phase.REPAIR
    assert r.slurm.node_state("gpu-1")["host"] == "spare-a"
    assert [n for n, _ in r.h.store.objects.values() if n.node != "gpu-1"] == []
    assert r.feed.findings == {}


async def test_repaired_in_place_the_undrain_leaves_their_drain(in_place: Rig) -> None:
    r = in_place
    r.slurm.set_reason("gpu-2", NHC, user="root", at=WHEN)
    await r.h.run(40)
    assert r.record("gpu-2").phase is Phase.REPAIR
    r.nodes.set("gpu-2", annotations={"healer.io/repair-result": "passed"})
    await r.h.run(40)
    rec = r.record("gpu-2")
    assert rec.phase is Phase.DONE
    undrain = rec.step("undrain")
    assert undrain is not None
    assert "undrain=not-ours" in undrain.detail
    st = r.slurm.node_state("gpu-2")
    assert st["reason"] == NHC
    assert "DRAIN" in st["flags"]
    assert not any(e[0] in ("drain", "undrain") for e in r.slurm.log)
    assert not r.nodes.node("gpu-2").unschedulable  # healer's own cordon is given back


async def test_healers_own_drain_is_never_a_signal(swap: Rig) -> None:
    r = swap
    await r.h.xid("gpu-0")
    await r.h.run(60)
    assert any(e[0] == "drain" and e[1] == "gpu-0" for e in r.slurm.log)
    assert r.record("gpu-0").incident.rules == ("fatal-xid",)
    assert [s for s in r.sent if s.node == "gpu-0"] == []
    assert "gpu-0" not in r.feed.findings
    # a maintenance drain whose reason the policy does not name: a signal, but no incident
    r.slurm.set_reason("gpu-3", "maint: bios update", user="alice", at=WHEN)
    await r.h.run(30)
    assert [s.get("reason") for s in r.sent if s.node == "gpu-3"] == ["maint: bios update"]
    assert [n for n, _ in r.h.store.objects.values() if n.node == "gpu-3"] == []


def suspect(r: Rig, node: str) -> bool:
    """A suspicion lives in the engine only (not an incident: nothing stored)."""
    rec = r.h.ctl.engine.records.get(node)
    return rec is not None and rec.phase is Phase.SUSPECT


async def test_for_holds_a_down_node_suspect_and_only_changes_are_sent() -> None:
    r = await rig_with(cp.Steps(poll_interval=5), hold=300)
    try:
        down = r.slurm._state["nodes"]["gpu-3"]
        down["base"], down["reason"] = "DOWN", "Not responding"
        await r.h.run(120)
        assert suspect(r, "gpu-3")
        assert len(r.sent) == 1  # 12 reads, one change
        await r.h.run(200)
        rec = r.record("gpu-3")
        assert rec.phase not in (Phase.SUSPECT, Phase.HEALTHY)
        assert rec.incident.rules == ("slurm-down",)
        assert rec.incident.summary == 'Slurm DOWN: "Not responding" for 5m'
        # a node Slurm gives back while suspect closes without an incident
        up = r.slurm._state["nodes"]["gpu-2"]
        up["base"], up["reason"] = "DOWN", "Not responding"
        await r.h.run(60)
        assert suspect(r, "gpu-2")
        up["base"], up["reason"] = "IDLE", ""
        await r.h.run(30)
        assert "gpu-2" not in r.h.ctl.engine.records
        assert r.h.phase("gpu-2") is Phase.HEALTHY  # nothing stored: never an incident
        assert [s.get("states") for s in r.sent if s.node == "gpu-2"] == ["DOWN", ""]
    finally:
        r.task.cancel()
        await r.h.close()
