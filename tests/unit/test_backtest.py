"""healer backtest without Prometheus: synthetic history (what ``PrometheusSource.history``
returns) replayed through the real engine; the report, its JSON stability, the fidelity of the
compact replay against the plain :class:`~healer.sim.engine.Replay`, and the command line."""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from healer.backtest.cli import add_backtest_flags, cmd_backtest
from healer.backtest.history import instants
from healer.backtest.inputs import parse_labels, parse_seconds, parse_time
from healer.backtest.replay import HistoryReplay, evaluated_policies, replay_history
from healer.backtest.report import Report
from healer.backtest.world import BacktestWorld
from healer.core.model import GpuRef, Signal, SignalKind
from healer.core.rules import Breaker, Guardrails, MetricRule, Mode, PolicySet, Quantity
from healer.core.timefmt import rfc3339
from healer.core.topology import DOMAIN_LABEL
from healer.errors import ConfigError
from healer.policy.load import load_policy_set
from healer.sim.engine import Replay
from healer.sim.world import Latencies, SimNode

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_767_096_000.0  # 2025-12-30T12:00:00Z
STEP = 60.0
M, H = 60.0, 3600.0
GPU_PRESENT = {"nvidia.com/gpu.present": "true"}


@pytest.fixture(scope="module")
def default_policies() -> PolicySet:
    return load_policy_set([ROOT / "policies" / "default.yaml"])


def with_breaker(ps: PolicySet, threshold: int = 3) -> PolicySet:
    """policies/default.yaml with a fleet breaker of ``threshold`` nodes in 10m (30m cooldown)
    and room for two nodes out at once."""
    g = Guardrails(max_concurrent=2, max_unavailable=Quantity(25, percent=True),
                   breaker=Breaker(600.0, Quantity(threshold), 1800.0))
    return replace(ps, fleet=replace(ps.fleet, guardrails=g))


def key_of(ps: PolicySet, rule: str) -> str:
    for p in ps.policies:
        r = p.rule(rule)
        if isinstance(r, MetricRule):
            return r.key
    raise KeyError(rule)


def gpu(node: str, index: int) -> GpuRef:
    return GpuRef(index, f"GPU-{node}-{index}")


