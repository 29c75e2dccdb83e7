"""The outcome metrics (healer.obs.metrics, core.outcomes) as the daemon observes them: a whole
remediation on the fakes with a manual clock, then the counters and histograms read back from
the registry and checked against the figures core.outcomes computes from the stored record."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from healer.core import rules as cp
from healer.core.machine import Decision, Trigger, TriggerKind
from healer.core.model import GpuRef, NodeRecord, RecordOutcome, Signal, SignalKind
from healer.core.outcomes import GPU_COUNT_LABEL, incident_outcome
from healer.core.phases import Phase
from healer.core.vocabulary import REPAIR_RESULT, StepName
from healer.obs.metrics import Metrics, StateSource
from healer.runtime.controller import Controller
from healer.runtime.executor import Executor, Ports
from healer.runtime.node_events import NodeEvents
from healer_dev.testing import FakeStore, ManualClock, fake_ports, settle
from tests.builders import T0, done_step, policies, policy, record
from tests.component.test_controller import fleet


def sample(reg: CollectorRegistry, name: str, **labels: str) -> float:
    value = reg.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.mark.parametrize(("result", "found"), [("passed", 0), ("no-fault", 1)])
async def test_a_replaced_incident_is_observed_when_it_finishes(result: str, found: int) -> None:
    """The node is replaced, then its repair reports ``result``: ``no-fault`` returns it like
    ``passed`` and counts as a remediation that found nothing."""
    clock = ManualClock()
    nodes = [replace(n, labels={**n.labels, GPU_COUNT_LABEL: "4"}) for n in fleet()]
    fakes = fake_ports(nodes)
    fakes["workload"].ready_after = 4  # the replacement slurmd is Ready at the 4th poll
    store = FakeStore()
    metrics = Metrics(CollectorRegistry())
    ctl = Controller(policies=policies(policy(steps=cp.Steps(poll_interval=5))),
                     executor=Executor(Ports(**fakes), clock),  # type: ignore[arg-type]
                     store=store, clock=clock, observer=metrics)
    metrics.attach_state(StateSource(view=ctl.view, clock=clock.now))
    pump = asyncio.create_task(NodeEvents(fakes["nodes"], ctl).run())  # type: ignore[arg-type]
    try:
        await settle()
        await ctl.start_leading()
        await settle()
        seen = clock.now()
        await clock.advance(20)  # the XID is reported 20 s after it happened
        await ctl.on_signals([Signal("gpu-1", "dcgm", SignalKind.XID, "x", 79.0, seen,
                                     GpuRef(3, "GPU-x", "SER-1"))])
        for _ in range(12):
            await clock.advance(5)
        reg = metrics.registry
        assert sample(reg, "healer_remediations_finished_total", closing="replaced") == 0
        fakes["nodes"].set("gpu-1", annotations={REPAIR_RESULT: result})  # type: ignore[attr-defined]
        for _ in range(6):
            await clock.advance(5)
        rec = next(r for r, _ in store.objects.values() if r.node == "gpu-1")
        assert rec.phase is Phase.DONE
        out = incident_outcome(rec, clock.now(), 4)
        assert out.to_replacement is not None
        assert out.to_replacement >= 15  # three polls 5 s apart
        assert out.detect == pytest.approx(20.0)
        assert sample(reg, "healer_remediations_finished_total", closing="replaced") == 1
        assert sample(reg, "healer_time_to_replacement_seconds_count") == 1
        assert sample(reg, "healer_time_to_replacement_seconds_sum") == pytest.approx(
            out.to_replacement)
        assert sample(reg, "healer_time_to_detect_seconds_sum", severity="failed") == \
            pytest.approx(20.0)
        assert out.gpu_hours_lost > 0
        assert sample(reg, "healer_capacity_lost_gpu_hours_total", closing="replaced") == \
            pytest.approx(out.gpu_hours_lost)
        assert sample(reg, "healer_remediations_found_nothing_total",
                      why="recovered-before-disruption") == 0
        assert sample(reg, "healer_remediations_found_nothing_total",
                      why="repair-found-no-fault") == found
        assert (out.found_nothing is not None) is bool(found)
    finally:
        await ctl.stop_leading()
        pump.cancel()
        await asyncio.gather(pump, return_exceptions=True)


def finishing(before: NodeRecord, after: NodeRecord) -> tuple[Trigger, Decision]:
    trigger = Trigger(TriggerKind.AUTO, after.node, after.phase_since)
    return trigger, Decision(after, transitions=((before.phase, after.phase, "auto"),))


@pytest.mark.parametrize(("drained", "why"), [
    (False, "recovered-before-disruption"), (True, "recovered-after-drain")])
def test_a_recovery_counts_as_found_nothing_once(drained: bool, why: str) -> None:
    metrics = Metrics(CollectorRegistry())
    ledger = (done_step(StepName.DRAIN, T0 + 1), done_step(StepName.UNDO_DRAIN, T0 + 9)) \
        if drained else ()
    before = record(Phase.RECOVERED, phase_since=T0 + 5, outcome=RecordOutcome.RECOVERED,
                    ledger=ledger)
    after = replace(before, phase=Phase.DONE, phase_since=T0 + 10)
    metrics.on_decision("n1", *finishing(before, after), before)
    metrics.on_decision("n1", *finishing(after, after), after)  # already finished: not again
    reg = metrics.registry
    assert sample(reg, "healer_remediations_found_nothing_total", why=why) == 1
    assert sample(reg, "healer_remediations_finished_total", closing="recovered") == 1
    lost = sample(reg, "healer_capacity_lost_gpu_hours_total", closing="recovered")
    assert lost == pytest.approx(8 * 9 / 3600 if drained else 0.0)  # 8 GPUs: no label, no view
