"""NvmlReader through pynvml's real ctypes path, against the fake libnvidia-ml.so.1.

Each test starts the reader in a subprocess (see conftest.PROBE) whose environment points
LD_LIBRARY_PATH at the fake and FAKENVML_SCENARIO at a scenario file the test rewrites while
the probe runs (the fake re-reads it when it changes; events wake its wait through inotify).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agent.conftest import FakeNvml, Probe

N_GPUS = 4


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-4222-8333-{0xabc000 + i:012x}"


def gpu(i: int, **extra: Any) -> dict[str, Any]:
    return {"uuid": uuid(i), "serial": f"165123{i:07d}", "name": "NVIDIA H100 80GB HBM3",
            "pci": f"00000000:{0x18 + 0x10 * i:02X}:00.0", "temperature": 40 + i,
            "power_mw": 110_000 + i, **extra}


def scenario(n: int = N_GPUS, events: list[dict[str, Any]] | None = None,
             **per_gpu: dict[str, Any]) -> dict[str, Any]:
    """``per_gpu`` maps ``g<i>`` to extra keys for GPU i."""
    return {"driver": "550.54.15",
            "gpus": [gpu(i, **per_gpu.get(f"g{i}", {})) for i in range(n)],
            "events": events or []}


def start(fake: FakeNvml, **kw: Any) -> Probe:
    probe = fake.spawn(**kw)
    opened = probe.wait_for("opened")
    assert [g["uuid"] for g in opened["opened"]] == [uuid(i) for i in range(len(opened["opened"]))]
    return probe


def by_index(items: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {int(item["gpu"]["index"]): item for item in items}


# ---------------------------------------------------------------------------------------------
# enumeration and counters


def test_enumerates_gpus_with_identity(fake_nvml: FakeNvml) -> None:
    fake_nvml.write(scenario())
    probe = fake_nvml.spawn()
    opened = probe.wait_for("opened")
    assert opened["driver"] == "550.54.15"
    assert opened["opened"] == [
        {"index": i, "uuid": uuid(i), "serial": f"165123{i:07d}",
         "pciBusId": f"00000000:{0x18 + 0x10 * i:02X}:00.0", "name": "NVIDIA H100 80GB HBM3"}
        for i in range(N_GPUS)]
    out = probe.request("read", "readings")
    r0 = out["readings"][0]
    assert r0["temperatureC"] == 40
    assert r0["powerW"] == pytest.approx(110.0)
    assert r0["nvlink"]["active_links"] == 18
    assert r0["ecc"] == {"volatile_corrected": 0, "volatile_uncorrected": 0,
                         "aggregate_corrected": 0, "aggregate_uncorrected": 0}
    assert r0["errors"] == []
    assert out["assessment"]["status"] == "True"
    assert out["assessment"]["reason"] == "Healthy"
    assert probe.close() == 0


def test_counters_over_thresholds_are_reported_per_gpu(fake_nvml: FakeNvml) -> None:
    fake_nvml.write(scenario(
        8,
        # GPU 0: a GPU without NVLink or row remapping (NOT_SUPPORTED reads as None)
        g0={"nvlink": {"links": 0}, "fail": {"nvmlDeviceGetRemappedRows": "NOT_SUPPORTED"}},
        g1={"remap": {"pending": 1, "uncorrectable": 1}},
        g2={"ecc": {"volatile": {"uncorrected": 2}, "aggregate": {"uncorrected": 2}}},
        # 60 + 60 on two active links > 100; link 7 is down, its 1000 errors do not count
        g3={"nvlink": {"0": {"crc_flit": 60}, "5": {"crc_flit": 60, "replay": 3},
                       "7": {"active": 0, "crc_flit": 1000}}},
        g4={"remap": {"failure": 1}},
        g5={"ecc": {"volatile": {"corrected": 5000}}},
        g6={"pcie": {"replay": 500}},
        g7={"clocks_event_reasons": 0x40 | 0x4, "temperature": 93},
    ))
    probe = start(fake_nvml)
    out = probe.request("read", "readings")
    readings = by_index(out["readings"])
    assert readings[0]["nvlink"] is None
    assert readings[0]["remappedRows"] is None
    assert readings[0]["errors"] == []
    assert readings[1]["remappedRows"] == {"correctable": 0, "uncorrectable": 1,
                                           "pending": True, "failure": False}
    assert readings[3]["nvlink"] == {"active_links": 17, "replay": 3, "recovery": 0,
                                     "crc_flit": 120, "crc_data": 0, "ecc_data": 0}
    assert readings[7]["clocksEventReasons"] == ["HwThermalSlowdown", "SwPowerCap"]

    a = out["assessment"]
    reasons = {g["gpu"]["index"]: g["reason"] for g in a["gpus"]}
    assert reasons == {0: "Healthy", 1: "RowRemapPending", 2: "EccUncorrectable",
                       3: "NvlinkErrors", 4: "RowRemapFailure", 5: "EccCorrectableStorm",
                       6: "PcieReplays", 7: "ThermalThrottle"}
    assert (a["status"], a["reason"], a["severity"]) == ("False", "EccUncorrectable", "failed")
    assert a["message"].startswith(f"GPU 2 {uuid(2)}: 2 uncorrectable ECC errors")
    for i, what in [(1, "row remap pending"), (3, "NVLink errors crc_flit=120"),
                    (4, "row remapping failed"), (6, "500 PCIe replays"),
                    (7, "thermal slowdown HwThermalSlowdown at 93 C")]:
        assert f"GPU {i} {uuid(i)}: {what}" in a["message"]
    assert "GPU 0 " not in a["message"]
    assert probe.close() == 0


def test_counters_changed_while_running_are_read(fake_nvml: FakeNvml) -> None:
    fake_nvml.write(scenario())
    probe = start(fake_nvml)
    assert probe.request("read", "assessment")["assessment"]["reason"] == "Healthy"
    fake_nvml.write(scenario(g1={"remap": {"pending": 1}}, g3={"pcie": {"replay": 250}}))
    a = probe.request("read", "assessment")["assessment"]
    assert {g["gpu"]["index"]: g["reason"] for g in a["gpus"]} == {
        0: "Healthy", 1: "RowRemapPending", 2: "Healthy", 3: "PcieReplays"}
    fake_nvml.write(scenario())
    assert probe.request("read", "assessment")["assessment"]["reason"] == "Healthy"
    assert probe.close() == 0


def test_other_nvml_errors_are_unknown_not_bad(fake_nvml: FakeNvml) -> None:
    fake_nvml.write(scenario(g2={"fail": {"nvmlDeviceGetTotalEccErrors": "NO_PERMISSION"}}))
    probe = start(fake_nvml)
    out = probe.request("read", "readings")
    r2 = by_index(out["readings"])[2]
    assert r2["ecc"]["volatile_uncorrected"] is None
    assert "ecc volatile uncorrected: NVML_ERROR_NO_PERMISSION (Insufficient Permissions)" in (
        r2["errors"])
    assert r2["temperatureC"] == 42
    assert out["assessment"]["reason"] == "Healthy"
    assert probe.close() == 0


# ---------------------------------------------------------------------------------------------
# lost GPUs


def test_gpu_lost_while_running(fake_nvml: FakeNvml) -> None:
    fake_nvml.write(scenario())
    probe = start(fake_nvml, mode="sync")
    probe.request("watch", "watching")
    # GPU 1 falls off the bus: its calls answer GPU_IS_LOST, and so does the event wait once
    fake_nvml.write(scenario(g1={"lost": 1}, events=[{"gpu": 1, "lost": True}]))
    ev = probe.wait_for("event")["event"]
    assert (ev["kind"], ev["index"], ev["uuid"]) == ("gpu-lost", 1, uuid(1))
    # the watcher re-registers without GPU 1: the other GPUs' events still arrive
    fake_nvml.write(scenario(g1={"lost": 1}, events=[{"gpu": 1, "lost": True},
                                                     {"gpu": 3, "xid": 48}]))
    ev = probe.wait_for("event")["event"]
    assert (ev["kind"], ev["index"], ev["xid"]) == ("xid", 3, 48)

    out = probe.request("read", "readings")
    readings = by_index(out["readings"])
    assert readings[1]["lost"] is True
    assert readings[1]["gpu"]["uuid"] == uuid(1)  # identity from enumeration is kept
    for i in (0, 2, 3):
        assert readings[i]["lost"] is False
        assert readings[i]["temperatureC"] == 40 + i
        assert readings[i]["nvlink"]["active_links"] == 18
    a = out["assessment"]
    assert (a["status"], a["reason"]) == ("False", "GpuLost")
    assert {g["gpu"]["index"]: g["reason"] for g in a["gpus"]} == {
        0: "Healthy", 1: "GpuLost", 2: "Healthy", 3: "XidFatal"}
    assert a["message"] == (f"GPU 1 {uuid(1)}: GPU is lost (NVML_ERROR_GPU_IS_LOST); "
                            f"GPU 3 {uuid(3)}: XID 48 GPU_ECC_DBE")
    assert probe.close() == 0


def test_gpu_lost_at_start_does_not_stop_the_others(fake_nvml: FakeNvml) -> None:
    fake_nvml.write(scenario(g2={"lost": 1}))
    probe = fake_nvml.spawn()
    opened = probe.wait_for("opened")["opened"]
    assert [g["uuid"] for g in opened] == [uuid(0), uuid(1), "", uuid(3)]
    watching = probe.request("watch", "watching")
    assert watching["watching"] is True
    assert sorted(int(i) for i in watching["registered"]) == [0, 1, 3]
    out = probe.request("read", "readings")
    readings = by_index(out["readings"])
    assert [readings[i]["lost"] for i in range(N_GPUS)] == [False, False, True, False]
    assert readings[3]["temperatureC"] == 43
    a = out["assessment"]
    assert a["reason"] == "GpuLost"
    assert a["message"] == "GPU 2 uuid-unknown: GPU is lost (NVML_ERROR_GPU_IS_LOST)"
    assert probe.close() == 0


# ---------------------------------------------------------------------------------------------
# events


def test_xid79_event_reports_xid_fatal_for_that_gpu(fake_nvml: FakeNvml) -> None:
    fake_nvml.write(scenario())
    probe = start(fake_nvml)
    watching = probe.request("watch", "watching")
    assert watching["watching"] is True
    assert sorted(int(i) for i in watching["registered"]) == list(range(N_GPUS))
    t0 = fake_nvml.write(scenario(events=[{"gpu": 2, "xid": 79}]))
    msg = probe.wait_for("event")
    ev = msg["event"]
    assert (ev["kind"], ev["index"], ev["uuid"], ev["xid"], ev["eventType"]) == (
        "xid", 2, uuid(2), 79, 0x8)
    print(f"\nXID 79: scenario write -> callback {(ev['at'] - t0) * 1e3:.1f} ms, "
          f"-> async consumer {(msg['received'] - t0) * 1e3:.1f} ms")
    assert ev["at"] - t0 < 0.5

    a = probe.request("read", "assessment")["assessment"]
    assert (a["status"], a["reason"], a["severity"]) == ("False", "XidFatal", "failed")
    g2 = next(g for g in a["gpus"] if g["gpu"]["index"] == 2)
    assert g2["findings"][0]["xid"] == 79
    assert a["message"] == f"GPU 2 {uuid(2)}: XID 79 GPU_HAS_FALLEN_OFF_THE_BUS"
    assert all(g["reason"] == "Healthy" for g in a["gpus"] if g["gpu"]["index"] != 2)
    assert probe.close() == 0
    assert probe.wait_for("stopped")["stopped"] is True


@pytest.mark.parametrize(("mode", "wait_timeout_ms"),
                         [("async", 250), ("sync", 250), ("async", 2000)])
def test_events_are_event_driven(fake_nvml: FakeNvml, mode: str, wait_timeout_ms: int) -> None:
    """Latency from writing an event into the scenario to the callback, per event.

    With a 2 s wait timeout the latency stays in milliseconds: the wait returns when the event
    arrives, it is not polled at the timeout.
    """
    fake_nvml.write(scenario())
    probe = start(fake_nvml, mode=mode, wait_timeout_ms=wait_timeout_ms)
    probe.request("watch", "watching")
    events: list[dict[str, Any]] = []
    callback_ms: list[float] = []
    consumer_ms: list[float] = []
    xids = [79, 48, 94, 13, 64, 92]  # 13 (application) and unknown-to-policy XIDs still arrive
    for n, code in enumerate(xids):
        events.append({"gpu": n % N_GPUS, "xid": code})
        t0 = fake_nvml.write(scenario(events=events))
        msg = probe.wait_for("event")
        assert (msg["event"]["index"], msg["event"]["xid"]) == (n % N_GPUS, code)
        callback_ms.append((msg["event"]["at"] - t0) * 1e3)
        consumer_ms.append((msg["received"] - t0) * 1e3)
    print(f"\n{mode} wait_timeout={wait_timeout_ms} ms: write -> callback "
          f"median {statistics.median(callback_ms):.1f} ms, max {max(callback_ms):.1f} ms; "
          f"-> consumer median {statistics.median(consumer_ms):.1f} ms, "
          f"max {max(consumer_ms):.1f} ms")
    assert max(callback_ms) < 500
    assert max(consumer_ms) < 500

    probe.send("stop")
    stopped = probe.wait_for("stopped")
    print(f"stop() took {stopped['stop_s'] * 1e3:.0f} ms")
    assert stopped["stopped"] is True
    assert stopped["stop_s"] < wait_timeout_ms / 1000 + 1.0
    assert probe.close() == 0


def test_delayed_events_arrive_in_order(fake_nvml: FakeNvml) -> None:
    fake_nvml.write(scenario(events=[{"gpu": 0, "xid": 79, "delay_ms": 300},
                                     {"gpu": 3, "xid": 74, "delay_ms": 100}]))
    probe = start(fake_nvml)
    probe.request("watch", "watching")
    first = probe.wait_for("event")["event"]
    second = probe.wait_for("event")["event"]
    assert [(first["index"], first["xid"]), (second["index"], second["xid"])] == [(0, 79), (3, 74)]
    assert second["at"] - first["at"] >= 0.05  # its 100 ms delay counts from the first
    a = probe.request("read", "assessment")["assessment"]
    assert {g["gpu"]["index"]: g["reason"] for g in a["gpus"]} == {
        0: "XidFatal", 1: "Healthy", 2: "Healthy", 3: "XidFatal"}
    assert probe.close() == 0


def test_non_xid_critical_events(fake_nvml: FakeNvml) -> None:
    fake_nvml.write(scenario())
    probe = start(fake_nvml)
    probe.request("watch", "watching")
    # a double-bit ECC event (0x2) on GPU 1, and a PState event (0x4) nobody registered for
    fake_nvml.write(scenario(events=[{"gpu": 0, "xid": 0, "type": 0x4},
                                     {"gpu": 1, "xid": 0, "type": 0x2}]))
    ev = probe.wait_for("event")["event"]
    assert (ev["kind"], ev["index"], ev["xid"]) == ("double-bit-ecc", 1, None)
    a = probe.request("read", "assessment")["assessment"]
    assert a["reason"] == "EccUncorrectable"
    assert probe.close() == 0
    assert len([m for m in probe.messages if "event" in m]) == 1


# ---------------------------------------------------------------------------------------------
# NVML unusable: ConfigError with a clear message


@pytest.mark.parametrize(("code", "text"), [
    ("DRIVER_NOT_LOADED", "NVML_ERROR_DRIVER_NOT_LOADED (Driver Not Loaded)"),
    ("NO_PERMISSION", "NVML_ERROR_NO_PERMISSION (Insufficient Permissions)"),
    ("LIBRARY_NOT_FOUND", "NVML_ERROR_LIBRARY_NOT_FOUND (NVML Shared Library Not Found)"),
])
def test_init_failure_is_a_config_error(fake_nvml: FakeNvml, code: str, text: str) -> None:
    fake_nvml.write({**scenario(), "init.error": code})
    probe = fake_nvml.spawn()
    msg = probe.wait_for("configError")["configError"]
    print(f"\n{code}: {msg}")
    assert msg.startswith(f"NVML initialisation failed: nvmlInit returned {text}; ")
    assert "is the NVIDIA driver installed" in msg
    assert "/dev/nvidia*" in msg
    assert probe.close() == 3


def test_gpu_count_failure_is_a_config_error(fake_nvml: FakeNvml) -> None:
    fake_nvml.write({**scenario(), "fail": {"nvmlDeviceGetCount_v2": "UNKNOWN"}})
    probe = fake_nvml.spawn()
    msg = probe.wait_for("configError")["configError"]
    assert msg.startswith("NVML started but could not count the GPUs: NVML_ERROR_UNKNOWN")
    assert probe.close() == 3


@pytest.mark.parametrize("how", ["absent", "unloadable"])
def test_missing_library_is_a_config_error(fake_nvml: FakeNvml, tmp_path: Path,
                                           how: str) -> None:
    """pynvml's CDLL("libnvidia-ml.so.1") fails → NVML_ERROR_LIBRARY_NOT_FOUND → ConfigError.

    ``absent``: the probe asks the loader for a name that exists nowhere (a real NVIDIA driver
    on the test machine cannot make it pass). ``unloadable``: a file that is not a library
    shadows any real one on LD_LIBRARY_PATH.
    """
    fake_nvml.write(scenario())
    empty = tmp_path / "nolib"
    empty.mkdir()
    if how == "unloadable":
        (empty / "libnvidia-ml.so.1").write_bytes(b"")
        probe = fake_nvml.spawn(lib_dir=empty)
        detail = "libnvidia-ml.so.1: file too short"
    else:
        probe = fake_nvml.spawn(lib_dir=empty, extra=("--absent-library",))
        detail = "cannot open shared object file: No such file or directory"
    msg = probe.wait_for("configError")["configError"]
    print(f"\n{how}: {msg}")
    assert msg.startswith("NVML initialisation failed: cannot load libnvidia-ml.so.1: ")
    assert detail in msg
    assert "[NVML_ERROR_LIBRARY_NOT_FOUND]" in msg
    assert "is the NVIDIA driver installed" in msg
    assert "/dev/nvidia*" in msg
    assert probe.close() == 3