@dataclass
class History:
    """A synthetic history shaped like ``PrometheusSource.history``'s: per node and step a
    FRESH heartbeat (or a STALE marker while its exporter is down) and one sample per metric
    rule key and GPU; XIDs at their own times."""

    policies: PolicySet
    nodes: list[str]
    gpus: int = 2
    start: float = T0
    end: float = T0 + 2 * H
    outages: dict[str, tuple[float, float]] = field(default_factory=dict)
    values: list[tuple[str, int, str, float, float, float]] = field(default_factory=list)
    xids: list[tuple[str, int, int, float]] = field(default_factory=list)
    leftovers: bool = True  # range functions answer from old samples during an outage
    rules: tuple[str, ...] = ()  # only the samples of these metric rules (default: all)

    def metric(self, node: str, g: int, rule: str, start: float, end: float,
               value: float) -> None:
        self.values.append((node, g, key_of(self.policies, rule), start, end, value))

    def signals(self) -> list[Signal]:
        keys = sorted({r.key for p in self.policies.policies for r in p.rules
                       if isinstance(r, MetricRule) and (not self.rules or r.name in self.rules)})
        out: list[Signal] = []
        n = int((self.end - self.start) // STEP)
        for k in range(n + 1):
            t = self.start + k * STEP
            for node in self.nodes:
                a, b = self.outages.get(node, (-1.0, -1.0))
                down = a <= t < b
                if down:
                    out.append(Signal(node, "dcgm", SignalKind.STALE, "dcgm", 0.0, t, None,
                                      Signal.details(reason="exporter-down")))
                    if not self.leftovers:
                        continue
                else:
                    out.append(Signal(node, "dcgm", SignalKind.FRESH, "dcgm", 1.0, t))
                for key in keys:
                    for g in range(self.gpus):
                        v = 40.0 if "GPU_TEMP" in key else 0.0
                        for vn, vg, vk, va, vb, vv in self.values:
                            if (vn, vg, vk) == (node, g, key) and va <= t < vb:
                                v = vv
                        if down:
                            v = 5000.0  # a leftover: must never become a fault
                        out.append(Signal(node, "dcgm", SignalKind.METRIC, key, v, t,
                                          gpu(node, g)))
        for node, g, code, t in self.xids:
            out.append(Signal(node, "dcgm", SignalKind.XID, "DCGM_FI_DEV_XID_ERRORS",
                              float(code), t, gpu(node, g), Signal.details(via="count")))
        out.sort(key=lambda s: (s.observed_at, s.node, s.kind.value))
        return out


def run(h: History, **kw: Any) -> Report:
    return replay_history(h.signals(), h.policies, h.start, h.end, step=STEP,
                          source="http://prometheus.test", **kw)


def week_like(ps: PolicySet) -> History:
    """An XID 79, an ECC SBE storm, an exporter outage and an XID 48 burst on three nodes."""
    nodes = [f"gpu-{i}" for i in range(8)]
    h = History(ps, nodes, end=T0 + 4 * H)
    h.xids.append(("gpu-1", 1, 79, T0 + 20 * M))
    h.metric("gpu-3", 0, "ecc-sbe-storm", T0 + 50 * M, T0 + 110 * M, 5000.0)
    h.outages["gpu-5"] = (T0 + 60 * M, T0 + 120 * M)
    h.xids += [("gpu-2", 0, 48, T0 + 150 * M), ("gpu-4", 1, 48, T0 + 152 * M),
               ("gpu-6", 0, 48, T0 + 154 * M)]
    return h


# ---------------------------------------------------------------------------------------------
# The report


def test_report_matches_the_scripted_faults(default_policies: PolicySet) -> None:
    ps = with_breaker(default_policies)
    report = run(week_like(ps))
    inc = {i.node: i for i in report.incidents}
    assert sorted(inc) == ["gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-6"]

    xid79 = inc["gpu-1"]
    assert (xid79.severity, xid79.rules, xid79.policy) == ("failed", ("fatal-xid",), "gpu-fatal")
    assert xid79.gpus == (gpu("gpu-1", 1),)
    assert xid79.opened_at == T0 + 20 * M
    assert xid79.admitted_at == xid79.opened_at  # admitted at once
    assert xid79.drained_at == xid79.opened_at + 1  # one action latency
    assert xid79.cordoned_at is not None
    assert xid79.cordoned_at > xid79.drained_at
    assert xid79.spare.startswith("backtest-spare-")
    assert xid79.phase == "Repair"
    assert xid79.out_since == xid79.drained_at
    assert xid79.out_until == xid79.replaced_at  # capacity back once the spare serves
    assert xid79.replaced_at is not None
    assert xid79.replaced_at - xid79.opened_at < 2 * M
    assert not xid79.blocks
    assert xid79.escalated_at is None

    sbe = inc["gpu-3"]
    assert (sbe.severity, sbe.rules, sbe.policy) == ("degrading", ("ecc-sbe-storm",),
                                                     "gpu-degrading")
    assert sbe.opened_at == T0 + 50 * M
    assert [s.step for s in sbe.steps][:2] == ["checkpoint", "drain"]  # asks the jobs first

    # the burst: the third node in 10 minutes trips the breaker and is held for its cooldown
    assert not inc["gpu-2"].blocks
    assert not inc["gpu-4"].blocks
    held = inc["gpu-6"]
    assert [(b.guardrail, b.current, b.limit) for b in held.blocks] == [("breaker", 3, 3)]
    assert held.blocks[0].since == T0 + 154 * M
    assert held.blocks[0].until == T0 + 154 * M + 1800
    assert held.admitted_at == held.blocks[0].until
    assert "breaker tripped: 3 nodes" in held.blocks[0].message

    s = report.summary
    assert (s.incidents, dict(s.by_severity)) == (5, {"failed": 4, "degrading": 1})
    assert [(t.scope, t.node, t.count, t.threshold, t.at) for t in s.breaker_trips] == [
        ("fleet", "gpu-6", 3, 3, T0 + 154 * M)]
    assert s.breaker_trips[0].closes_at == T0 + 154 * M + 1800
    assert dict(s.blocks) == {"breaker": 1}
    assert s.nodes_taken_out == 5
    assert s.max_concurrently_out == 1
    assert s.spares_claimed == 5
    assert s.spares_needed == 5
    assert (s.nodes, s.governed, s.escalations, s.stale_nodes) == (8, 8, 0, 1)

    # the exporter outage: stale (unknown) for its duration, never an incident
    g5 = report.node("gpu-5")
    assert not g5.incidents
    assert not g5.disruptions
    assert [(p.since, p.until) for p in g5.stale] == [(T0 + 60 * M, T0 + 120 * M)]
    assert report.node("gpu-1").disruptions[0].action == "drain"


def test_json_is_stable_and_complete(default_policies: PolicySet) -> None:
    ps = with_breaker(default_policies)
    h = week_like(ps)
    first = run(h).to_json()
    assert run(h).to_json() == first
    shuffled = h.signals()
    random.Random(7).shuffle(shuffled)
    again = replay_history(shuffled, ps, h.start, h.end, step=STEP,
                           source="http://prometheus.test")
    assert again.to_json() == first  # the order Prometheus answers in does not matter
    doc = json.loads(first)
    assert json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n" == first
    assert doc["formatVersion"] == 1
    assert doc["range"] == {"from": "2025-12-30T12:00:00Z", "to": "2025-12-30T16:00:00Z",
                            "stepSeconds": 60}
    assert doc["assumptions"]["world"] == "optimistic"
    assert doc["assumptions"]["spares"] == "unlimited"
    assert doc["assumptions"]["guardrails"] == "on"
    assert {p["name"]: (p["configuredMode"], p["evaluatedMode"]) for p in doc["policies"]} == {
        "gpu-degrading": ("observe", "act"), "gpu-fatal": ("observe", "act")}
    g6 = doc["nodes"]["gpu-6"]["incidents"][0]
    assert g6["openedAt"] == rfc3339(T0 + 154 * M) == "2025-12-30T14:34:00Z"
    assert g6["blocks"][0]["guardrail"] == "breaker"
    assert (g6["blocks"][0]["current"], g6["blocks"][0]["limit"]) == (3, 3)
    assert doc["summary"]["breakerTrips"][0]["node"] == "gpu-6"
    assert doc["summary"]["sparesNeeded"] == 5
    assert doc["nodes"]["gpu-5"]["stale"][0]["since"] == "2025-12-30T13:00:00Z"


def test_table_says_what_would_have_happened(default_policies: PolicySet) -> None:
    text = run(week_like(with_breaker(default_policies))).table()
    assert "policies evaluated as act (configured: gpu-degrading=observe, gpu-fatal=observe)" \
        in text
    assert "optimistic world" in text
    assert "drains complete at once" in text
    assert "guardrails on" in text
    for needle in ("gpu-1", "fatal-xid", "ecc-sbe-storm", "breaker 3/3 for 30m",
                   "gpu-5 2025-12-30 13:00:00", "breaker trips:", "spares claimed 5, needed 5"):
        assert needle in text, needle


def test_as_configured_keeps_observe_only(default_policies: PolicySet) -> None:
    report = run(week_like(with_breaker(default_policies)), as_configured=True)
    assert report.as_configured
    assert "policies evaluated as configured" in report.table()
    incidents = report.incidents
    assert len(incidents) == 5
    for i in incidents:
        assert i.mode == "observe"
        assert i.admitted_at is None
        assert i.drained_at is None
        assert not i.steps
        assert [b.guardrail for b in i.blocks] == ["observe-only"]
    assert report.summary.nodes_taken_out == 0
    assert report.summary.spares_claimed == 0
    assert report.summary.breaker_trips  # the breaker counts incidents in every mode


def test_stale_telemetry_is_never_a_fault(default_policies: PolicySet) -> None:
    """Range functions keep answering from old samples while an exporter is down: those
    samples (here far above every threshold) are dropped, like the daemon drops them."""
    h = History(default_policies, ["gpu-0", "gpu-1"])
    h.outages["gpu-0"] = (T0 + 10 * M, T0 + 70 * M)
    report = run(h)
    assert not report.incidents
    assert [(p.since, p.until) for p in report.node("gpu-0").stale] == [
        (T0 + 10 * M, T0 + 70 * M)]
    assert "reported stale" in report.node("gpu-0").stale[0].reason
    assert not report.node("gpu-1").stale


def test_one_degrading_xid_is_not_two(default_policies: PolicySet) -> None:
    h = History(default_policies, ["gpu-0"])
    h.xids.append(("gpu-0", 0, 94, T0 + 5 * M))  # degrading-xid needs 2 within 24h
    assert not run(h).incidents
    h.xids.append(("gpu-0", 1, 94, T0 + 30 * M))
    (inc,) = run(h).incidents
    assert (inc.rules, inc.opened_at, inc.severity) == (("degrading-xid",), T0 + 30 * M,
                                                        "degrading")


def test_a_held_for_for_rule_confirms_after_its_hold(default_policies: PolicySet) -> None:
    h = History(default_policies, ["gpu-0"])
    h.metric("gpu-0", 1, "row-remap-pending", T0 + 10 * M, T0 + 2 * H, 1.0)  # for: 10m
    (inc,) = run(h).incidents
    assert inc.opened_at == T0 + 20 * M
    assert inc.phases[0].source == "Suspect"
    assert inc.phases[0].target == "Degrading"


def test_recovered_before_admission(default_policies: PolicySet) -> None:
    """A degrading signal that clears while the breaker holds the incident: Recovered."""
    ps = with_breaker(default_policies, threshold=2)
    h = History(ps, ["gpu-0", "gpu-1"])
    h.xids.append(("gpu-0", 0, 79, T0 + 5 * M))
    h.metric("gpu-1", 0, "pcie-replays", T0 + 7 * M, T0 + 20 * M, 500.0)
    report = run(h)
    hot = report.node("gpu-1").incidents[0]
    assert hot.blocks[0].until == T0 + 20 * M
    assert hot.blocks[0].guardrail == "breaker"
    assert hot.phase == "Done"
    assert hot.outcome == "recovered"
    assert hot.drained_at is None
    assert report.summary.recovered == 1
    assert report.summary.nodes_taken_out == 1


def test_a_limited_spare_pool_holds_for_capacity(default_policies: PolicySet) -> None:
    h = History(default_policies, ["gpu-0", "gpu-1"], end=T0 + 4 * H)
    h.xids += [("gpu-0", 0, 79, T0 + 5 * M), ("gpu-1", 0, 79, T0 + 30 * M)]
    one = run(h, spares=1)
    first, second = one.incidents
    assert first.spare == "backtest-spare-001"
    assert first.phase == "Repair"
    assert second.held_for_capacity
    assert second.phase == "HeldForCapacity"
    assert second.out_until is None  # still out at the end of the range
    assert (one.summary.spares_claimed, one.summary.spares_needed) == (1, 1)
    assert one.summary.held_for_capacity == 1
    assert one.summary.max_concurrently_out == 1

    # a repaired node returns to the pool (after its XID left the window): the held node
    # gets it
    back = run(h, spares=1, repair_after=2 * H)
    first, second = back.incidents
    assert first.phase == "Done"
    assert first.outcome == "replaced"
    assert second.held_for_capacity
    assert second.spare == "gpu-0"
    assert second.phase == "Repair"
    assert second.replaced_at is not None
    assert second.replaced_at > T0 + 2 * H + 5 * M
    assert back.summary.spares_needed == 1
    assert back.summary.governed == 2

    unlimited = run(h)
    assert unlimited.summary.spares_needed == 2
    assert unlimited.summary.held_for_capacity == 0


def test_labels_from_kubernetes(default_policies: PolicySet) -> None:
    h = History(default_policies, ["gpu-0", "gpu-1", "cpu-0"])
    h.xids += [("gpu-0", 0, 79, T0 + 5 * M), ("cpu-0", 0, 79, T0 + 5 * M)]
    nodes = {"gpu-0": {**GPU_PRESENT, DOMAIN_LABEL: "nvl-a"},
             "gpu-1": {**GPU_PRESENT, DOMAIN_LABEL: "nvl-a"},
             "gpu-9": {**GPU_PRESENT, DOMAIN_LABEL: "nvl-b"},  # no telemetry
             "spare-0": {**GPU_PRESENT, "healer.io/role": "spare"}}
    report = run(h, nodes=nodes, label_source="labels from Kubernetes")
    (inc,) = report.incidents  # cpu-0 is not in Kubernetes: no policy selects it
    assert inc.node == "gpu-0"
    assert inc.spare_match == "domain"
    assert report.node("cpu-0").policies == ()
    assert report.node("cpu-0").telemetry
    assert report.node("gpu-9").policies
    assert not report.node("gpu-9").telemetry
    assert report.node("spare-0").policies == ()  # a warm spare is never remediated
    assert report.summary.governed == 3


def test_node_labels_select_nothing(default_policies: PolicySet) -> None:
    h = History(default_policies, ["gpu-0"])
    h.xids.append(("gpu-0", 0, 79, T0 + 5 * M))
    report = run(h, node_labels={"kind": "cpu"})
    assert not report.incidents
    assert report.summary.governed == 0
    assert "no incident" in report.table()


def test_evaluated_policies(default_policies: PolicySet) -> None:
    acting = evaluated_policies(default_policies, as_configured=False)
    assert {p.mode for p in acting.policies} == {Mode.ACT}
    assert evaluated_policies(default_policies, as_configured=True) is default_policies


def test_bad_ranges_are_config_errors(default_policies: PolicySet) -> None:
    with pytest.raises(ConfigError, match="empty"):
        replay_history([], default_policies, T0, T0)
    with pytest.raises(ConfigError, match="step"):
        replay_history([], default_policies, T0, T0 + 60, step=0)
    empty = replay_history([], default_policies, T0, T0 + 60)
    assert empty.summary.nodes == 0
    assert not empty.incidents


# ---------------------------------------------------------------------------------------------
# Fidelity: the compact replay takes the same decisions as the plain Replay


def _timeline(replay: Replay) -> list[tuple[float, str, str, str]]:
    return [(round(e.at, 3), e.node, e.kind, e.text) for e in replay.timeline]


def _world(h: History) -> BacktestWorld:
    return BacktestWorld([SimNode(n, dict(GPU_PRESENT)) for n in h.nodes],
                         latencies=Latencies(), spares=None, spare_labels=GPU_PRESENT,
                         repair_after=None)


def _plain_and_compact(h: History, ps: PolicySet) -> tuple[Replay, HistoryReplay]:
    batches = instants(h.signals(), h.start, h.end)
    plain = Replay(ps, _world(h), h.start)
    for b in batches:
        for s in b:
            plain.add_signal(s)
    plain.run(h.end)
    world = _world(h)
    compact = HistoryReplay(ps, world, h.start)
    for b in batches:
        compact.add_callback(b[0].observed_at, compact.feeder(b))
    compact.run(h.end)
    return plain, compact


@pytest.mark.parametrize("as_configured", [False, True], ids=["act", "as-configured"])
def test_compact_replay_decides_like_the_plain_replay(default_policies: PolicySet,
                                                      as_configured: bool) -> None:
    ps = evaluated_policies(with_breaker(default_policies, threshold=2), as_configured)
    h = History(ps, ["gpu-0", "gpu-1", "gpu-2"], end=T0 + 150 * M,
                rules=("row-remap-pending", "gpu-too-hot", "ecc-dbe"))
    h.xids += [("gpu-0", 1, 79, T0 + 12 * M + 7), ("gpu-1", 0, 94, T0 + 15 * M),
               ("gpu-1", 0, 94, T0 + 16 * M), ("gpu-2", 0, 48, T0 + 17 * M)]
    h.metric("gpu-2", 1, "row-remap-pending", T0 + 40 * M, T0 + 80 * M, 1.0)
    h.metric("gpu-1", 1, "gpu-too-hot", T0 + 90 * M, T0 + 95 * M, 97.0)  # clears: no incident
    h.outages["gpu-2"] = (T0 + 100 * M, T0 + 130 * M)
    plain, compact = _plain_and_compact(h, ps)
    expected = _timeline(plain)
    assert any(kind == "transition" for _, _, kind, _ in expected)
    assert any("stale" in text for _, _, _, text in expected)
    assert _timeline(compact) == expected
    assert compact.evaluations < len(h.signals()) // 10  # and far fewer evaluations


# ---------------------------------------------------------------------------------------------
# Parsing and the command line


def test_parse_time() -> None:
    now = 1_800_000_000.0
    assert parse_time("now", now) == now
    assert parse_time("now-7d", now) == now - 7 * 86400
    assert parse_time("now - 90m", now) == now - 5400
    assert parse_time("now+1h", now) == now + 3600
    assert parse_time("2025-12-30T12:00:00Z", now) == T0
    assert parse_time("2025-12-30T13:00:00+01:00", now) == T0
    assert parse_time("2025-12-30T12:00:00", now) == T0  # no offset: UTC
    assert parse_time("1767096000", now) == T0
    for bad in ("yesterday", "now-7x", "2025-13-01T00:00:00Z"):
        with pytest.raises(ConfigError, match="bad time"):
            parse_time(bad, now)


def test_parse_seconds_labels_and_times() -> None:
    assert parse_seconds("60s", "--step") == 60.0
    assert parse_seconds("5m", "--step") == 300.0
    assert parse_seconds("90", "--step") == 90.0
    with pytest.raises(ConfigError, match="--step"):
        parse_seconds("soon", "--step")
    assert parse_labels("a=b, c=d,") == {"a": "b", "c": "d"}
    assert parse_labels("") == {}
    with pytest.raises(ConfigError, match="key=value"):
        parse_labels("novalue")
    assert rfc3339(T0, millis=True) == "2025-12-30T12:00:00Z"
    assert rfc3339(T0 + 0.25, millis=True) == "2025-12-30T12:00:00.250Z"


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_backtest_flags(p)
    return p.parse_args(list(argv))


def test_flags_and_defaults() -> None:
    a = _args("--prometheus", "http://p:9090", "--policies", "policies", "--from", "now-7d")
    assert (a.end, a.step, a.spares, a.json, a.as_configured) == ("now", "60s", None, False,
                                                                   False)
    assert a.node_labels == "nvidia.com/gpu.present=true"
    assert a.kubeconfig is None


@pytest.mark.parametrize(("argv", "message"), [
    (["--from", "later"], "bad time"),
    (["--from", "now-1h", "--to", "now-2h"], "empty"),
    (["--from", "now-1h", "--step", "0s"], "step"),
    (["--from", "now-1h", "--node-labels", "oops"], "key=value"),
])
def test_bad_flags_exit_2(argv: list[str], message: str,
                          capsys: pytest.CaptureFixture[str]) -> None:
    # nothing listens on port 9: the command must fail on its flags before any query
    args = _args("--prometheus", "http://127.0.0.1:9", "--policies",
                 str(ROOT / "policies" / "default.yaml"), *argv)
    assert cmd_backtest(args) == 2
    assert message in capsys.readouterr().err


def test_bad_policies_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: nope\n")
    args = _args("--prometheus", "http://127.0.0.1:9", "--policies", str(bad), "--from",
                 "now-1h")
    assert cmd_backtest(args) == 2
    assert "invalid policies" in capsys.readouterr().err


def _seen(batches: Iterable[list[Signal]]) -> list[float]:
    return [b[0].observed_at for b in batches]


def test_instants_groups_sorts_and_drops_samples_without_a_heartbeat(
        default_policies: PolicySet) -> None:
    h = History(default_policies, ["gpu-0"], end=T0 + 3 * M)
    h.outages["gpu-0"] = (T0 + M, T0 + 2 * M)
    sigs = h.signals()
    batches = instants(reversed(sigs), T0 + M, T0 + 3 * M)
    assert _seen(batches) == [T0 + M, T0 + 2 * M, T0 + 3 * M]
    down = batches[0]
    assert [s.kind for s in down] == [SignalKind.STALE]  # the leftovers are gone
    assert all(len({s.observed_at for s in b}) == 1 for b in batches)


def test_dry_run_only_records_intent(default_policies: PolicySet) -> None:
    ps = replace(default_policies, policies=tuple(replace(p, mode=Mode.DRY_RUN)
                                                  for p in default_policies.policies))
    h = History(ps, ["gpu-0", "gpu-1"])
    h.xids.append(("gpu-0", 0, 79, T0 + 5 * M))
    report = run(h, as_configured=True)
    (inc,) = report.incidents
    assert inc.mode == "dryRun"
    assert inc.drained_at == T0 + 5 * M + 1  # the whole flow, recorded as intent
    s = report.summary
    assert (s.dry_run_incidents, s.nodes_taken_out, s.spares_claimed) == (1, 0, 0)
    assert "dryRun: healer would only have recorded the steps" in report.table()


class _ChunkedSource:
    """Answers ``history`` like PrometheusSource: every step in ``[a, b]`` plus the XIDs
    whose sample lies in ``[a, b]``."""

    def __init__(self, xids: list[float]) -> None:
        self.xids = xids
        self.calls: list[tuple[float, float, float]] = []

    async def history(self, a: float, b: float, step: float) -> list[Signal]:
        self.calls.append((a, b, step))
        out = [Signal("n", "dcgm", SignalKind.FRESH, "dcgm", 1.0, a + k * step)
               for k in range(int((b - a) // step) + 1)]
        out += [Signal("n", "dcgm", SignalKind.XID, "x", 79.0, t) for t in self.xids
                if a <= t <= b]
        return sorted(out, key=lambda s: s.observed_at)


async def test_history_is_fetched_a_day_at_a_time() -> None:
    from healer.backtest.history import fetch_history

    end = T0 + 2 * 86400 + 30 * M
    src = _ChunkedSource([T0 + 86400, T0 + 86400 + 7.5, end])
    got = await fetch_history(src.history, T0, end, STEP)
    assert [(a - T0, b - T0) for a, b, _ in src.calls] == [
        (0, 86400), (86400, 2 * 86400), (2 * 86400, 2 * 86400 + 30 * M)]
    fresh = [s.observed_at for s in got if s.kind is SignalKind.FRESH]
    assert fresh == [T0 + k * STEP for k in range(int((end - T0) // STEP) + 1)]  # each once
    assert [s.observed_at for s in got if s.kind is SignalKind.XID] == src.xids


def test_feeding_a_chunk_at_a_time_gives_the_same_report(default_policies: PolicySet) -> None:
    from healer.backtest.replay import Backtest

    ps = with_breaker(default_policies)
    h = week_like(ps)
    sigs = [s for s in h.signals()  # gpu-7 joins the fleet late
            if s.node != "gpu-7" or s.observed_at >= T0 + 90 * M]
    whole = replay_history(sigs, ps, h.start, h.end, step=STEP, source="x")
    bt = Backtest(ps, h.start, h.end, step=STEP, source="x")
    for k in range(4):
        bt.feed(s for s in sigs if h.start + k * H <= s.observed_at < h.start + (k + 1) * H)
    bt.feed(s for s in sigs if s.observed_at == h.end)
    report = bt.report()
    assert report.to_json() == whole.to_json()
    assert report.node("gpu-7").telemetry
    assert whole.summary.incidents == 5
    with pytest.raises(ValueError, match="time order"):
        bt.feed(sigs[:1])


def test_a_bad_kubeconfig_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("healer.obs.logging.setup", lambda *a, **k: None)
    args = _args("--prometheus", "http://127.0.0.1:9", "--policies",
                 str(ROOT / "policies" / "default.yaml"), "--from", "now-1h",
                 "--kubeconfig", str(tmp_path / "missing.yaml"))
    assert cmd_backtest(args) == 2
    assert "cannot use kubeconfig" in capsys.readouterr().err


def test_an_unreachable_prometheus_exits_2(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from healer_dev.devstack.prometheus import free_port

    monkeypatch.setattr("healer.obs.logging.setup", lambda *a, **k: None)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    args = _args("--prometheus", url, "--policies", str(ROOT / "policies" / "default.yaml"),
                 "--from", "now-1h")
    assert cmd_backtest(args) == 2
    assert f"cannot connect to {url}" in capsys.readouterr().err
