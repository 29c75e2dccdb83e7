"""The agent's publishing side, without NVML or an API server: the GPUHealthy condition (status,
reason, message, heartbeat and transition-time rules), the status patch, Event keys and notes,
the Event queue, the metrics, the settings and flags, and the publish step with a manual clock."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from healer.agent.findings import (
    EccCounts,
    EventKind,
    GpuEvent,
    GpuInfo,
    GpuReading,
    NvlinkCounters,
    RemappedRows,
    Thresholds,
    assess,
)
from healer.agent.main import (
    Agent,
    AgentSettings,
    add_agent_flags,
    agent_settings,
    cmd_agent,
)
from healer.agent.metrics import AgentMetrics, AgentState, split_error
from healer.agent.publish import (
    XID_EVENT_REASON,
    Condition,
    EventSink,
    build_condition,
    event_key,
    event_note,
    event_reason,
    event_type,
    find_condition,
    next_write_in,
    should_write,
    status_patch,
)
from healer.core.gpu_identity import parse_entries, split_message
from healer.core.model import GpuRef
from healer.core.timefmt import parse_rfc3339, rfc3339
from healer.core.vocabulary import GPU_CONDITION
from healer.errors import ConfigError, ForbiddenError, TransientError
from healer.obs.http import Health
from healer.policy.catalog import default_catalog

NOW = 1_700_000_000.0
CATALOG = default_catalog()
TH = Thresholds()


def info(i: int) -> GpuInfo:
    return GpuInfo(index=i, uuid=f"GPU-{i:04d}", serial=f"S{i}", name="NVIDIA H100 80GB HBM3")


def reading(i: int, **kw: Any) -> GpuReading:
    base: dict[str, Any] = {"ecc": EccCounts(0, 0, 0, 0),
                            "remapped_rows": RemappedRows(0, 0, False, False),
                            "nvlink": NvlinkCounters(18, 0, 0, 0, 0, 0), "pcie_replays": 0,
                            "temperature_c": 40 + i, "power_w": 100.0,
                            "clocks_event_reasons": frozenset()}
    base.update(kw)
    return GpuReading(gpu=info(i), at=NOW, **base)


def xid(i: int, code: int, at: float = NOW - 1) -> GpuEvent:
    return GpuEvent(index=i, uuid=f"GPU-{i:04d}", serial=f"S{i}", kind=EventKind.XID,
                    event_type=0x8, at=at, xid=code, data=code)


def healthy(now: float = NOW, n: int = 4):  # type: ignore[no-untyped-def]
    return assess([reading(i) for i in range(n)], [], CATALOG, TH, now)


def xid79(now: float = NOW):  # type: ignore[no-untyped-def]
    return assess([reading(i) for i in range(4)], [xid(2, 79, now - 1)], CATALOG, TH, now)


# ---------------------------------------------------------------------------------------------
# time format


def test_times_are_rfc3339_seconds_and_parse_back() -> None:
    assert rfc3339(NOW + 0.9) == "2023-11-14T22:13:20Z"
    assert parse_rfc3339("2023-11-14T22:13:20Z") == NOW
    assert parse_rfc3339(None) is None
    assert parse_rfc3339("yesterday") is None


# ---------------------------------------------------------------------------------------------
# the condition


def test_healthy_node_is_true_healthy() -> None:
    cond = build_condition(healthy(), None, NOW)
    assert (cond.type, cond.status, cond.reason) == (GPU_CONDITION, "True", "Healthy")
    assert cond.message == ("4 GPUs healthy [healer.io/gpus v1 0:GPU-0000:S0 1:GPU-0001:S1 "
                            "2:GPU-0002:S2 3:GPU-0003:S3]")
    assert cond.heartbeat == cond.transition == NOW


def test_fault_is_false_with_the_worst_reason_and_gpu_index_uuid_xid() -> None:
    a = assess([reading(0), reading(1, remapped_rows=RemappedRows(0, 1, True, False)),
                reading(2), reading(3)], [xid(2, 79)], CATALOG, TH, NOW)
    cond = build_condition(a, None, NOW)
    assert (cond.status, cond.reason) == ("False", "XidFatal")
    assert cond.message == ("GPU 2 GPU-0002: XID 79 GPU_HAS_FALLEN_OFF_THE_BUS; "
                            "GPU 1 GPU-0001: row remap pending (a GPU reset applies it) "
                            "[healer.io/gpus v1 *1:GPU-0001:S1 *2:GPU-0002:S2 0:GPU-0000:S0 "
                            "3:GPU-0003:S3]")
    # what the controller reads back: the human message, and the affected GPUs' identity
    text, entries = split_message(cond.message)
    assert text.endswith("(a GPU reset applies it)")
    assert [(g.gpu, g.affected) for g in parse_entries(entries) if g.affected] == [
        (GpuRef(1, "GPU-0001", "S1"), True), (GpuRef(2, "GPU-0002", "S2"), True)]


@pytest.mark.parametrize(("reading_kw", "reason"), [
    ({"lost": True}, "GpuLost"),
    ({"remapped_rows": RemappedRows(0, 1, True, False)}, "RowRemapPending"),
    ({"ecc": EccCounts(0, 3, 0, 3)}, "EccUncorrectable"),
    ({"pcie_replays": 500}, "PcieReplays"),
])
def test_counter_findings_name_the_gpu(reading_kw: dict[str, Any], reason: str) -> None:
    a = assess([reading(0), reading(1), reading(2, **reading_kw)], [], CATALOG, TH, NOW)
    cond = build_condition(a, None, NOW)
    assert (cond.status, cond.reason) == ("False", reason)
    assert cond.message.startswith("GPU 2 GPU-0002: ")


def test_transition_time_moves_only_with_status_or_reason() -> None:
    first = build_condition(healthy(), None, NOW)
    # same status and reason, later: only the heartbeat moves
    later = build_condition(healthy(NOW + 30), first, NOW + 30)
    assert (later.heartbeat, later.transition) == (NOW + 30, NOW)
    # a new message with the same status and reason (one more GPU affected) is no transition
    fatal = build_condition(xid79(NOW + 40), later, NOW + 40)
    assert fatal.transition == NOW + 40
    two = assess([reading(i) for i in range(4)], [xid(2, 79, NOW + 39), xid(3, 79, NOW + 49)],
                 CATALOG, TH, NOW + 50)
    more = build_condition(two, fatal, NOW + 50)
    assert more.message != fatal.message
    assert (more.reason, more.transition, more.heartbeat) == ("XidFatal", NOW + 40, NOW + 50)
    # same status, another reason: a transition
    lost = assess([reading(2, lost=True)], [], CATALOG, TH, NOW + 60)
    moved = build_condition(lost, more, NOW + 60)
    assert (moved.status, moved.reason, moved.transition) == ("False", "GpuLost", NOW + 60)
    # back to healthy: a transition
    back = build_condition(healthy(NOW + 70), moved, NOW + 70)
    assert (back.status, back.transition) == ("True", NOW + 70)


def test_transition_time_survives_a_restart_through_the_api() -> None:
    stored = build_condition(xid79(), None, NOW)
    node = {"status": {"conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2023-01-01T00:00:00Z"},
        stored.to_api()]}}
    previous = find_condition(node)
    assert previous == stored
    again = build_condition(xid79(NOW + 100), previous, NOW + 100)
    assert again.transition == NOW


def test_find_condition_ignores_others_and_malformed() -> None:
    assert find_condition({}) is None
    assert find_condition({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}) \
        is None
    assert find_condition({"status": {"conditions": [{"type": GPU_CONDITION,
                                                      "status": "True"}]}}) is None


def test_should_write_on_change_or_when_the_heartbeat_is_due() -> None:
    first = build_condition(healthy(), None, NOW)
    assert should_write(first, None, 30)
    same = build_condition(healthy(NOW + 29), first, NOW + 29)
    assert not should_write(same, first, 30)
    assert next_write_in(first, 30, NOW + 29) == pytest.approx(1)
    due = build_condition(healthy(NOW + 30), first, NOW + 30)
    assert should_write(due, first, 30)
    changed = build_condition(xid79(NOW + 1), first, NOW + 1)
    assert should_write(changed, first, 30)
    assert next_write_in(None, 30, NOW) == 0
    assert next_write_in(first, 30, NOW + 100) == 0


def test_status_patch_touches_only_this_condition() -> None:
    cond = build_condition(xid79(), None, NOW)
    patch = status_patch(cond)
    assert patch == {"status": {"conditions": [{
        "type": "GPUHealthy", "status": "False", "reason": "XidFatal",
        "message": "GPU 2 GPU-0002: XID 79 GPU_HAS_FALLEN_OFF_THE_BUS [healer.io/gpus v1 "
                   "*2:GPU-0002:S2 0:GPU-0000:S0 1:GPU-0001:S1 3:GPU-0003:S3]",
        "lastHeartbeatTime": "2023-11-14T22:13:20Z",
        "lastTransitionTime": "2023-11-14T22:13:20Z"}]}}


# ---------------------------------------------------------------------------------------------
# Events


def test_event_key_names_node_gpu_xid_and_time() -> None:
    ev = xid(2, 79, NOW + 0.123456)
    key = event_key("gpu-1", ev)
    assert key == "agent/gpu-1/GPU-0002/xid-79/1700000000123456"
    assert event_key("gpu-1", ev) == key  # a retry is the same Event
    others = {event_key("gpu-1", xid(2, 79, NOW + 0.123457)), event_key("gpu-1", xid(3, 79, NOW)),
              event_key("gpu-1", xid(2, 48, NOW + 0.123456)), event_key("gpu-2", ev)}
    assert key not in others
    assert len(others) == 4
    no_uuid = GpuEvent(index=5, uuid="", kind=EventKind.XID, event_type=8, at=NOW, xid=79)
    assert "/index-5/" in event_key("n", no_uuid)
    lost = GpuEvent(index=1, uuid="GPU-0001", kind=EventKind.GPU_LOST, event_type=0, at=NOW)
    assert event_key("n", lost) == "agent/n/GPU-0001/gpu-lost/1700000000000000"


def test_event_reason_type_and_note() -> None:
    ev = xid(2, 79, NOW)
    assert event_reason(ev) == XID_EVENT_REASON == "GPUXid"
    assert event_type(ev, CATALOG) == "Warning"
    note = event_note(ev, CATALOG)
    assert note.startswith("XID 79 GPU_HAS_FALLEN_OFF_THE_BUS on GPU 2 GPU-0002 (serial S2) at "
                           "2023-11-14T22:13:20.000000Z: ")
    assert note.endswith("[failed; NVIDIA: reboot]")
    app = xid(0, 13, NOW)  # an application error: not a node fault
    assert event_type(app, CATALOG) == "Normal"
    assert "[not a node fault; NVIDIA: restart-app]" in event_note(app, CATALOG)
    unknown = xid(0, 99999, NOW)
    assert event_type(unknown, CATALOG) == "Normal"
    assert "not in healer's XID catalog" in event_note(unknown, CATALOG)
    lost = GpuEvent(index=1, uuid="GPU-0001", kind=EventKind.GPU_LOST, event_type=0, at=NOW)
    assert (event_reason(lost), event_type(lost, CATALOG)) == ("GPULost", "Warning")


class FakeEvents:
    """KubeEvents.emit's contract: idempotent by key; ``fail`` raises for the next calls."""

    def __init__(self) -> None:
        self.by_key: dict[str, dict[str, Any]] = {}
        self.calls = 0
        self.fail: list[Exception] = []

    async def emit(self, **kw: Any) -> None:
        self.calls += 1
        if self.fail:
            raise self.fail.pop(0)
        self.by_key.setdefault(kw["key"], kw)

    async def flush_series(self) -> int:
        return 0

    def next_series_due(self) -> float | None:
        return None

    def budget_wait(self) -> float:
        return 0.0


