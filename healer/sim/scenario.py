"""Scripted fault traces (``scenarios/*.yaml``) and ``healer simulate``.

A scenario names the policies to run, a fleet (GPU nodes in NVLink domains, warm spares), the
Slurm jobs running on it, faults over time, repair results, and what it expects at the end. It
is replayed deterministically through the real engine against :class:`SimWorld`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field

from healer.core.machine import Trigger, TriggerKind
from healer.core.model import GpuRef, Signal, SignalKind, Taint
from healer.core.parts import PartRef
from healer.core.phases import Phase
from healer.core.rules import MetricRule, Mode, PolicySet
from healer.core.slurm_signals import finding_signal, next_finding
from healer.core.timefmt import format_duration
from healer.core.topology import DOMAIN_LABEL
from healer.core.vocabulary import (
    CORDONED_BY,
    ROLE_LABEL,
    SPARE_ROLE,
    SPARE_TAINT,
    TAINT_EFFECT,
    TAINT_VALUE,
)
from healer.errors import ConfigError
from healer.policy.load import load_policy_set
from healer.policy.schema import Duration
from healer.policy.yamlsrc import SourceError, load_documents, read_source
from healer.sim.engine import Replay, TimelineEntry
from healer.sim.world import Latencies, SimJob, SimNode, SimWorld


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True,
                              alias_generator=pydantic.alias_generators.to_camel)


class NodeSpec(_M):
    name: str
    domain: str = ""
    tiers: list[str] = Field(default_factory=list)  # fabric tier-0, tier-1, ... switch names
    gpus: int = Field(default=8, ge=1, le=16)
    labels: dict[str, str] = Field(default_factory=dict)


class SimFleetSpec(_M):
    node_labels: dict[str, str] = Field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    nodes: list[NodeSpec] = Field(min_length=1)
    spares: list[NodeSpec] = Field(default_factory=list)


class JobSpec(_M):
    id: int
    node: str
    start: Duration = 0.0
    duration: Duration
    checkpointable: bool = True
    checkpoint_time: Duration = 60.0


class ConditionSpec(_M):
    type: str
    status: Literal["True", "False", "Unknown"] = "False"
    reason: str = ""
    message: str = ""


SlurmState = Literal["DOWN", "NOT_RESPONDING", "FAIL", "DRAIN"]


def _drain() -> list[SlurmState]:
    return ["DRAIN"]


class SlurmFaultSpec(_M):
    """Slurm takes the node out (or, ``clear``, gives it back): DRAIN sets the world's Slurm
    drain with ``reason`` (someone else's: healer never owns it), the other states are only
    what Slurm reports."""

    states: list[SlurmState] = Field(default_factory=_drain)
    reason: str = ""
    user: str = ""
    clear: bool = False


class FaultSpec(_M):
    at: Duration
    node: str
    gpu: int | None = None
    xid: int | None = None
    repeat: int = Field(default=1, ge=1)
    every: Duration = 60.0
    metric: str | None = None
    value: float | None = None
    until: Duration | None = None
    #: the labels of the part a metric fault is on (an HCA port: {device: mlx5_1, port: "1"})
    part: dict[str, str] | None = None
    condition: ConditionSpec | None = None
    telemetry: Literal["stop", "start"] | None = None
    uncordon: bool = False  # an admin uncordons the node
    slurm: SlurmFaultSpec | None = None  # Slurm takes the node out (the Slurm feed's finding)


class SimRepairSpec(_M):
    node: str
    after: Duration
    passed: bool = True


class ExpectSpec(_M):
    node: str
    phase: str
    outcome: str | None = None
    spare_domain: str | None = None


class LatencySpec(_M):
    api: Duration = 1.0
    pod_start: Duration = 45.0
    validation: Duration = 120.0


class Scenario(_M):
    name: str
    description: str = ""
    start: datetime = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    until: Duration = 3 * 3600.0
    policies: list[str] = Field(min_length=1)
    mode: Literal["observe", "dryRun", "act"] | None = None
    scrape_interval: Duration = 15.0
    fleet: SimFleetSpec
    jobs: list[JobSpec] = Field(default_factory=list)
    faults: list[FaultSpec] = Field(default_factory=list)
    repairs: list[SimRepairSpec] = Field(default_factory=list)
    failing_validation: list[str] = Field(default_factory=list)
    latencies: LatencySpec = Field(default_factory=LatencySpec)
    expect: list[ExpectSpec] = Field(default_factory=list)


def _scenario_data(p: Path) -> Any:
    """The scenario file's one YAML document, read as hostile as a policy file (regular file,
    size and alias limits, UTF-8: a binary file is named with its first bad line)."""
    try:
        docs = list(load_documents(read_source(p), str(p)))
    except SourceError as e:
        where = f"{p}:{e.line}" if e.line else str(p)
        raise ConfigError(f"{where}: cannot read scenario: {e.message}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: cannot read scenario: invalid YAML: {problem}") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{p}: cannot read scenario: "
                          f"{getattr(e, 'strerror', '') or e}") from None
    if len(docs) != 1:
        raise ConfigError(f"{p}: expected one YAML document (a scenario), got {len(docs)}")
    return docs[0].data


def load_scenario(path: str | Path) -> tuple[Scenario, PolicySet]:
    p = Path(path)
    data = _scenario_data(p)
    try:
        sc = Scenario.model_validate(data)
    except pydantic.ValidationError as e:
        lines = [f"{p}: {'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        raise ConfigError("\n".join(lines)) from None
    base = p.parent
    paths = [str((base / x).resolve()) if not Path(x).is_absolute() else x for x in sc.policies]
    ps = load_policy_set(paths)
    if sc.mode is not None:
        mode = Mode(sc.mode)
        ps = replace(ps, policies=tuple(replace(pol, mode=mode) for pol in ps.policies))
    return sc, ps


def _uuid(node: str, gpu: int) -> str:
    n = sum(ord(c) * (i + 1) for i, c in enumerate(node)) % 0xFFFF
    return f"GPU-{n:04x}{gpu:04x}-0000-4000-8000-{n:06x}{gpu:06x}"


def gpu_ref(node: str, gpu: int) -> GpuRef:
    digits = re.sub(r"\D", "", node) or "0"
    return GpuRef(index=gpu, uuid=_uuid(node, gpu), serial=f"1650{int(digits):04d}{gpu:02d}")


def build(sc: Scenario, policies: PolicySet) -> tuple[Replay, SimWorld]:
    start = sc.start.timestamp()
    nodes: list[SimNode] = []
    for spec, spare in [(n, False) for n in sc.fleet.nodes] + [(n, True) for n in sc.fleet.spares]:
        labels = dict(sc.fleet.node_labels) | dict(spec.labels)
        if spec.domain:
            labels[DOMAIN_LABEL] = spec.domain
        for i, sw in enumerate(spec.tiers):
            labels[f"fabric.topograph.run/tier-{i}"] = sw
        taints = []
        if spare:
            labels[ROLE_LABEL] = SPARE_ROLE
            taints.append(Taint(SPARE_TAINT, TAINT_VALUE, TAINT_EFFECT))
        nodes.append(SimNode(spec.name, labels, spare=spare, taints=taints))
    jobs = [SimJob(j.id, j.node, start + j.start + j.duration, j.checkpointable,
                   j.checkpoint_time) for j in sc.jobs]
    lat = Latencies(sc.latencies.api, sc.latencies.pod_start, sc.latencies.validation)
    world = SimWorld(nodes, jobs, lat, {r.node: (r.after, r.passed) for r in sc.repairs},
                     set(sc.failing_validation))
    known = {n.name for n in nodes}
    for f in sc.faults:
        if f.node not in known:
            raise ConfigError(f"scenario {sc.name}: fault on unknown node {f.node!r}")
    replay = Replay(policies, world, start)
    _schedule_telemetry(replay, sc, world, start)
    _schedule_faults(replay, sc, world, start)
    return replay, world


def _schedule_telemetry(replay: Replay, sc: Scenario, world: SimWorld, start: float) -> None:
    """Heartbeats every scrape interval for every node whose telemetry is not stopped."""
    stopped: dict[str, list[tuple[float, float]]] = {}
    for f in sc.faults:
        if f.telemetry == "stop":
            stopped.setdefault(f.node, []).append((start + f.at, float("inf")))
        elif f.telemetry == "start" and stopped.get(f.node):
            a, _ = stopped[f.node][-1]
            stopped[f.node][-1] = (a, start + f.at)
    names = sorted(world.nodes)

    def beat(now: float) -> None:
        for n in names:
            if not any(a <= now < b for a, b in stopped.get(n, [])):
                replay.add_signal(Signal(n, "dcgm", SignalKind.FRESH, "dcgm", 1.0, now))
        if now + sc.scrape_interval <= start + sc.until:
            replay.add_callback(now + sc.scrape_interval, beat)

    replay.add_callback(start, beat)


def _schedule_faults(replay: Replay, sc: Scenario, world: SimWorld, start: float) -> None:
    for f in sc.faults:
        t0 = start + f.at
        gpu = gpu_ref(f.node, f.gpu) if f.gpu is not None else None
        if f.xid is not None:
            for k in range(f.repeat):
                replay.add_signal(Signal(f.node, "dcgm", SignalKind.XID, "DCGM_FI_DEV_XID_ERRORS",
                                         float(f.xid), t0 + k * f.every, gpu))
        if f.metric is not None and f.value is not None:
            end = start + (f.until if f.until is not None else sc.until)
            keys = _metric_keys(replay.policies, f.metric)
            part = PartRef.of(f.part) if f.part else None
            t = t0
            while t <= end:
                for key in keys:
                    replay.add_signal(Signal(f.node, "dcgm", SignalKind.METRIC, key, f.value, t,
                                             gpu, part=part))
                t += sc.scrape_interval
        if f.condition is not None:
            c = f.condition
            replay.add_signal(Signal(f.node, "k8s", SignalKind.CONDITION, c.type, t0, t0, None,
                                     Signal.details(status=c.status, reason=c.reason,
                                                    message=c.message)))
            _repeat_condition(replay, f, t0, start + sc.until, sc.scrape_interval)
        if f.slurm is not None:
            replay.add_callback(t0, _slurm_fault(replay, world, f.node, f.slurm))
        if f.uncordon:
            def admin_uncordon(now: float, node: str = f.node) -> None:
                world.nodes[node].unschedulable = False
                world.nodes[node].annotations.pop(CORDONED_BY, None)
                world.touch(node)
                replay.process(Trigger(TriggerKind.ADMIN_UNCORDON, node, now))
            replay.add_callback(t0, admin_uncordon)
    _schedule_repairs(replay, world)  # repair results come from the world once a node is marked


def _slurm_fault(replay: Replay, world: SimWorld, node: str,
                 spec: SlurmFaultSpec) -> Callable[[float], None]:
    """What the Slurm feed would send when Slurm takes ``node`` out as ``spec`` says."""
    def apply(now: float) -> None:
        sn = world.slurm_name(node)
        s = world.slurm.get(sn)
        if s is not None and "DRAIN" in spec.states:
            s.drain, s.reason = not spec.clear, "" if spec.clear else spec.reason
        found = None if spec.clear else next_finding(
            None, base="DOWN" if "DOWN" in spec.states else "IDLE",
            flags={x for x in spec.states if x != "DOWN"}, reason=spec.reason, user=spec.user,
            now=now)
        replay.add_signal(finding_signal(node, found, now))
    return apply


def _metric_keys(policies: PolicySet, field: str) -> list[str]:
    """The signal keys the rules on ``field`` read (a scripted value stands for the rule's
    aggregation, as PromQL would return it)."""
    keys = {r.key for p in policies.policies for r in p.rules
            if isinstance(r, MetricRule) and r.field == field and not r.promql}
    return sorted(keys) or [field]


def _repeat_condition(replay: Replay, f: FaultSpec, t0: float, end: float, every: float) -> None:
    assert f.condition is not None
    c = f.condition
    t = t0 + every
    while t <= end:
        replay.add_signal(Signal(f.node, "k8s", SignalKind.CONDITION, c.type, t0, t, None,
                                 Signal.details(status=c.status, reason=c.reason,
                                                message=c.message)))
        t += every


def _schedule_repairs(replay: Replay, world: SimWorld) -> None:
    """Poll the world for repair results it produced and deliver them as REPAIR triggers."""

    def deliver(now: float) -> None:
        for trigger in world.due_repairs(now):
            replay.process(trigger)
        if world.capacity_changed_at:
            world.capacity_changed_at.clear()
            for rec in list(replay.records.values()):
                if rec.phase is Phase.HELD_FOR_CAPACITY:
                    replay.process(Trigger(TriggerKind.CAPACITY, rec.node, now))
        replay.add_callback(now + 30.0, deliver)

    replay.add_callback(replay.start, deliver)


# -- output ---------------------------------------------------------------------------------


def _clock(t: float, start: float) -> str:
    s = round(t - start)
    return f"+{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def render_timeline(entries: list[TimelineEntry], start: float, *,
                    verbose: bool = False) -> list[str]:
    by_node: dict[str, list[TimelineEntry]] = {}
    for e in entries:
        by_node.setdefault(e.node, []).append(e)
    lines: list[str] = []
    for node in sorted(by_node):
        evs = by_node[node]
        if not any(e.kind == "transition" for e in evs) and not verbose:
            continue
        lines.append(f"── {node}")
        last_t: float | None = None
        for e in evs:
            if e.kind == "action" and not verbose:
                continue
            dur = ""
            if e.kind == "transition":
                if last_t is not None:
                    dur = f" (after {format_duration(e.at - last_t, units=2)})"
                last_t = e.at
            marker = {"transition": "▶", "verdict": "·", "event": "✎", "action": "→"}[e.kind]
            lines.append(f"   {_clock(e.at, start)}  {marker} {e.text}{dur}")
    return lines


def check_expectations(sc: Scenario, replay: Replay, world: SimWorld) -> list[str]:
    failures: list[str] = []
    for ex in sc.expect:
        phase = replay.final_phase(ex.node)
        recs = [r for r in replay.all_records() if r.node == ex.node]
        rec = recs[-1] if recs else None
        if phase != ex.phase:
            failures.append(f"{ex.node}: expected phase {ex.phase}, got {phase}")
        if ex.outcome is not None and (rec is None or rec.outcome_text != ex.outcome):
            failures.append(f"{ex.node}: expected outcome {ex.outcome!r}, got "
                            f"{rec.outcome_text if rec else None!r}")
        if ex.spare_domain is not None:
            spare = rec.spare if rec else ""
            dom = world.nodes[spare].labels.get(DOMAIN_LABEL, "") if spare else ""
            if dom != ex.spare_domain:
                failures.append(f"{ex.node}: expected a spare in domain {ex.spare_domain!r}, got "
                                f"{spare or 'none'} in {dom or 'no domain'!r}")
    for incident, n in world.effects.swaps.items():
        if n > 1:
            failures.append(f"incident {incident}: swapped {n} times")
    return failures


def simulate(path: str | Path, *, verbose: bool = False,
             out: Callable[[str], None] = print) -> int:
    sc, ps = load_scenario(path)
    replay, world = build(sc, ps)
    start = sc.start.timestamp()
    out(f"scenario {sc.name}: {sc.description}".rstrip(": "))
    out(f"policies: {', '.join(p.name + ' (' + p.mode.value + ')' for p in ps.policies)}; "
        f"fleet: {len(sc.fleet.nodes)} GPU nodes, {len(sc.fleet.spares)} warm spares; "
        f"replaying {format_duration(sc.until, units=2)} of simulated time")
    replay.run(start + sc.until)
    for line in render_timeline(replay.timeline, start, verbose=verbose):
        out(line)
    summary = world.summary()
    out(f"end state: spares free {summary['spares_free']}, cordoned {summary['cordoned'] or '-'}, "
        f"drained in Slurm {summary['drained'] or '-'}")
    failures = check_expectations(sc, replay, world)
    if world.effects.killed_busy:
        failures.append(f"busy slurmd pods deleted: {world.effects.killed_busy}")
    for f in failures:
        out(f"EXPECTATION FAILED: {f}")
    if sc.expect and not failures:
        out(f"all {len(sc.expect)} expectations met")
    return 1 if failures else 0

