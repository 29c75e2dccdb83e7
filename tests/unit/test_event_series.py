"""Repeated Events fold into one Event's series (events.k8s.io/v1), on a back-off; the node
agent's Event writes are bounded per node; its Prometheus counters still count every XID."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest

from healer.adapters.kube.event_series import EventSeries, SeriesPolicy, WriteBudget
from healer.adapters.kube.events import KubeEvents
from healer.agent.findings import EventKind, GpuEvent
from healer.agent.metrics import AgentMetrics, AgentState
from healer.agent.publish import EVENT_WRITE_BURST, EVENT_WRITE_EVERY, EventSink, series_key
from healer.errors import NotFoundError, PermanentError
from healer.policy.catalog import default_catalog

CATALOG = default_catalog()


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


class Writer:
    """An EventWriter that records what reached the 'API server'."""

    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.creates = 0
        self.patches = 0

    async def create(self, namespace: str, body: dict[str, Any], what: str) -> None:
        self.creates += 1
        self.events[body["metadata"]["name"]] = body

    async def patch(self, namespace: str, name: str, body: dict[str, Any], what: str) -> None:
        if name not in self.events:
            raise NotFoundError(what)
        self.patches += 1
        self.events[name].update(body)

    @property
    def writes(self) -> int:
        return self.creates + self.patches


def xid(at: float, code: int = 43, gpu: int = 0) -> GpuEvent:
    return GpuEvent(gpu, f"GPU-{gpu}", EventKind.XID, 8, at, xid=code)


async def crash_loop(n: int, every: float, *, budget: WriteBudget | None = None
                     ) -> tuple[Writer, Clock, EventSink]:
    clock, writer = Clock(), Writer()
    sink = EventSink(KubeEvents(writer, instance="t", clock=clock, budget=budget), "gpu-1",
                     CATALOG)
    for _ in range(n):
        sink.add(xid(clock.now()))
        await sink.flush()
        clock.t += every
    return writer, clock, sink


async def test_a_100_xid_crash_loop_on_one_gpu_is_a_handful_of_writes() -> None:
    writer, clock, sink = await crash_loop(100, 0.45)  # 100 XIDs in 45 s, as on the H100
    # one create, the count 2 at once, then updates 10 s and 30 s later (the back-off)
    assert (writer.creates, writer.patches) == (1, 3)
    (event,) = writer.events.values()
    assert event["series"]["count"] < 100  # the last occurrences are not written yet
    # the series ends after 6 quiet minutes: its final count is written, once
    clock.t += SeriesPolicy().finish
    assert sink.next_flush_in() == 0.0
    await sink.flush()
    assert event["series"]["count"] == 100
    assert (writer.creates, writer.patches) == (1, 4)
    await sink.flush()
    assert writer.writes == 5
    # a new occurrence after the series ended starts a new Event
    sink.add(xid(clock.now()))
    await sink.flush()
    assert writer.creates == 2


async def test_a_steady_repeat_is_written_at_most_once_per_cap() -> None:
    # one XID a minute for 3 hours: never 6 quiet minutes, so one series
    writer, _, _ = await crash_loop(180, 60.0)
    assert writer.creates == 1
    # the back-off doubles from 10 s to the 30-minute cap (8 updates in the first 43 min),
    # then one per 30 min: 13 in 3 hours, not 179
    assert writer.patches == 13


async def test_different_gpus_and_xids_are_different_series() -> None:
    clock, writer = Clock(), Writer()
    sink = EventSink(KubeEvents(writer, instance="t", clock=clock), "gpu-1", CATALOG)
    for gpu in range(2):
        for code in (31, 43):
            sink.add(xid(clock.now(), code, gpu))
    await sink.flush()
    assert writer.creates == 4
    assert len({series_key("gpu-1", xid(0, c, g)) for g in range(2) for c in (31, 43)}) == 4


async def test_the_agents_event_writes_are_bounded_per_node_and_its_counters_count_all() -> None:
    clock, writer = Clock(), Writer()
    budget = WriteBudget(EVENT_WRITE_BURST, EVENT_WRITE_EVERY)
    sink = EventSink(KubeEvents(writer, instance="t", clock=clock, budget=budget), "gpu-1",
                     CATALOG)
    metrics = AgentMetrics(AgentState)
    # 8 GPUs, each with 30 different XIDs at once: 240 distinct Events wanted
    for gpu in range(8):
        for code in range(1, 31):
            ev = xid(clock.now(), code, gpu)
            metrics.event(ev)
            sink.add(ev)
    await sink.flush()
    assert writer.writes == EVENT_WRITE_BURST  # the bound, not 240
    assert len(sink.pending) == 240 - EVENT_WRITE_BURST  # waiting, not dropped
    clock.t += 10 * EVENT_WRITE_EVERY
    await sink.flush()
    assert writer.writes == EVENT_WRITE_BURST + 10
    text = generate_latest(metrics.registry).decode()
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith("healer_agent_gpu_xid_total{"))
    assert counted == 240  # every XID counted, whatever was written


@pytest.mark.parametrize(("burst", "every", "asks", "spacing", "granted"), [
    (20, 30.0, 100, 0.0, 20),      # all at once: the burst
    (20, 30.0, 100, 30.0, 100),    # one per refill: every one
    (5, 10.0, 30, 1.0, 5 + 2),     # 29 s of refill after the burst: 2 more
    (1, 1.0, 3, 0.5, 2),
])
def test_write_budget(burst: int, every: float, asks: int, spacing: float,
                      granted: int) -> None:
    b = WriteBudget(burst, every)
    got = sum(b.take(i * spacing) for i in range(asks))
    assert got == granted


@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 1000)), max_size=200))
def test_series_bookkeeping_stays_bounded_and_counts_every_occurrence(
        seq: list[tuple[int, float]]) -> None:
    series = EventSeries(SeriesPolicy(max_series=3, finish=100.0))
    t = 0.0
    created = updated = 0
    for key, dt in seq:
        t += dt
        occ = series.observe(f"k{key}", f"n{key}", t)
        created += occ.create
        if occ.update is not None:
            series.written(occ.update, occ.update.count, t)
            updated += 1
        assert len(series) <= 3
    assert created + updated <= len(seq)
    for s in series.due(t + 1e9):  # everything ends: nothing left unwritten after this
        series.written(s, s.count, t + 1e9)
    assert series.next_due(t + 1e9) is None


async def test_a_series_update_the_api_refuses_for_good_never_stops_the_sink() -> None:
    """An API that takes creates but refuses the series' merge patch (405, say): the Events
    still flow, the refused series is dropped and the next occurrence creates anew."""
    clock, writer = Clock(), Writer()

    async def refuse(namespace: str, name: str, body: dict[str, Any], what: str) -> None:
        raise PermanentError(f"{what}: HTTP 405 Method Not Allowed")

    writer.patch = refuse  # type: ignore[method-assign]
    sink = EventSink(KubeEvents(writer, instance="t", clock=clock), "gpu-1", CATALOG)
    for _ in range(3):
        sink.add(xid(clock.now()))
        await sink.flush()
        clock.t += 1
    assert writer.creates == 2  # the first, then a new one after the refused update
    assert not sink.pending