async def test_event_sink_flushes_in_order_keeps_transient_and_drops_refused() -> None:
    api = FakeEvents()
    sink = EventSink(api, "gpu-1", CATALOG, max_pending=3)  # type: ignore[arg-type]
    emitted: list[tuple[int, str]] = []
    dropped: list[str] = []
    sink.on_emit = lambda ev, reason: emitted.append((ev.index, reason))
    sink.on_drop = lambda ev, why: dropped.append(why)
    sink.add(xid(0, 79, NOW))
    sink.add(xid(1, 48, NOW + 1))
    api.fail = [TransientError("connection refused")]
    with pytest.raises(TransientError):
        await sink.flush()
    assert len(sink.pending) == 2
    api.fail = [ForbiddenError("HTTP 403")]
    out = await sink.flush()
    assert (out.emitted, out.dropped) == (1, 1)
    assert dropped == ["HTTP 403"]
    assert emitted == [(1, "GPUXid")]
    assert not sink.pending
    # emitting the same NVML event again is the same Event
    sink.add(xid(1, 48, NOW + 1))
    await sink.flush()
    assert len(api.by_key) == 1
    (only,) = api.by_key.values()
    assert (only["reason"], only["type"], only["node"]) == ("GPUXid", "Warning", "gpu-1")
    assert "XID 48 GPU_ECC_DBE on GPU 1" in only["note"]
    # a full queue drops the oldest
    for i in range(4):
        sink.add(xid(i, 79, NOW + 10 + i))
    assert [e.index for e in sink.pending] == [1, 2, 3]
    assert sink.overflowed == 1


