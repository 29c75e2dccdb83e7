"""The runtime on fakes with a manual clock: whole remediations in milliseconds, crashes at
every step boundary, persistence failures, leadership loss."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
import structlog
from structlog.testing import capture_logs

from healer.core import rules as cp
from healer.core.machine import Trigger, TriggerKind
from healer.core.model import GpuRef, NodeView, Signal, SignalKind, Taint
from healer.core.phases import Phase
from healer.errors import ConflictError, PermanentError, TransientError
from healer.runtime.controller import Controller
from healer.runtime.executor import Executor, Ports
from healer.runtime.node_events import NodeEvents
from healer_dev.testing import FakeStore, ManualClock, fake_ports, settle
from tests.builders import GPU_LABELS, policies, policy

DOMAIN = "accelerator.topograph.run/domain"


def fleet() -> list[NodeView]:
    nodes = [NodeView(f"gpu-{i}", GPU_LABELS | {DOMAIN: "a" if i < 2 else "b"}) for i in range(4)]
    nodes += [NodeView("spare-a", GPU_LABELS | {DOMAIN: "a", "healer.io/role": "spare"}, {}, False,
                       (Taint("healer.io/spare", "true", "NoSchedule"),)),
              NodeView("spare-b", GPU_LABELS | {DOMAIN: "b", "healer.io/role": "spare"}, {}, False,
                       (Taint("healer.io/spare", "true", "NoSchedule"),))]
    return nodes


@dataclass
class Harness:
    clock: ManualClock
    store: FakeStore
    fakes: dict[str, object]
    ctl: Controller
    pump: asyncio.Task[None]

    async def xid(self, node: str, code: int = 79) -> None:
        await self.ctl.on_signals([Signal(node, "dcgm", SignalKind.XID, "x", float(code),
                                          self.clock.now(), GpuRef(3, "GPU-x", "SER-" + node))])

    async def run(self, seconds: float, step: float = 5.0) -> None:
        t = 0.0
        while t < seconds:
            await self.clock.advance(step)
            t += step

    def phase(self, node: str) -> Phase:
        recs = [r for r, _ in self.store.objects.values() if r.node == node]
        return Phase(recs[-1].phase) if recs else Phase.HEALTHY

    async def close(self) -> None:
        await self.ctl.stop_leading()
        self.pump.cancel()
        await asyncio.gather(self.pump, return_exceptions=True)


async def make(ps: cp.PolicySet | None = None, store: FakeStore | None = None,
               fakes: dict[str, object] | None = None,
               clock: ManualClock | None = None) -> Harness:
    clock = clock or ManualClock()
    fakes = fakes or fake_ports(fleet())
    store = store or FakeStore()
    ports = Ports(**fakes)  # type: ignore[arg-type]
    ctl = Controller(policies=ps or policies(policy(steps=cp.Steps(poll_interval=5))),
                     executor=Executor(ports, clock), store=store, clock=clock)

    task = asyncio.create_task(NodeEvents(fakes["nodes"], ctl).run())  # type: ignore[arg-type]
    await settle()
    await ctl.start_leading()
    await settle()
    return Harness(clock, store, fakes, ctl, task)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = await make()
    yield harness
    await harness.close()


async def test_xid79_is_remediated_end_to_end(h: Harness) -> None:
    await h.xid("gpu-1")
    await h.run(60)
    assert h.phase("gpu-1") is Phase.REPAIR
    rec = next(r for r, _ in h.store.objects.values() if r.node == "gpu-1")
    assert rec.spare == "spare-a"  # same NVLink domain
    slurm = h.fakes["slurm"]
    assert slurm.log[0][0] == "drain"  # type: ignore[attr-defined]
    assert slurm.node_state("gpu-1")["host"] == "spare-a"  # type: ignore[attr-defined]
    nodes = h.fakes["nodes"]
    assert nodes.node("gpu-1").unschedulable  # type: ignore[attr-defined]
    assert nodes.node("spare-a").annotations["topology.slinky.slurm.net/spec"] == "default:a"  # type: ignore[attr-defined]
    # the repair comes back: the node rejoins the pool and the record is done
    nodes.set("gpu-1", annotations={"healer.io/repair-result": "passed"})  # type: ignore[attr-defined]
    await h.run(30)
    assert h.phase("gpu-1") is Phase.DONE
    assert nodes.node("gpu-1").labels["healer.io/role"] == "spare"  # type: ignore[attr-defined]


async def test_intent_is_persisted_before_every_action() -> None:
    h = await make()
    order: list[str] = []
    store_save = h.store.save
    slurm = h.fakes["slurm"]
    real_drain = slurm.drain  # type: ignore[attr-defined]

    async def save(record, previous):  # type: ignore[no-untyped-def]
        out = await store_save(record, previous)
        open_ = [s.step for s in record.ledger if not s.done]
        order.append(f"save:{','.join(open_)}")
        return out

    async def drain(node: str, reason: str, *incident: str, host: str = "") -> bool:
        order.append("drain")
        return bool(await real_drain(node, reason, *incident, host=host))

    h.store.save = save  # type: ignore[method-assign]
    slurm.drain = drain  # type: ignore[attr-defined]
    await h.xid("gpu-0")
    await h.run(10)
    i = order.index("drain")
    assert "drain" in order[i - 1].split(":")[1], order
    await h.close()


async def test_admin_uncordon_cancels_and_only_own_drain_is_undone(h: Harness) -> None:
    h.fakes["spares"].inject_error("claim", TransientError("api down"), times=100)  # type: ignore[attr-defined]
    await h.xid("gpu-2")
    await h.run(20)
    assert h.phase("gpu-2") is Phase.CORDONED
    h.fakes["nodes"].set("gpu-2", unschedulable=False)  # type: ignore[attr-defined]
    await h.run(10)
    assert h.phase("gpu-2") is Phase.CANCELLED
    assert h.fakes["slurm"].node_state("gpu-2")["flags"] == []  # type: ignore[attr-defined]


async def test_admin_drain_is_never_undone(h: Harness) -> None:
    h.fakes["slurm"].set_reason("gpu-3", "maint: replacing fan")  # type: ignore[attr-defined]
    await h.xid("gpu-3")
    await h.run(60)
    st = h.fakes["slurm"].node_state("gpu-3")  # type: ignore[attr-defined]
    assert st["reason"] == "maint: replacing fan"
    rec = next(r for r, _ in h.store.objects.values() if r.node == "gpu-3")
    drain = rec.step("drain")
    assert drain is not None
    assert "owner=other" in drain.detail


async def test_transient_persist_failure_is_retried_without_acting() -> None:
    h = await make()
    h.store.inject_error("save", TransientError("etcd leader election"), times=1)
    await h.xid("gpu-0")
    await settle()
    assert h.fakes["slurm"].count("drain") == 0  # type: ignore[attr-defined]
    await h.run(30)
    assert h.fakes["slurm"].count("drain") >= 1  # type: ignore[attr-defined]
    assert h.phase("gpu-0") in (Phase.REPAIR, Phase.UNDRAINING, Phase.SWAPPING, Phase.ANNOTATING)
    await h.close()


async def test_conflicting_write_reloads_and_retries() -> None:
    h = await make()
    h.store.inject_error("save", ConflictError("changed"), times=1)
    await h.xid("gpu-0")
    await h.run(60)
    assert h.phase("gpu-0") is Phase.REPAIR
    assert h.ctl.stats.conflicts == 1
    await h.close()


async def test_losing_leadership_stops_at_once() -> None:
    h = await make()
    h.fakes["workload"].ready_after = 1000  # type: ignore[attr-defined]
    await h.xid("gpu-0")
    await h.run(20)
    assert h.phase("gpu-0") is Phase.SWAPPING
    calls = len(h.fakes["workload"].calls)  # type: ignore[attr-defined]
    await h.ctl.stop_leading()
    await h.run(120)
    assert len(h.fakes["workload"].calls) == calls  # type: ignore[attr-defined]
    h.pump.cancel()


#: store writes of one whole remediation (the drain's outcome waits for the next decision's
#: write: its only action looks at Slurm, see Controller._deferrable)
WRITES_IN_A_FULL_REMEDIATION = 11


def _repair_when_asked(h: Harness) -> None:
    """Play the repair team: report the node repaired once healer handed it over."""
    nodes = h.fakes["nodes"]
    n = nodes.node("gpu-1")  # type: ignore[attr-defined]
    if n.labels.get("healer.io/repair") == "pending" and \
            "healer.io/repair-result" not in n.annotations and h.phase("gpu-1") is Phase.REPAIR:
        nodes.set("gpu-1", annotations={"healer.io/repair-result": "passed"})  # type: ignore[attr-defined]


@pytest.mark.parametrize("crash_after_writes", range(1, WRITES_IN_A_FULL_REMEDIATION))
async def test_crash_at_every_step_boundary_resumes_exactly_once(crash_after_writes: int) -> None:
    """Kill the controller right after its Nth write (intent or outcome), start a new one on
    the same store and world: it finishes, and every side effect happened exactly once."""
    fakes = fake_ports(fleet())
    store = FakeStore()
    clock = ManualClock()
    a = await make(fakes=fakes, store=store, clock=clock)
    crashed = asyncio.Event()
    real_save = store.save

    async def save(record, previous):  # type: ignore[no-untyped-def]
        if store.writes >= crash_after_writes:
            crashed.set()
            await asyncio.Event().wait()  # hang: the process is about to die
        return await real_save(record, previous)

    store.save = save  # type: ignore[method-assign]
    await a.xid("gpu-1")
    for _ in range(60):
        if crashed.is_set():
            break
        await clock.advance(5)
        _repair_when_asked(a)
    assert crashed.is_set(), "the remediation finished before the crash point"
    await a.close()  # the crash: every task of A is gone, nothing in memory survives
    store.save = real_save  # type: ignore[method-assign]
    b = await make(fakes=fakes, store=store, clock=clock)
    for _ in range(60):
        await clock.advance(5)
        _repair_when_asked(b)
    assert b.phase("gpu-1") is Phase.DONE, crash_after_writes
    slurm = fakes["slurm"]
    drains = [e for e in slurm.log if e[0] == "drain"]  # type: ignore[attr-defined]
    undrains = [e for e in slurm.log if e[0] == "undrain"]  # type: ignore[attr-defined]
    assert len(drains) == 1
    assert len(undrains) == 1
    assert sum(fakes["workload"].moves.values()) == 1  # type: ignore[attr-defined]
    assert len(store.objects) == 1
    await b.close()


async def test_stale_trigger_is_dropped(h: Harness) -> None:
    await h.xid("gpu-0")
    await h.run(20)
    old = Trigger(TriggerKind.SLURM, "gpu-0", h.clock.now() - 3600)
    before = h.store.writes
    h.ctl.inject(old)
    await settle()
    assert h.store.writes == before


async def test_full_remediation_makes_the_expected_number_of_writes() -> None:
    """Keeps the crash test above honest: it must crash at every write of a real flow."""
    h = await make()
    await h.xid("gpu-1")
    for _ in range(40):
        await h.clock.advance(5)
        _repair_when_asked(h)
    assert h.phase("gpu-1") is Phase.DONE
    assert h.store.writes == WRITES_IN_A_FULL_REMEDIATION
    await h.close()


async def test_restart_does_not_recover_an_incident_whose_signals_are_gone() -> None:
    """A new leader has no signal history: the XID that opened the incident is re-seeded
    from the record, and a healthy verdict waits out the warm-up."""
    fakes = fake_ports(fleet())
    store, clock = FakeStore(), ManualClock()
    a = await make(fakes=fakes, store=store, clock=clock)
    fakes["workload"].ready_after = 10**6  # type: ignore[attr-defined]
    await a.xid("gpu-1")
    await a.run(30)
    assert a.phase("gpu-1") is Phase.SWAPPING
    await a.close()
    b = await make(fakes=fakes, store=store, clock=clock)
    await b.run(90)
    assert b.phase("gpu-1") is Phase.SWAPPING
    await b.close()


async def test_closed_records_are_deleted_after_retention() -> None:
    h = await make()
    await h.xid("gpu-1")
    for _ in range(40):
        await h.clock.advance(5)
        _repair_when_asked(h)
    assert h.phase("gpu-1") is Phase.DONE
    assert await h.ctl.collect_garbage() == 0  # too young
    await h.clock.advance(h.ctl.settings.retention_seconds + 1)
    assert await h.ctl.collect_garbage() == 1
    assert h.store.objects == {}
    await h.close()


async def test_debug_state_shows_open_remediations_and_guardrail_usage() -> None:
    h = await make()
    h.fakes["workload"].ready_after = 1000  # type: ignore[attr-defined]
    await h.xid("gpu-0")
    await h.run(20)
    assert h.phase("gpu-0") is Phase.SWAPPING
    state = h.ctl.debug_state()
    assert state["leading"] is True
    assert "gpu-0" in state["open"]
    fleet_usage = next(u for u in state["guardrails"] if u["scope"] == "fleet")
    assert fleet_usage["population"] > 0
    assert fleet_usage["active"] == 1
    await h.close()


async def test_a_source_that_stops_delivering_makes_healthz_fail() -> None:
    from healer.obs.http import Health
    from healer.runtime.loops import SOURCE_MAX_AGE, source_sink

    now = [1000.0]
    health = Health(clock=lambda: now[0])
    h = await make()
    sink = source_sink(health, "dcgm", h.ctl)
    assert health.healthy()[0]
    now[0] += SOURCE_MAX_AGE + 1
    ok, detail = health.healthy()
    assert not ok
    assert detail["source:dcgm"]["ok"] is False
    await sink([])
    assert health.healthy()[0]
    await h.close()


async def test_an_event_that_cannot_be_written_does_not_stop_the_remediation() -> None:
    h = await make()
    events = h.fakes["events"]
    events.inject_error("emit", PermanentError("events are forbidden"), times=1000)  # type: ignore[attr-defined]
    await h.xid("gpu-0")
    await h.run(60)
    assert h.phase("gpu-0") is Phase.REPAIR
    assert events.reasons() == []  # type: ignore[attr-defined]
    await h.close()


@pytest.fixture
def all_log_levels() -> Iterator[None]:
    """structlog's default configuration (every level) for this test only: another test may
    have set up healer's logging with a higher level."""
    saved = structlog.get_config()
    structlog.reset_defaults()
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.mark.usefixtures("all_log_levels")
async def test_a_step_retried_through_an_outage_is_logged_once_and_its_recovery_once() -> None:
    h = await make()
    h.fakes["slurm"].inject_error("drain", TransientError("slurmctld unreachable"), times=3)  # type: ignore[attr-defined]
    with capture_logs() as logs:
        await h.xid("gpu-0")
        await h.run(90)
    assert h.phase("gpu-0") is Phase.REPAIR
    about = [e for e in logs if e.get("what") == "step drain on gpu-0"]
    assert [e["event"] for e in about] == ["outage", "recovered"], about
    assert "slurmctld unreachable" in about[0]["error"]
    await h.close()


