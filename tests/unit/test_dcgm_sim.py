"""The DCGM-exporter simulator: text format (parsed with prometheus_client), fault semantics on a
fake clock, and its HTTP exporters and control endpoint on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import replace

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from healer_dev.sim.dcgm import (
    CLOCKS_GPU_IDLE,
    CLOCKS_HW_THERMAL,
    CLOCKS_SW_THERMAL,
    CONTENT_TYPE,
    METRICS,
    DcgmSim,
    Fault,
    FaultKind,
    M,
    NodeSpec,
    gpu_uuid,
    make_fleet,
    make_node,
)
from healer_dev.sim.dcgm_server import DcgmFleet, ThreadedDcgmFleet

T0 = 1_700_000_000.0


class FakeClock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sim(clock: FakeClock) -> DcgmSim:
    return DcgmSim([make_node("gpu-0", 2), make_node("gpu-1", 2, host_label="hostname")],
                   clock=clock)


def samples(text: str) -> Iterator[tuple[str, str, Sample]]:
    """(family name, family type, sample) for every sample."""
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            yield fam.name, fam.type, s


def value(sim: DcgmSim, node: str, metric: str, gpu: int, **labels: str) -> float | None:
    found = [s.value for name, _, s in samples(sim.render(node)) if name == metric
             and s.labels["gpu"] == str(gpu) and all(s.labels.get(k) == v
                                                      for k, v in labels.items())]
    assert len(found) <= 1, found
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------
# Text format


def test_every_metric_family_parses_with_type_and_help(sim: DcgmSim) -> None:
    families = {f.name: f for f in text_string_to_metric_families(sim.render("gpu-0"))}
    assert set(families) == {name for name, _, _ in METRICS}
    for name, typ, help_text in METRICS:
        assert families[name].type == typ
        assert families[name].documentation == help_text
        assert len(families[name].samples) == 2  # one per GPU


def test_dcgm_exporter_labels(sim: DcgmSim) -> None:
    for _, _, s in samples(sim.render("gpu-0")):
        gpu = int(s.labels["gpu"])
        assert s.labels["UUID"] == gpu_uuid("gpu-0", gpu)
        assert s.labels["UUID"].startswith("GPU-")
        assert s.labels["device"] == f"nvidia{gpu}"
        assert s.labels["modelName"] == "NVIDIA H100 80GB HBM3"
        assert s.labels["Hostname"] == "gpu-0"
        assert "hostname" not in s.labels
        assert s.labels["DCGM_FI_DRIVER_VERSION"] == "535.129.03"
        assert s.labels["pci_bus_id"].startswith("00000000:")
        assert "hpc_job" not in s.labels
    for _, _, s in samples(sim.render("gpu-1")):
        assert s.labels["hostname"] == "gpu-1"
        assert "Hostname" not in s.labels


def test_xid_series_have_err_code_and_count_series_a_window(sim: DcgmSim) -> None:
    text = sim.render("gpu-0")
    xid = [s for n, _, s in samples(text) if n == M.XID_ERRORS]
    assert {(s.labels["err_code"], s.labels["err_msg"], s.value) for s in xid} == {
        ("0", "No Error", 0.0)}
    cnt = [s for n, _, s in samples(text) if n == M.XID_COUNT]
    assert all(s.labels["window_size_in_ms"] == "300000" and "xid" not in s.labels
               and s.value == 0 for s in cnt)


def test_hpc_job_duplicates_series_and_serial_label(clock: FakeClock) -> None:
    node = make_node("gpu-9", 2, hpc_jobs={1: ["101", "102"]}, serial_label=True)
    sim = DcgmSim([node], clock=clock)
    temp = [s for n, _, s in samples(sim.render("gpu-9")) if n == M.GPU_TEMP]
    assert sorted((s.labels["gpu"], s.labels.get("hpc_job", "")) for s in temp) == [
        ("0", ""), ("1", "101"), ("1", "102")]
    assert {s.labels["DCGM_FI_DEV_SERIAL"] for s in temp} == {g.serial for g in node.gpus}
    busy = [s for s in temp if s.labels["gpu"] == "1"]
    assert busy[0].value > temp[0].value  # a GPU running a job is warmer


def test_render_is_deterministic(clock: FakeClock) -> None:
    def build() -> DcgmSim:
        s = DcgmSim(make_fleet(2, 4), clock=clock)
        s.xid("gpu-1", 3, 79, count=2, interval=1)
        s.ecc_sbe("gpu-0", 1, 10, rate=2.5)
        return s

    a, b = build(), build()
    clock.t += 7.3
    assert a.render("gpu-0") == b.render("gpu-0")
    assert a.render("gpu-1") == b.render("gpu-1")
    assert a.render("gpu-0", T0 + 7.3) == a.render("gpu-0")


def test_make_node_validates_and_is_stable() -> None:
    assert make_node("x", 1).gpus == make_node("x", 1).gpus
    assert make_node("x", 10).gpus[9].pci_bus_id == "00000000:e1:00.0"
    with pytest.raises(ValueError, match="host_label"):
        make_node("x", host_label="node")
    with pytest.raises(ValueError, match="duplicate"):
        DcgmSim([make_node("x"), make_node("x")])


# ---------------------------------------------------------------------------------------------
# Faults


def test_xid_last_value_and_count_window(sim: DcgmSim, clock: FakeClock) -> None:
    sim.xid("gpu-0", 1, 79, count=3, interval=10)
    assert value(sim, "gpu-0", M.XID_ERRORS, 1) == 79
    assert value(sim, "gpu-0", M.XID_COUNT, 1, xid="79") == 1
    assert value(sim, "gpu-0", M.XID_ERRORS, 0) == 0
    clock.t += 25
    assert value(sim, "gpu-0", M.XID_COUNT, 1, xid="79") == 3
    sim.xid("gpu-0", 1, 48)
    assert value(sim, "gpu-0", M.XID_ERRORS, 1, err_code="48") == 48  # the last one only
    assert value(sim, "gpu-0", M.XID_COUNT, 1, xid="48") == 1
    clock.t += 300  # every occurrence has left the 5-minute window; the last value stays
    assert value(sim, "gpu-0", M.XID_ERRORS, 1) == 48
    assert value(sim, "gpu-0", M.XID_COUNT, 1, xid="79") is None
    assert value(sim, "gpu-0", M.XID_COUNT, 1) == 0


def test_xid_count_series_can_be_disabled(clock: FakeClock) -> None:
    sim = DcgmSim([make_node("n", 1, xid_count=False)], clock=clock)
    sim.xid("n", 0, 13)
    assert M.XID_COUNT not in sim.render("n")
    assert value(sim, "n", M.XID_ERRORS, 0) == 13


@pytest.mark.parametrize(("kind", "metrics"), [
    (FaultKind.ECC_SBE, (M.ECC_SBE_VOL, M.ECC_SBE_AGG)),
    (FaultKind.ECC_DBE, (M.ECC_DBE_VOL, M.ECC_DBE_AGG, M.UNCORRECTABLE_REMAPPED_ROWS)),
    (FaultKind.NVLINK_CRC, (M.NVLINK_CRC_FLIT, M.NVLINK_CRC_DATA)),
    (FaultKind.NVLINK_REPLAY, (M.NVLINK_REPLAY, M.NVLINK_RECOVERY)),
    (FaultKind.PCIE_REPLAY, (M.PCIE_REPLAY,)),
    (FaultKind.POWER, (M.POWER_VIOLATION,)),
])
def test_counters_grow_then_keep_their_value(sim: DcgmSim, clock: FakeClock, kind: FaultKind,
                                             metrics: tuple[str, ...]) -> None:
    f = sim.inject(Fault(kind, "gpu-0", 1, count=100, rate=10))
    clock.t += 5
    for m in metrics:
        assert value(sim, "gpu-0", m, 1) == 150
        assert value(sim, "gpu-0", m, 0) == 0
    sim.clear(f.id)
    clock.t += 100
    for m in metrics:
        assert value(sim, "gpu-0", m, 1) == 150  # counters never go back


def test_scheduled_fault_with_duration(sim: DcgmSim, clock: FakeClock) -> None:
    sim.row_remap_pending("gpu-0", 0, at=T0 + 10, duration=20)
    sim.ecc_dbe("gpu-0", 0, 2, at=T0 + 10)
    assert value(sim, "gpu-0", M.ROW_REMAP_PENDING, 0) == 0
    assert value(sim, "gpu-0", M.ECC_DBE_VOL, 0) == 0
    clock.t = T0 + 10
    assert value(sim, "gpu-0", M.ROW_REMAP_PENDING, 0) == 1
    assert value(sim, "gpu-0", M.ECC_DBE_VOL, 0) == 2
    clock.t = T0 + 30
    assert value(sim, "gpu-0", M.ROW_REMAP_PENDING, 0) == 0


def test_row_remap_failure_until_cleared(sim: DcgmSim, clock: FakeClock) -> None:
    f = sim.row_remap_failure("gpu-1", 1)
    assert value(sim, "gpu-1", M.ROW_REMAP_FAILURE, 1) == 1
    assert sim.clear(f.id)[0].end == clock.t
    assert value(sim, "gpu-1", M.ROW_REMAP_FAILURE, 1) == 0
    with pytest.raises(KeyError):
        sim.clear("nope")


def test_thermal_throttling(sim: DcgmSim, clock: FakeClock) -> None:
    assert value(sim, "gpu-0", M.CLOCKS_EVENT_REASONS, 0) == CLOCKS_GPU_IDLE
    sim.thermal("gpu-0", 0, 96, rate=4e8, duration=10)
    clock.t += 4
    assert value(sim, "gpu-0", M.GPU_TEMP, 0) == 96
    assert value(sim, "gpu-0", M.THERMAL_VIOLATION, 0) == 1.6e9
    reasons = int(value(sim, "gpu-0", M.CLOCKS_EVENT_REASONS, 0) or 0)
    assert reasons & CLOCKS_SW_THERMAL
    assert reasons & CLOCKS_HW_THERMAL
    clock.t += 20
    assert value(sim, "gpu-0", M.GPU_TEMP, 0) == 38
    assert value(sim, "gpu-0", M.THERMAL_VIOLATION, 0) == 4e9
    assert value(sim, "gpu-0", M.CLOCKS_EVENT_REASONS, 0) == CLOCKS_GPU_IDLE


def test_generic_set_and_grow(sim: DcgmSim) -> None:
    sim.inject(Fault(FaultKind.SET, "gpu-0", 0, metric=M.RETIRED_PENDING, value=4))
    sim.inject(Fault(FaultKind.GROW, "gpu-0", 0, metric=M.RETIRED_DBE, count=2))
    assert value(sim, "gpu-0", M.RETIRED_PENDING, 0) == 4
    assert value(sim, "gpu-0", M.RETIRED_DBE, 0) == 2


def test_gpu_gone_and_node_without_series(sim: DcgmSim, clock: FakeClock) -> None:
    f = sim.gpu_gone("gpu-0", 1)
    gpus = {s.labels["gpu"] for _, _, s in samples(sim.render("gpu-0"))}
    assert gpus == {"0"}
    sim.clear(f.id)
    assert {s.labels["gpu"] for _, _, s in samples(sim.render("gpu-0"))} == {"0", "1"}
    sim.gpu_gone("gpu-1", None)
    assert sim.render("gpu-1") == ""
    assert sim.exporter_state("gpu-1") == "up"


def test_exporter_down_windows(sim: DcgmSim, clock: FakeClock) -> None:
    sim.exporter_down("gpu-0", "503", duration=5)
    sim.exporter_down("gpu-1", "refused", at=T0 + 2, duration=5)
    assert sim.exporter_state("gpu-0") == "503"
    assert sim.exporter_state("gpu-1") == "up"
    assert sim.exporter_state("gpu-1", T0 + 3) == "refused"
    clock.t += 10
    assert sim.exporter_state("gpu-0") == sim.exporter_state("gpu-1") == "up"


@pytest.mark.parametrize(("data", "error"), [
    ({"node": "gpu-0"}, "needs a kind"),
    ({"kind": "meteor", "node": "gpu-0"}, "unknown fault kind"),
    ({"kind": "xid", "node": "gpu-0", "gpu": 0}, "positive code"),
    ({"kind": "xid", "gpu": 0, "code": 79}, "needs a node"),
    ({"kind": "exporter_down", "node": "gpu-0", "mode": "slow"}, "mode"),
    ({"kind": "set", "node": "gpu-0", "metric": "nope"}, "unknown metric"),
    ({"kind": "xid", "node": "gpu-0", "code": 79, "colour": "red"}, "unknown fault field"),
    ({"kind": "xid", "node": "gpu-0", "code": 79, "gpu": "0"}, "integer GPU"),
    ({"kind": "ecc_sbe", "node": "gpu-0", "rate": -1}, "negative"),
    ({"kind": "ecc_sbe", "node": "gpu-0", "at": 5, "after": 1}, "at or after"),
])
def test_fault_json_validation(data: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Fault.from_json(data)


def test_fault_json_round_trip(sim: DcgmSim) -> None:
    f = Fault.from_json({"kind": "xid", "gpu": 1, "code": 79, "count": 2}, node="gpu-0")
    stored = sim.inject(f)
    assert stored.at == T0
    assert stored.id
    again = Fault.from_json({k: v for k, v in stored.to_json().items()
                             if k not in ("id", "end")})
    assert again == replace(stored, id="")
    with pytest.raises(ValueError, match="unknown node"):
        sim.inject(Fault(FaultKind.XID, "nope", 0, code=79))
    with pytest.raises(KeyError):
        sim.inject(Fault(FaultKind.XID, "gpu-0", 7, code=79))


# ---------------------------------------------------------------------------------------------
# HTTP


async def test_exporters_serve_metrics_and_control(clock: FakeClock) -> None:
    sim = DcgmSim([make_node("gpu-0", 2), make_node("gpu-1", 1)], clock=clock)
    async with DcgmFleet(sim) as fleet, aiohttp.ClientSession() as http:
        assert set(fleet.addresses) == {"gpu-0", "gpu-1"}
        assert len(set(fleet.targets)) == 2
        async with http.get(fleet.url("gpu-0") + "/metrics") as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == CONTENT_TYPE
            assert await r.text() == sim.render("gpu-0")
        # the node's own control endpoint: node defaults to the exporter's node
        async with http.post(fleet.url("gpu-0") + "/control/fault",
                             json={"kind": "xid", "gpu": 1, "code": 79, "count": 2}) as r:
            assert r.status == 201
            fid = (await r.json())["id"]
        assert value(sim, "gpu-0", M.XID_COUNT, 1, xid="79") == 2
        async with http.post(fleet.url("gpu-0") + "/control/fault", json={"kind": "x"}) as r:
            assert r.status == 400
            assert "unknown fault kind" in (await r.json())["error"]
        async with http.get(fleet.url("gpu-1") + "/control/faults") as r:
            assert (await r.json())["faults"] == []
        async with http.get(fleet.control_url + "/control/faults") as r:
            assert [f["id"] for f in (await r.json())["faults"]] == [fid]
        async with http.delete(fleet.control_url + f"/control/fault/{fid}") as r:
            assert (await r.json())["ended"] == [fid]
        async with http.delete(fleet.control_url + "/control/fault/nope") as r:
            assert r.status == 404
        # 503 outage through the fleet endpoint, scheduled with "after"
        async with http.post(fleet.control_url + "/control/fault",
                             json={"kind": "exporter_down", "node": "gpu-1",
                                   "mode": "503", "after": 1}) as r:
            assert r.status == 201
        async with http.get(fleet.url("gpu-1") + "/metrics") as r:
            assert r.status == 200
        clock.t += 1
        async with http.get(fleet.url("gpu-1") + "/metrics") as r:
            assert r.status == 503
        async with http.post(fleet.control_url + "/control/clear", json={"node": "gpu-1"}) as r:
            assert len((await r.json())["ended"]) == 1
        async with http.get(fleet.url("gpu-1") + "/metrics") as r:
            assert r.status == 200


async def test_refused_exporter_closes_its_port_and_comes_back_on_it(clock: FakeClock) -> None:
    sim = DcgmSim([make_node("gpu-0", 1)], clock=clock)
    async with DcgmFleet(sim) as fleet, aiohttp.ClientSession() as http:
        url = fleet.url("gpu-0") + "/metrics"
        async with http.get(url) as r:
            assert r.status == 200
        f = await fleet.inject(Fault(FaultKind.EXPORTER_DOWN, "gpu-0", mode="refused"))
        assert not fleet.running("gpu-0")
        with pytest.raises(aiohttp.ClientConnectorError):
            await http.get(url)
        await fleet.clear(f.id)
        async with http.get(url) as r:  # same port
            assert r.status == 200
        # a scheduled outage is applied by the supervisor when the clock gets there
        sim.exporter_down("gpu-0", "refused", at=clock.t + 5, duration=5)
        clock.t += 5
        await wait_for(lambda: not fleet.running("gpu-0"))
        clock.t += 5
        await wait_for(lambda: fleet.running("gpu-0"))


async def wait_for(cond: Callable[[], bool], within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not cond():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_threaded_fleet_serves_from_its_own_thread() -> None:
    import urllib.error
    import urllib.request

    sim = DcgmSim([NodeSpec("solo", make_node("solo", 1).gpus)])
    with ThreadedDcgmFleet(sim) as fleet:
        url = fleet.url("solo") + "/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            assert b'Hostname="solo"' in r.read()
        fleet.inject(Fault(FaultKind.EXPORTER_DOWN, "solo", mode="503"))
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url, timeout=5)
        assert e.value.code == 503
        e.value.close()
        fleet.clear(node="solo")
        fleet.inject(Fault(FaultKind.EXPORTER_DOWN, "solo", mode="refused"))
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(url, timeout=5)
        fleet.clear()
        with urllib.request.urlopen(url, timeout=5) as r:
            assert r.status == 200