# ---------------------------------------------------------------------------------------------
# metrics


def test_metrics_per_gpu_and_counters() -> None:
    readings = [reading(0), reading(1, lost=True),
                reading(2, remapped_rows=RemappedRows(0, 1, True, False),
                        errors=("pcie replays: NVML_ERROR_NO_PERMISSION (Insufficient "
                                "Permissions)",))]
    state = AgentState(node="gpu-1", driver="550.54.15", gpus=[r.gpu for r in readings],
                       readings=readings,
                       assessment=assess(readings, [xid(0, 79)], CATALOG, TH, NOW),
                       last_read=NOW)
    m = AgentMetrics(lambda: state)
    m.event(xid(0, 79))
    m.readings(readings)
    text = generate_latest(m.registry).decode()
    for line in (
            'healer_agent_gpu_xid_total{gpu="0",uuid="GPU-0000",xid="79"} 1.0',
            'healer_agent_gpu_events_total{gpu="0",kind="xid",uuid="GPU-0000"} 1.0',
            'healer_agent_nvml_errors_total{error="NVML_ERROR_NO_PERMISSION",gpu="2",'
            'operation="pcie replays"} 1.0',
            'healer_agent_info{driver="550.54.15",node="gpu-1"} 1.0',
            "healer_agent_gpus 3.0",
            'healer_agent_healthy{reason="GpuLost"} 0.0',
            'healer_agent_gpu_healthy{gpu="0",uuid="GPU-0000"} 0.0',
            'healer_agent_gpu_healthy{gpu="2",uuid="GPU-0002"} 0.0',
            'healer_agent_gpu_finding{gpu="2",reason="RowRemapPending",severity="degrading",'
            'uuid="GPU-0002"} 1.0',
            'healer_agent_gpu_lost{gpu="1",uuid="GPU-0001"} 1.0',
            'healer_agent_gpu_row_remap_pending{gpu="2",uuid="GPU-0002"} 1.0',
            'healer_agent_gpu_remapped_rows{gpu="2",kind="uncorrectable",uuid="GPU-0002"} 1.0',
            'healer_agent_gpu_temperature_celsius{gpu="0",uuid="GPU-0000"} 40.0',
            'healer_agent_gpu_nvlink_active_links{gpu="0",uuid="GPU-0000"} 18.0',
            'healer_agent_gpu_ecc_errors{counter="volatile",error_type="uncorrected",gpu="0",'
            'uuid="GPU-0000"} 0.0',
            "healer_agent_up 1.0"):
        assert line in text, line
    assert 'healer_agent_gpu_temperature_celsius{gpu="1"' not in text  # lost: no counters


