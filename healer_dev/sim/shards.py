"""Sharding by simulation: one leader for the whole fleet against ``N`` shards of it.

``docs/scaling.md`` proposes sharding a fleet past one leader by failure domain, one Lease per
shard, with every fleet-wide count limit split between shards in proportion to their nodes
(percentages apply to each shard's own population as they are). This module checks that
plan on the real engine: the same fault trace (background failures spread over a day plus a
storm confined to a few minutes) runs through one :class:`~healer.sim.engine.Replay` over the
whole fleet and through ``N`` independent replays, one per shard, each with its share of the
limits. It reports what an operator cares about: the peak number of nodes taken out at once
fleet-wide (the split limits must keep the fleet within the fleet limit), how many faults
were remediated and how fast, and when the storm tripped a breaker.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, replace

from healer.core.machine import Decision, Trigger, counts_as_active, record_out_of_service
from healer.core.model import GpuRef, Guardrail, Signal, SignalKind, Taint
from healer.core.phases import Phase
from healer.core.rules import Breaker, Guardrails, PolicySet, Quantity
from healer.core.topology import DOMAIN_LABEL
from healer.core.vocabulary import ROLE_LABEL, SPARE_ROLE, SPARE_TAINT, TAINT_EFFECT, TAINT_VALUE
from healer.sim.engine import Replay
from healer.sim.world import Latencies, SimNode, SimWorld

START = 1_767_600_000.0
DOMAIN_SIZE = 8
GPU_LABELS = {"nvidia.com/gpu.present": "true"}


@dataclass(frozen=True, slots=True)
class Fault:
    node: str
    at: float
    gpu: int


@dataclass(frozen=True, slots=True)
class ShardingFigures:
    shards: int
    faults: int
    replaced: int  # faults whose node a spare replaced
    peak_out: int  # most nodes healer held out of service at once, fleet-wide
    limit: int  # the fleet's maxUnavailable, in nodes
    peak_active: int  # most remediations in flight at once, fleet-wide
    max_concurrent: int  # the limit on that: the fleet's, or the incidents' policy's if lower
    replace_p50: float  # seconds from the fault to the spare serving
    replace_p99: float
    breaker_first_block: float | None  # seconds after the storm began
    held_by_breaker: int  # storm faults held back by a breaker


def shard_of(domain: str, shards: int) -> int:
    """The shard of a failure domain: a stable hash of its name."""
    return zlib.crc32(domain.encode()) % shards


def split(policies: PolicySet, share: float) -> PolicySet:
    """``policies`` with every fleet-wide count limit scaled to a shard holding ``share`` of
    the fleet (never below 1); percentages stay (they apply to the shard's population)."""

    def scaled(g: Guardrails) -> Guardrails:
        mc = g.max_concurrent
        if mc is not None:
            mc = max(1, math.floor(mc * share))
        mu = g.max_unavailable
        if mu is not None and not mu.percent:
            mu = Quantity(max(1, math.floor(mu.value * share)))
        br = g.breaker
        if br is not None and not br.threshold.percent:
            br = replace(br, threshold=Quantity(max(2, math.floor(br.threshold.value * share))))
        return replace(g, max_concurrent=mc, max_unavailable=mu, breaker=br)

    fleet = replace(policies.fleet, guardrails=scaled(policies.fleet.guardrails))
    return replace(policies, fleet=fleet,
                   policies=tuple(replace(p, guardrails=scaled(p.guardrails))
                                  for p in policies.policies))


def fleet(nodes: int) -> list[SimNode]:
    """``nodes`` GPU nodes in NVLink domains of 8, two warm spares per domain."""
    out: list[SimNode] = []
    for i in range(nodes):
        out.append(SimNode(f"node-{i:06d}", GPU_LABELS | {DOMAIN_LABEL: _domain(i)}))
    for d in range(math.ceil(nodes / DOMAIN_SIZE)):
        for k in range(2):
            out.append(SimNode(f"spare-{d:05d}-{k}", GPU_LABELS | {
                DOMAIN_LABEL: f"nvl-{d:05d}", ROLE_LABEL: SPARE_ROLE}, spare=True,
                taints=[Taint(SPARE_TAINT, TAINT_VALUE, TAINT_EFFECT)]))
    return out


def _domain(i: int) -> str:
    return f"nvl-{i // DOMAIN_SIZE:05d}"


def trace(nodes: int, seed: int, *, background: float = 0.01, storm: float = 0.03,
          storm_at: float = 12 * 3600.0, storm_for: float = 300.0) -> list[Fault]:
    """``background`` of the nodes fail at random over 24 h; ``storm`` of them within
    ``storm_for`` seconds from ``storm_at`` (a bad driver push: the breaker's case)."""
    rng = random.Random(seed)
    names = [f"node-{i:06d}" for i in range(nodes)]
    bad = rng.sample(names, int(nodes * (background + storm)))
    n_bg = int(nodes * background)
    out = [Fault(n, START + rng.uniform(0, 86400.0), rng.randrange(8)) for n in bad[:n_bg]]
    out += [Fault(n, START + storm_at + rng.uniform(0, storm_for), rng.randrange(8))
            for n in bad[n_bg:]]
    return sorted(out, key=lambda f: f.at)


def _run(policies: PolicySet, nodes: list[SimNode], faults: list[Fault],
         until: float) -> tuple[Replay, list[tuple[float, int, int]], dict[str, float],
                                dict[str, float], list[float], set[str]]:
    world = SimWorld(nodes, latencies=Latencies(api=1.0, pod_start=45.0, validation=120.0))
    out_changes: list[tuple[float, int, int]] = []  # (time, ±1 out of service, ±1 active)
    out_now: set[str] = set()
    active_now: set[str] = set()
    opened: dict[str, float] = {}
    replaced: dict[str, float] = {}
    breaker_blocks: list[float] = []
    policies_seen: set[str] = set()

    def on_step(now: float, _view: object, _before: object, trig: Trigger,
                d: Decision) -> None:
        rec = d.record
        if rec is None:
            return
        opened.setdefault(rec.node, rec.incident.opened_at)
        policies_seen.add(rec.policy)
        if rec.spare and rec.phase is Phase.REPAIR:
            replaced.setdefault(rec.node, now)
        if rec.blocked is not None and rec.blocked.guardrail is Guardrail.BREAKER:
            breaker_blocks.append(now)
        for now_set, held, slot in ((out_now, record_out_of_service(rec), 1),
                                    (active_now, counts_as_active(rec), 2)):
            if held != (rec.node in now_set):
                (now_set.add if held else now_set.discard)(rec.node)
                delta = 1 if held else -1
                out_changes.append((now, delta if slot == 1 else 0, delta if slot == 2 else 0))

    replay = Replay(policies, world, START, on_step=on_step, keep_timeline=False)
    for f in faults:
        replay.add_signal(Signal(f.node, "dcgm", SignalKind.XID, "DCGM_FI_DEV_XID_ERRORS", 79.0,
                                 f.at, GpuRef(f.gpu, f"GPU-{f.node}-{f.gpu}",
                                              f"SN-{f.node}-{f.gpu}")))
    faulty = sorted({f.node for f in faults})

    def beat(now: float) -> None:  # the faulty nodes' telemetry (the others never change)
        replay.ingest(Signal(n, "dcgm", SignalKind.FRESH, "dcgm", 1.0, now) for n in faulty)
        if now + 60.0 <= until:
            replay.add_callback(now + 60.0, beat)

    replay.add_callback(START, beat)
    replay.run(until)
    return replay, out_changes, opened, replaced, breaker_blocks, policies_seen


def simulate(policies: PolicySet, nodes: int, shards: int, faults: list[Fault], *,
             storm_at: float = 12 * 3600.0) -> ShardingFigures:
    """Run ``faults`` on a fleet of ``nodes`` split into ``shards`` (1: one leader)."""
    fleet_nodes = fleet(nodes)
    groups: dict[int, list[SimNode]] = {}
    for n in fleet_nodes:
        groups.setdefault(shard_of(n.labels[DOMAIN_LABEL], shards), []).append(n)
    until = START + 30 * 3600.0
    changes: list[tuple[float, int, int]] = []
    opened: dict[str, float] = {}
    replaced: dict[str, float] = {}
    blocks: list[float] = []
    seen: set[str] = set()
    governed = sum(1 for n in fleet_nodes if not n.spare)
    for members in groups.values():
        share = sum(1 for n in members if not n.spare) / governed
        names = {n.name for n in members}
        mine = [f for f in faults if f.node in names]
        _, ch, op, rep, bl, pols = _run(split(policies, share) if shards > 1 else policies,
                                        members, mine, until)
        seen |= pols
        changes += ch
        opened |= op
        replaced |= rep
        blocks += bl
    peak = cur = peak_active = active = 0
    for _, d_out, d_active in sorted(changes):
        cur += d_out
        active += d_active
        peak = max(peak, cur)
        peak_active = max(peak_active, active)
    waits = sorted(replaced[n] - opened[n] for n in replaced if n in opened)
    storm = START + storm_at
    storm_faults = {f.node for f in faults if f.at >= storm}
    held = sum(1 for n in storm_faults if n not in replaced)
    limit_q = policies.fleet.guardrails.max_unavailable
    concurrent = [g.max_concurrent for g in (policies.fleet.guardrails,
                                             *(p.guardrails for p in policies.policies
                                               if p.name in seen))
                  if g.max_concurrent is not None]
    first = min((b for b in blocks if b >= storm), default=None)
    return ShardingFigures(
        shards, len(faults), len(replaced), peak,
        limit_q.of(governed) if limit_q is not None else governed, peak_active,
        min(concurrent, default=governed), _pct(waits, 0.5), _pct(waits, 0.99),
        None if first is None else first - storm, held)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    return values[min(len(values) - 1, int(q * len(values)))]


def default_guardrails(policies: PolicySet) -> PolicySet:
    """The fleet guardrails the sharding figures use: 2 % unavailable, 20 concurrent, a
    breaker at 1 % of the nodes in 10 minutes (the shipped defaults, scaled to a big fleet)."""
    g = Guardrails(max_concurrent=20, max_unavailable=Quantity(2, percent=True),
                   breaker=Breaker(600.0, Quantity(1, percent=True), 1800.0))
    return replace(policies, fleet=replace(policies.fleet, guardrails=g))
