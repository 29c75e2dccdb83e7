"""The Slurm feed on fakes with a manual clock: Slurm's node states reach the guardrails as
changes, an unreadable Slurm holds admissions that need it, and capacity given back in Slurm
wakes what it held (issue 12)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from healer.app_nodesets import NodeSetPorts, NodeSetWiring
from healer.core import rules as cp
from healer.core.budget import usage
from healer.core.nodesets import NodeSetRules, NodeSets
from healer.core.phases import Phase
from healer.errors import NotFoundError, TransientError
from healer.obs.http import Health
from healer.obs.metrics import Metrics, StateSource
from healer.ports import SlurmHandles, SlurmNodeState
from healer.runtime.dependencies import SLURM_VIEW, Dependencies
from healer.runtime.slurm_feed import SlurmFeed
from healer_dev.testing import FakeSlurm
from tests.builders import policies, policy
from tests.component.test_controller import Harness, make


class FakeStates:
    """Slurm's node states as a test sets them; ``down`` makes every read fail."""

    def __init__(self) -> None:
        self.states: dict[str, SlurmNodeState] = {}
        self.down = False
        self.reads = 0

    def set(self, node: str, base: str = "IDLE", *flags: str, reason: str = "") -> None:
        self.states[node] = SlurmNodeState(node, base, frozenset(flags), reason)

    async def node_states(self) -> Mapping[str, SlurmNodeState]:
        self.reads += 1
        if self.down:
            raise TransientError("Unable to contact slurm controller (connect failure)")
        return dict(self.states)


@dataclass
class Rig:
    h: Harness
    slurm: FakeStates
    feed: SlurmFeed
    task: asyncio.Task[None]
    metrics: Metrics

    def block(self, node: str) -> str:
        recs = [r for r, _ in self.h.store.objects.values() if r.node == node]
        b = recs[-1].blocked if recs else None
        return b.guardrail if b is not None else ""

    def message(self, node: str) -> str:
        recs = [r for r, _ in self.h.store.objects.values() if r.node == node]
        b = recs[-1].blocked if recs else None
        return b.message if b is not None else ""

    def metric(self, line: str) -> bool:
        return line in generate_latest(self.metrics.registry).decode()


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    ps = policies(policy(steps=cp.Steps(poll_interval=5),
                         guardrails=cp.Guardrails(max_unavailable=cp.Quantity(1))))
    h = await make(ps)
    slurm = FakeStates()
    for i in range(4):
        slurm.set(f"gpu-{i}")
    feed = SlurmFeed(slurm, h.ctl, h.clock, interval=10, grace=30)
    h.ctl.expect_slurm()
    metrics = Metrics(CollectorRegistry())
    metrics.attach_state(StateSource(view=h.ctl.view, slurm_feed=feed.metrics,
                                     clock=h.clock.now))
    task = asyncio.create_task(feed.run())
    await h.run(1, step=1)
    yield Rig(h, slurm, feed, task, metrics)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await h.close()


async def test_an_admin_drain_in_slurm_counts_against_max_unavailable(rig: Rig) -> None:
    h = rig.h
    assert h.ctl.view().slurm_view == "ok"
    rig.slurm.set("gpu-2", "IDLE", "DRAIN", reason="bad DIMM [admin@2026-01-05T08:00:00]")
    await h.run(10, step=1)
    assert rig.metric('healer_unavailable_nodes{cause="slurm-drain",scope="fleet"} 1.0')
    assert rig.metric('healer_unavailable_nodes{cause="slurm-drain",scope="p"} 1.0')
    assert h.ctl.debug_state()["slurm"] == {"view": "ok", "unavailable": {"gpu-2": "slurm-drain"}}
    await h.xid("gpu-1")
    await h.run(20, step=1)
    assert h.phase("gpu-1") is Phase.FAILED
    assert rig.block("gpu-1") == "max-unavailable"
    assert "1 of 4 nodes unavailable (1 slurm-drain)" in rig.message("gpu-1")
    assert h.fakes["slurm"].log == []  # type: ignore[attr-defined]  # nothing was drained
    # the admin gives the node back: the next read wakes the held admission; gpu-1 is taken out
    rig.slurm.set("gpu-2")
    await h.run(10, step=1)
    assert h.phase("gpu-1") not in (Phase.FAILED, Phase.HEALTHY)
    assert ["drain", "gpu-1"] in [list(e[:2]) for e in h.fakes["slurm"].log]  # type: ignore[attr-defined]


async def test_down_and_not_responding_nodes_count_and_only_changes_reach_the_core(
        rig: Rig) -> None:
    h = rig.h
    rig.slurm.set("gpu-0", "DOWN", reason="Not responding")
    rig.slurm.set("gpu-3", "IDLE", "NOT_RESPONDING")
    seen: list[dict[str, str]] = []
    real = h.ctl.on_slurm_states

    def spy(changes: Mapping[str, str], *, known: bool) -> None:
        seen.append(dict(changes))
        real(changes, known=known)

    rig.feed.sink = type("Sink", (), {"on_slurm_states": staticmethod(spy),
                                      "on_signals": staticmethod(h.ctl.on_signals)})()
    await h.run(30, step=1)
    assert seen == [{"gpu-0": "slurm-down", "gpu-3": "slurm-not-responding"}]  # then nothing
    assert rig.feed.reads >= 3
    causes = {u.scope: dict(u.causes) for u in usage(h.ctl.view(), h.clock.now())}
    assert causes["fleet"] == {"slurm-down": 1, "slurm-not-responding": 1}