async def test_nodes_held_for_capacity_wait_for_a_spare_not_for_every_poll() -> None:
    """Held nodes do not ask the spare pool every poll (at fleet scale each ask is an API
    read): a spare appearing wakes the held node of its NVLink domain at once, and the others
    only retry on the slow backstop."""
    no_spares = [v for v in fleet() if "spare" not in v.name]
    fakes = fake_ports(no_spares)
    h = await make(fakes=fakes)
    try:
        for node in ("gpu-0", "gpu-2"):  # domains a and b
            await h.xid(node)
        await h.run(60)
        assert h.phase("gpu-0") is Phase.HELD_FOR_CAPACITY
        assert h.phase("gpu-2") is Phase.HELD_FOR_CAPACITY
        spares = h.fakes["spares"]
        asked = spares.count("claim")  # type: ignore[attr-defined]
        await h.run(200)  # 40 polls of 5 s: no spare appeared, nobody asks (backstop: 300 s)
        assert spares.count("claim") == asked  # type: ignore[attr-defined]
        nodes = h.fakes["nodes"]
        nodes.add(NodeView("spare-b", GPU_LABELS | {DOMAIN: "b"}, {}, False,  # type: ignore[attr-defined]
                           (Taint("healer.io/spare", "true", "NoSchedule"),)))
        nodes.set("spare-b", labels={"healer.io/role": "spare"})  # type: ignore[attr-defined]
        await h.run(30)
        assert h.phase("gpu-2") in (Phase.SWAPPING, Phase.ANNOTATING, Phase.UNDRAINING,
                                    Phase.REPAIR)
        assert h.phase("gpu-0") is Phase.HELD_FOR_CAPACITY  # another domain's spare: not woken
        woken = [args for m, args in spares.calls[asked:] if m == "claim"]  # type: ignore[attr-defined]
        assert {a[0] for a in woken} == {"gpu-2"}
    finally:
        await h.close()
