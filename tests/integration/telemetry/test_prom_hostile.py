"""A broken sensor on a real Prometheus: a ``+Inf`` temperature is no reading, and blinds only
its own GPU (issue 12, telemetry is total).

The DCGM simulator's exporter writes ``+Inf`` for one GPU's temperature, Prometheus 2.42
scrapes it as it would from a real exporter, and the source polls the whole fleet: the heartbeat
query counts finite samples only (``timestamp(x) and (x > -Inf < +Inf)``), so that GPU is
``gpu-missing`` (unknown, never failed) while every other node stays fresh; the temperature
rule's answer holds the ``+Inf`` (the server-side filter ``>= 90`` lets it through) and the
source drops it, counted under the rule's key with reason ``inf``. Cleared, the GPU is fresh
again.
"""

from __future__ import annotations

import math
import time

import pytest

from healer.core.model import GpuRef, SignalKind
from healer.core.rules import PolicySet
from healer_dev.devstack.prometheus import LocalPrometheus
from healer_dev.sim.dcgm import Fault, FaultKind, M, gpu_uuid
from healer_dev.sim.dcgm_server import ThreadedDcgmFleet
from tests.integration.telemetry.conftest import Sink, fresh, make_source, running, stale

pytestmark = pytest.mark.integration
TEMP = "DCGM_FI_DEV_GPU_TEMP"


async def test_inf_temperature_blinds_only_its_gpu_and_is_counted(
        fleet: ThreadedDcgmFleet, prom: LocalPrometheus, default_policies: PolicySet) -> None:
    node, calm = "n-inf", "n-calm"
    ref = GpuRef(0, gpu_uuid(node, 0))
    source = make_source(prom, default_policies)
    async with running(source, Sink()) as sink:
        await sink.wait(fresh(node), what=f"FRESH for {node}")
        await sink.wait(fresh(calm), what=f"FRESH for {calm}")
        injected = time.time()
        fleet.inject(Fault(FaultKind.SET, node, 0, metric=M.GPU_TEMP, value=math.inf))
        _, sig = await sink.wait(lambda s: stale(node)(s) and s.gpu == ref, after=injected,
                                 within=20, what=f"STALE for {node} GPU 0")
        assert sig.get("reason") == "gpu-missing"
        seen = time.time()
        await sink.wait_polls(3)
        assert sink.matching(fresh(calm), after=seen)  # the rest of the fleet is not blinded
        assert not sink.matching(stale(calm), after=injected)
        assert not sink.matching(lambda s: s.node == node and s.kind is SignalKind.METRIC
                                 and not math.isfinite(s.value), after=injected)
        assert source.drops.counts.get((TEMP, "inf"), 0) > 0
        cleared = time.time()
        fleet.clear(node=node)
        await sink.wait(fresh(node), after=cleared, within=20, what=f"FRESH again for {node}")
