"""The simulated node-exporter InfiniBand collector (healer_dev.sim.infiniband): its series,
its faults on the clock, and its wiring into the simulated DCGM exporter's /metrics."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from healer_dev.sim.dcgm import DcgmSim, make_node
from healer_dev.sim.infiniband import (
    LINK_DOWNED,
    PHYSICAL_STATE,
    STATE,
    SYMBOL_ERRORS,
    IbFault,
    IbFaultKind,
    InfinibandSim,
)

T = 1_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T

    def __call__(self) -> float:
        return self.t


def values(text: str) -> dict[tuple[str, str, str], float]:
    """(metric, device, node) → value; every series is port 1 here."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            assert s.labels["port"] == "1"
            out[(s.name, s.labels["device"], s.labels["node"])] = s.value
    return out


def test_a_healthy_fabric_is_active_and_link_up_on_every_port() -> None:
    sim = InfinibandSim(["a", "b"], clock=Clock())
    got = values(sim.render("a"))
    assert got == {(STATE, d, "a"): 4.0 for d in ("mlx5_0", "mlx5_1")} | {
        (PHYSICAL_STATE, d, "a"): 5.0 for d in ("mlx5_0", "mlx5_1")} | {
        (LINK_DOWNED, d, "a"): 0.0 for d in ("mlx5_0", "mlx5_1")} | {
        (SYMBOL_ERRORS, d, "a"): 0.0 for d in ("mlx5_0", "mlx5_1")}
    assert sim.render("not-simulated") == ""


@pytest.mark.parametrize(("kind", "at", "expected"), [
    (IbFaultKind.PORT_DOWN, T + 5, (1, 3, 1, 0)),
    (IbFaultKind.FLAPPING, T + 1, (4, 5, 0, 0)),  # first period: ACTIVE
    (IbFaultKind.FLAPPING, T + 3, (2, 5, 0, 0)),  # second: INIT, the link stays up
    (IbFaultKind.FLAPPING, T + 5, (4, 5, 0, 0)),
    (IbFaultKind.SYMBOL_ERRORS, T + 7.5, (4, 5, 0, 15)),
])
def test_faults_on_the_clock(kind: IbFaultKind, at: float, expected: tuple[int, ...]) -> None:
    sim = InfinibandSim(["a"], clock=Clock())
    sim.inject(IbFault("a", kind, "mlx5_1", period=2.0, rate=2.0))
    r = sim.reading("a", "mlx5_1", "1", at)
    assert (r.state, r.physical_state, r.link_downed, r.symbol_errors) == expected
    healthy = sim.reading("a", "mlx5_0", "1", at)
    assert (healthy.state, healthy.link_downed) == (4, 0)  # only the faulty port


def test_a_cleared_fault_leaves_its_counts() -> None:
    clock = Clock()
    sim = InfinibandSim(["a"], clock=clock)
    down = sim.inject(IbFault("a", IbFaultKind.PORT_DOWN))
    errors = sim.inject(IbFault("a", IbFaultKind.SYMBOL_ERRORS, rate=1.0))
    clock.t += 10
    assert [f.id for f in sim.clear(down.id)] == [down.id]
    assert sim.clear(node="a") == [errors]
    clock.t += 100
    r = sim.reading("a", "mlx5_0", "1", clock.t)
    assert (r.state, r.physical_state, r.link_downed, r.symbol_errors) == (4, 5, 1, 10)


@pytest.mark.parametrize(("fault", "why"), [
    (IbFault("x", IbFaultKind.PORT_DOWN), "unknown node"),
    (IbFault("a", IbFaultKind.PORT_DOWN, "mlx5_9"), "no HCA port mlx5_9 1"),
    (IbFault("a", IbFaultKind.FLAPPING, period=0.0), "period must be"),
    (IbFault("a", IbFaultKind.SYMBOL_ERRORS, rate=float("nan")), "rate must be"),
])
def test_bad_faults_are_refused(fault: IbFault, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        InfinibandSim(["a"]).inject(fault)


def test_the_dcgm_exporter_serves_the_node_s_ports_too() -> None:
    clock = Clock()
    dcgm = DcgmSim([make_node("a", 1), make_node("b", 1)], clock=clock)
    InfinibandSim(["a"], clock=clock).attach(dcgm)
    assert f'{STATE}{{device="mlx5_0",node="a",port="1"}} 4' in dcgm.render("a")
    assert "DCGM_FI_DEV_GPU_TEMP" in dcgm.render("a")
    assert STATE not in dcgm.render("b")
    names = {f.name for f in text_string_to_metric_families(dcgm.render("a"))}
    assert {STATE, PHYSICAL_STATE, "node_infiniband_link_downed",
            "node_infiniband_symbol_error"} <= names
    with pytest.raises(ValueError, match="not nodes of the DCGM simulator"):
        InfinibandSim(["zz"]).attach(dcgm)