async def test_an_unreadable_slurm_holds_admissions_that_need_it_then_lets_go(rig: Rig) -> None:
    h = rig.h
    rig.slurm.down = True
    await h.run(20, step=1)
    assert h.ctl.view().slurm_view == "ok"  # within the grace period: the last read stands
    await h.run(20, step=1)
    assert h.ctl.view().slurm_view == "unknown"
    assert rig.metric("healer_slurm_view_known 0.0")
    await h.xid("gpu-1")
    await h.run(10, step=1)
    assert rig.block("gpu-1") == "slurm-unknown"
    assert h.fakes["slurm"].log == []  # type: ignore[attr-defined]
    rig.slurm.down = False
    await h.run(10, step=1)
    assert rig.metric("healer_slurm_view_known 1.0")
    assert h.phase("gpu-1") not in (Phase.FAILED, Phase.HEALTHY)


async def test_slurm_unknown_until_the_first_read() -> None:
    ps = policies(policy(guardrails=cp.Guardrails(max_unavailable=cp.Quantity(1))))
    h = await make(ps)
    try:
        h.ctl.expect_slurm()
        slurm = FakeStates()
        slurm.down = True
        feed = SlurmFeed(slurm, h.ctl, h.clock, interval=10)
        await feed.poll()
        assert h.ctl.view().slurm_view == "unknown"
        await h.xid("gpu-1")
        await h.run(10, step=1)
        recs = [r for r, _ in h.store.objects.values() if r.node == "gpu-1"]
        assert recs[-1].blocked is not None
        assert recs[-1].blocked.guardrail == "slurm-unknown"
        slurm.down = False
        await feed.poll()
        assert h.ctl.view().slurm_view == "ok"
        await h.run(10, step=1)
        assert h.phase("gpu-1") not in (Phase.FAILED, Phase.HEALTHY)
    finally:
        await h.close()


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval"):
        SlurmFeed(FakeStates(), None, None, interval=0)  # type: ignore[arg-type]


async def test_slurm_names_are_mapped_to_their_nodes() -> None:
    from healer.adapters.slurm.states import SlurmNodeFeed, slurm_states

    listed = [SlurmNodeState("gpu-0", "IDLE", frozenset({"DRAIN"})),
              SlurmNodeState("gpu-9", "DOWN")]  # runs on no Node of this cluster

    class Lister:
        async def nodes(self) -> list[SlurmNodeState]:
            return listed

    async def hosts() -> dict[str, str]:
        return {"gpu-0": "node-07"}

    driver = FakeSlurm()
    mapped = slurm_states(SlurmHandles(driver, lister=Lister()), hosts)
    assert isinstance(mapped, SlurmNodeFeed)
    assert list(await mapped.node_states()) == ["node-07"]
    same = slurm_states(SlurmHandles(driver, lister=Lister()))
    assert same is not None
    assert sorted(await same.node_states()) == ["gpu-0", "gpu-9"]  # bare Slurm: same names
    assert slurm_states(SlurmHandles(driver)) is None  # a driver that cannot list: no feed
    own = FakeStates()
    assert slurm_states(SlurmHandles(driver, states=own), hosts) is own  # Slinky's own map


async def test_a_lost_view_is_on_the_daemons_status_and_an_event_once_per_change(
        rig: Rig) -> None:
    """Issue 22 item 9: the view's loss (after the grace) and its return reach /readyz's
    ``degraded`` and one Event each; a poll that changes nothing tells nothing."""
    h = rig.h
    health = Health()
    events: list[tuple[str, str, str]] = []

    async def emit(reason: str, note: str, *, type: str = "Warning") -> None:
        events.append((reason, type, note))

    rig.feed.on_view = Dependencies(health, emit).slurm_view
    await h.run(10, step=1)
    assert health.degraded == {}
    assert events == []  # the view was known and stays known: nothing to tell
    rig.slurm.down = True
    await h.run(15, step=1)  # inside the grace: not yet lost
    assert events == []
    await h.run(30, step=1)
    assert SLURM_VIEW in health.degraded
    assert "Unable to contact slurm controller" in health.degraded[SLURM_VIEW]
    assert [(r, t) for r, t, _ in events] == [("SlurmViewUnknown", "Warning")]
    await h.run(60, step=1)  # more failed polls, the same reason: no new Event
    assert len(events) == 1
    rig.slurm.down = False
    await h.run(10, step=1)
    assert health.degraded == {}
    assert [(r, t) for r, t, _ in events] == [("SlurmViewUnknown", "Warning"),
                                              ("SlurmViewRestored", "Normal")]


async def test_every_nodeset_is_read_and_the_failing_ones_are_named() -> None:
    class Reads:
        def __init__(self, error: Exception | None) -> None:
            self.error = error

        async def node_states(self) -> Mapping[str, SlurmNodeState]:
            if self.error is not None:
                raise self.error
            return {}

    sets = NodeSets((NodeSetRules("a", cp.LabelSelector({"p": "a"}), "west"),
                     NodeSetRules("b", cp.LabelSelector({"p": "b"}), "east"),
                     NodeSetRules("c", cp.LabelSelector({"p": "c"}), "north")))
    errors = {"a": NotFoundError("read Secret slurm/token-a: not found"), "b": None,
              "c": TransientError("connect failure\x1b[31m")}
    ps = cp.PolicySet((), nodesets=sets)
    ports = NodeSetPorts(lambda ns: NodeSetWiring(None, Reads(errors[ns.name]), None),  # type: ignore[arg-type]
                         None, lambda: ps)  # type: ignore[arg-type]
    with pytest.raises(TransientError) as e:
        await ports.node_states()
    assert str(e.value) == ("SlurmNodeSet 'a' (cluster west): read Secret slurm/token-a: not "
                            "found; SlurmNodeSet 'c' (cluster north): connect failure\ufffd[31m")
    assert ports.readable == {"a": ("west", "read Secret slurm/token-a: not found"),
                              "b": ("east", ""), "c": ("north", "connect failure\ufffd[31m")}
