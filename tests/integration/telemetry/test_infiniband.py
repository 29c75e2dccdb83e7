"""Fabric health on the real Prometheus: the shipped InfiniBand policy, port by port.

The simulated exporters serve node-exporter's infiniband series beside the DCGM ones
(:mod:`healer_dev.sim.infiniband`, labelled ``node`` as a scrape config would add it); a real
Prometheus scrapes them every second and the real source polls it with
``policies/examples/infiniband.yaml`` (``for:`` at 3s and windows at 20s so that a test
confirms in seconds). A downed port fails its node and names that port; a flapping link only
degrades; symbol errors degrade; a healthy fabric sends nothing; a port that comes back
recovers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from healer.adapters.prometheus.promql import SOURCE
from healer.core.model import HealthState, SignalKind
from healer.core.parts import PartRef
from healer.core.rules import PolicySet
from healer.policy.load import load_policy_set
from healer_dev.devstack.prometheus import LocalPrometheus
from healer_dev.sim.dcgm import DcgmSim, make_node
from healer_dev.sim.dcgm_server import ThreadedDcgmFleet
from healer_dev.sim.infiniband import IbFault, IbFaultKind, InfinibandSim
from tests.integration.telemetry.conftest import SCRAPE, Sink, make_source, running, verdict
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
NODES = ("ib-down", "ib-flap", "ib-sym", "ib-calm", "ib-back")


def port(device: str) -> PartRef:
    return PartRef((("device", device), ("port", "1")))


@pytest.fixture(scope="module")
def ib() -> InfinibandSim:
    return InfinibandSim(NODES)


@pytest.fixture(scope="module")
def fleet(ib: InfinibandSim) -> Iterator[ThreadedDcgmFleet]:
    sim = DcgmSim([make_node(n, 1) for n in NODES])
    ib.attach(sim)
    with ThreadedDcgmFleet(sim) as f:
        yield f


@pytest.fixture(scope="module")
def prom(fleet: ThreadedDcgmFleet, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[LocalPrometheus]:
    p = LocalPrometheus(tmp_path_factory.mktemp("prometheus-ib"), fleet.targets, f"{SCRAPE:g}s")
    p.start()
    try:
        p.wait_for_series(f"count(node_infiniband_state_id) == {2 * len(NODES)}", timeout=30)
        yield p
    finally:
        p.stop()


@pytest.fixture(autouse=True)
def _clear_ib(ib: InfinibandSim) -> Iterator[None]:
    yield
    ib.clear()


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> PolicySet:
    (doc,) = yaml.safe_load_all((REPO / "policies" / "examples" / "infiniband.yaml").read_text())
    for r in doc["spec"]["rules"]:
        if "for" in r["metric"]:
            r["metric"]["for"] = "3s"
        if "window" in r["metric"]:
            r["metric"]["window"] = "20s"
    path = tmp_path_factory.mktemp("policies") / "infiniband-fast.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_policy_set([path])


def state_of(node: str, sink: Sink, policies: PolicySet) -> HealthState:
    return verdict(node, sink.of(node), policies).state


async def test_a_downed_port_fails_its_node_a_flap_degrades_a_healthy_fabric_is_silent(
        prom: LocalPrometheus, ib: InfinibandSim, policies: PolicySet) -> None:
    ib.inject(IbFault("ib-down", IbFaultKind.PORT_DOWN, "mlx5_1"))
    ib.inject(IbFault("ib-flap", IbFaultKind.FLAPPING, "mlx5_0", period=1.0))
    ib.inject(IbFault("ib-sym", IbFaultKind.SYMBOL_ERRORS, "mlx5_1", rate=5.0))
    source = make_source(prom, policies)
    assert source.plan.queries_per_poll == 6  # one per rule + freshness, for any fleet size
    async with running(source, Sink()) as sink:
        failed = {"ib-port-not-active", "ib-link-not-up", "ib-link-downed"}
        # link_downed rose: failed at once; not ACTIVE and not LinkUp once held 3s
        await wait_for(lambda: failed <= set(verdict("ib-down", sink.of("ib-down"),
                                                     policies).rules),
                       timeout=60, description="ib-down failed by all three rules")
        down = verdict("ib-down", sink.of("ib-down"), policies)
        assert down.state is HealthState.FAILED
        assert "device mlx5_1 port 1" in down.summary()
        assert "mlx5_0" not in down.summary()
        assert {s.part for s in down.evidence} == {port("mlx5_1")}
        assert all(s.source == SOURCE and s.gpu is None for s in down.evidence)

        await wait_for(lambda: state_of("ib-flap", sink, policies) is HealthState.DEGRADING,
                       timeout=60, description="ib-flap degrading")
        await wait_for(lambda: state_of("ib-sym", sink, policies) is HealthState.DEGRADING,
                       timeout=60, description="ib-sym degrading")
        flap = verdict("ib-flap", sink.of("ib-flap"), policies)
        assert flap.rules == ("ib-link-flapping",)
        assert "changes node_infiniband_state_id >= 4" in flap.summary()
        assert "device mlx5_0 port 1" in flap.summary()
        sym = verdict("ib-sym", sink.of("ib-sym"), policies)
        assert sym.rules == ("ib-symbol-errors",)
        assert "device mlx5_1 port 1" in sym.summary()

        # the healthy fabric: fresh, judged, and never one metric signal
        assert any(s.kind is SignalKind.FRESH for s in sink.of("ib-calm"))
        assert [s for s in sink.of("ib-calm") if s.kind is SignalKind.METRIC] == []
        assert state_of("ib-calm", sink, policies) is HealthState.HEALTHY
        # a flap never looks like a downed port: no link_downed, the link stays up
        flap_rules = {s.get("rule") for s in sink.of("ib-flap") if s.kind is SignalKind.METRIC}
        assert flap_rules <= {"infiniband/ib-link-flapping", "infiniband/ib-port-not-active"}
        assert state_of("ib-flap", sink, policies) is HealthState.DEGRADING
        assert source.last_poll is not None
        assert source.last_poll.unmapped_samples == 0


async def test_a_port_that_comes_back_recovers(prom: LocalPrometheus, ib: InfinibandSim,
                                               policies: PolicySet) -> None:
    fault = ib.inject(IbFault("ib-back", IbFaultKind.PORT_DOWN, "mlx5_0"))
    async with running(make_source(prom, policies), Sink()) as sink:
        await wait_for(lambda: state_of("ib-back", sink, policies) is HealthState.FAILED,
                       timeout=60, description="ib-back failed")
        ib.clear(fault.id)
        # the port is ACTIVE again at once; link_downed's rise leaves the 20s window later
        await sink.wait(lambda s: s.node == "ib-back" and s.part == port("mlx5_0")
                        and s.get("rule") == "infiniband/ib-port-not-active"
                        and s.value == 4.0, within=30, what="the port's recovery")
        await wait_for(lambda: state_of("ib-back", sink, policies) is HealthState.HEALTHY,
                       timeout=60, description="ib-back healthy again")