def test_split_error() -> None:
    assert split_error("ecc volatile uncorrected: NVML_ERROR_UNKNOWN (Unknown Error)") == (
        "ecc volatile uncorrected", "NVML_ERROR_UNKNOWN")
    assert split_error("no NVML handle") == ("no NVML handle", "unknown")


# ---------------------------------------------------------------------------------------------
# settings and flags


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_agent_flags(p)
    return p.parse_args(list(argv))


def test_flags_defaults_and_node_name_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    s = agent_settings(parse([]))
    assert (s.node_name, s.kubeconfig, s.interval, s.heartbeat) == ("gpu-7", None, 10.0, 30.0)
    assert (s.http_port, s.thresholds) == (8081, Thresholds())
    s = agent_settings(parse(["--node-name", "gpu-8", "--interval", "2", "--heartbeat", "5",
                              "--pcie-replays-max", "7", "--log-format", "json"]))
    assert (s.node_name, s.interval, s.heartbeat, s.thresholds.pcie_replays_max,
            s.log_json) == ("gpu-8", 2.0, 5.0, 7, True)


@pytest.mark.parametrize(("argv", "message"), [
    (["--heartbeat", "0"], "argument --heartbeat: expected seconds from 1 to 3600, got 0"),
    (["--interval", "-1"], "argument --interval: expected seconds from 0.1 to 3600, got -1"),
    (["--interval", "nan"], "argument --interval: expected a finite number of seconds"),
    (["--pcie-replays-max", "-1"], "argument --pcie-replays-max: expected a number from 0"),
])
def test_bad_flags_are_refused_by_the_parser_with_the_reason(
        capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as e:
        parse(["--node-name", "n", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    ([], "needs the node's name: --node-name or $NODE_NAME"),
])
def test_bad_settings_exit_2_with_the_reason(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str],
                                             argv: list[str], message: str) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    args = parse(argv)
    with pytest.raises(ConfigError) as e:
        agent_settings(args)
    assert message in str(e.value)
    assert cmd_agent(args) == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# the publish step, with a manual clock and fakes for NVML and the API


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


class FakeReader:
    driver_version = "550.54.15"
    watching = True

    def __init__(self, n: int = 4) -> None:
        self.gpus = tuple(info(i) for i in range(n))
        self.readings = [reading(i) for i in range(n)]

    def read(self) -> list[GpuReading]:
        return list(self.readings)


class FakeWriter:
    def __init__(self, stored: Condition | None = None) -> None:
        self.stored = stored
        self.writes: list[Condition] = []
        self.reads = 0
        self.fail: Exception | None = None

    async def current(self) -> Condition | None:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return self.stored

    async def write(self, cond: Condition) -> None:
        if self.fail is not None:
            raise self.fail
        self.writes.append(cond)
        self.stored = cond


def make_agent(writer: FakeWriter, clock: Clock, heartbeat: float = 30.0) -> tuple[
        Agent, FakeReader, FakeEvents]:
    reader = FakeReader()
    events = FakeEvents()
    sink = EventSink(events, "gpu-1", CATALOG)  # type: ignore[arg-type]
    settings = AgentSettings(node_name="gpu-1", heartbeat=heartbeat, interval=10.0)
    agent = Agent(settings, reader, writer, sink, CATALOG, Health(),  # type: ignore[arg-type]
                  clock=clock)
    return agent, reader, events


async def test_publish_writes_on_change_and_heartbeats_otherwise() -> None:
    clock, writer = Clock(NOW), FakeWriter()
    agent, reader, events = make_agent(writer, clock)
    await agent.read()
    assert await agent.publish_once()
    assert [(c.status, c.reason) for c in writer.writes] == [("True", "Healthy")]
    clock.t += 10
    assert not await agent.publish_once()  # nothing new, heartbeat not due
    clock.t += 20
    assert await agent.publish_once()  # heartbeat due
    hb = writer.writes[-1]
    assert (hb.heartbeat, hb.transition) == (NOW + 30, NOW)
    # an XID: written at once, with its Event
    clock.t += 1
    agent.on_event(xid(2, 79, clock.t))
    assert agent.wake.is_set()
    assert agent.poll_now.is_set()
    assert await agent.publish_once()
    fatal = writer.writes[-1]
    assert (fatal.status, fatal.reason, fatal.transition) == ("False", "XidFatal", NOW + 31)
    assert "GPU 2 GPU-0002: XID 79" in fatal.message
    assert [e["reason"] for e in events.by_key.values()] == ["GPUXid"]
    # heartbeats keep the transition time
    clock.t += 30
    assert await agent.publish_once()
    assert (writer.writes[-1].heartbeat, writer.writes[-1].transition) == (NOW + 61, NOW + 31)
    # a counter going bad on another GPU: new message, same reason, no transition
    reader.readings[1] = reading(1, remapped_rows=RemappedRows(0, 1, True, False))
    await agent.read()
    clock.t += 1
    assert await agent.publish_once()
    assert writer.writes[-1].transition == NOW + 31
    assert "GPU 1 GPU-0001: row remap pending" in writer.writes[-1].message
    # the XID leaves the event window: RowRemapPending remains, a transition
    clock.t += TH.event_window_s
    assert await agent.publish_once()
    last = writer.writes[-1]
    assert (last.reason, last.transition) == ("RowRemapPending", clock.t)
    assert writer.reads == 1  # the stored condition is read once, at the first write


async def test_publish_keeps_the_stored_transition_time_after_a_restart() -> None:
    stored = Condition("False", "XidFatal", "GPU 2 GPU-0002: XID 79 GPU_HAS_FALLEN_OFF_THE_BUS",
                       heartbeat=NOW - 5, transition=NOW - 500)
    clock, writer = Clock(NOW), FakeWriter(stored)
    agent, _, _ = make_agent(writer, clock)
    await agent.read()
    agent.on_event(xid(2, 79, NOW - 1))
    await agent.publish_once()
    assert writer.writes[-1].transition == NOW - 500
    # a different reason after the restart: a transition now
    clock2, writer2 = Clock(NOW), FakeWriter(stored)
    agent2, _, _ = make_agent(writer2, clock2)
    await agent2.read()
    await agent2.publish_once()
    assert (writer2.writes[-1].reason, writer2.writes[-1].transition) == ("Healthy", NOW)


async def test_an_api_outage_is_retried_with_backoff_and_logged_once() -> None:
    clock, writer = Clock(NOW), FakeWriter()
    agent, _, _ = make_agent(writer, clock, heartbeat=5.0)
    await agent.read()
    writer.fail = TransientError("get node gpu-1: ClientConnectorError: refused")
    delays = []
    with capture_logs() as logs:
        for _ in range(6):
            delays.append(await agent.publish_step())
            clock.t += 1
        assert not agent.health.is_ready()[0]
        writer.fail = None
        assert await agent.publish_step() == 5.0
        assert await agent.publish_step() == 5.0
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]  # backoff, capped by the heartbeat
    assert agent.health.ready["condition-written"]
    assert len(writer.writes) == 1
    assert [(e["event"], e["what"]) for e in logs if e["event"] in ("outage", "recovered")] == [
        ("outage", "kube-apiserver"), ("recovered", "kube-apiserver")]
    outage = next(e for e in logs if e["event"] == "outage")
    assert "ClientConnectorError: refused" in outage["error"]
    assert agent.failures == 0
