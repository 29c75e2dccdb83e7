"""The ``engine`` group: decisions per second of the pure engine in simulated time.

A fleet of ``nodes`` GPU nodes in NVLink domains of 8, with one warm spare per faulty node in
the same domain; ``faults`` nodes report XID 79 at staggered times and each goes the whole flow
(drain → cordon → claim spare → move → annotate → undrain → repair → Done) through
:class:`healer.sim.engine.Replay` against a :class:`~healer.sim.world.SimWorld`, the shipped
default policies in act mode with permissive guardrails. Decisions are counted with Replay's
``on_decision``; the rate is decisions / CPU seconds of ``Replay.run``.

The engine learns only the node views an action touched (the world reports them). The CPU
the simulated world spends answering actions (claiming a spare ranks the pool) is measured
apart: the target figure is decisions per CPU second of the engine alone (Replay's
CPU minus the world's); the rate including the world is reported beside it.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from healer.core import actions as a
from healer.core.machine import Trigger
from healer.core.model import GpuRef, Signal, SignalKind, Taint
from healer.core.phases import Phase
from healer.core.topology import DOMAIN_LABEL
from healer.core.vocabulary import ROLE_LABEL, SPARE_ROLE, SPARE_TAINT, TAINT_EFFECT, TAINT_VALUE
from healer.errors import ConfigError
from healer.sim.engine import Replay
from healer.sim.world import Latencies, SimNode, SimWorld

from .policies import load_default
from .report import Figure

START = 1_767_600_000.0
DOMAIN_SIZE = 8


class CachedWorld(SimWorld):
    """SimWorld that measures the CPU seconds it spends executing actions (``cpu``): the
    simulator's cost, reported apart from the engine's."""

    def __init__(self, nodes: list[SimNode], **kw: object) -> None:
        super().__init__(nodes, **kw)  # type: ignore[arg-type]
        self.cpu = 0.0

    def execute(self, action: a.Action, now: float) -> list[tuple[float, Trigger]]:
        c0 = time.process_time()
        out = super().execute(action, now)
        self.cpu += time.process_time() - c0
        return out


@dataclass
class EngineResult:
    nodes: int
    faults: int
    decisions: int
    cpu_seconds: float  # Replay.run, the world included
    world_seconds: float  # of which the simulated world answering actions
    done: int

    @property
    def rate(self) -> float:
        """Decisions per CPU second of the engine alone."""
        cpu = self.cpu_seconds - self.world_seconds
        return self.decisions / cpu if cpu > 0 else 0.0

    @property
    def rate_with_world(self) -> float:
        return self.decisions / self.cpu_seconds if self.cpu_seconds > 0 else 0.0


def build_fleet(nodes: int, faults: int, rng: random.Random) -> tuple[list[SimNode], list[str]]:
    base = {"nvidia.com/gpu.present": "true"}
    fleet: list[SimNode] = []
    names = [f"node-{i:06d}" for i in range(nodes)]
    for i, n in enumerate(names):
        dom = f"nvl-{i // DOMAIN_SIZE:05d}"
        fleet.append(SimNode(n, base | {DOMAIN_LABEL: dom,
                                        "fabric.topograph.run/tier-0": f"leaf-{i // 64}"}))
    bad = rng.sample(names, faults)
    for j, n in enumerate(bad):
        i = int(n.split("-")[1])
        dom = f"nvl-{i // DOMAIN_SIZE:05d}"
        fleet.append(SimNode(f"spare-{j:05d}", base | {
            DOMAIN_LABEL: dom, ROLE_LABEL: SPARE_ROLE,
            "fabric.topograph.run/tier-0": f"leaf-{i // 64}"},
            spare=True, taints=[Taint(SPARE_TAINT, TAINT_VALUE, TAINT_EFFECT)]))
    return fleet, bad


def run_engine(nodes: int, faults: int, seed: int, *, spread: float = 3600.0) -> EngineResult:
    """One replay; returns its decision count and CPU time."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="healer-bench-") as tmp:
        policies = load_default(Path(tmp), permissive=True)
    fleet, bad = build_fleet(nodes, faults, rng)
    world = CachedWorld(fleet, latencies=Latencies(api=0.5, pod_start=30.0, validation=60.0),
                        repair_results=dict.fromkeys(bad, (600.0, True)))
    count = [0]

    def on_decision(now: float, trig: Trigger, dec: object) -> None:
        count[0] += 1

    replay = Replay(policies, world, START, on_decision=on_decision)
    for n in bad:
        t = START + rng.uniform(0.0, spread)
        g = rng.randrange(8)
        replay.add_signal(Signal(n, "dcgm", SignalKind.FRESH, "dcgm", 1.0, t - 15.0))
        replay.add_signal(Signal(n, "dcgm", SignalKind.XID, "DCGM_FI_DEV_XID_ERRORS", 79.0, t,
                                 GpuRef(g, f"GPU-{n}-{g}", f"SN-{n}-{g}")))

    def deliver(now: float) -> None:
        for trigger in world.due_repairs(now):
            replay.process(trigger)
        if replay.records or world.pending_repairs or now < START + spread:
            replay.add_callback(now + 30.0, deliver)

    replay.add_callback(START, deliver)
    until = START + spread + 6 * 3600.0
    c0 = time.process_time()
    replay.run(until)
    cpu = time.process_time() - c0
    done = sum(1 for r in replay.closed if r.phase is Phase.DONE)
    return EngineResult(nodes, faults, count[0], cpu, world.cpu, done)


def run_group(sizes: list[int], repeats: int, seed: int,
              say: Callable[[str], None]) -> list[Figure]:
    figs = []
    for i, nodes in enumerate(sizes):
        faults = max(10, min(1000, nodes // 10))
        fig = Figure("engine", f"decisions/s, {nodes:,} nodes, {faults:,} XID 79 -> Done",
                     "1/s", 10_000.0 if i == 0 else None, ">=")
        whole = Figure("engine", f"decisions/s with the simulated world, {nodes:,} nodes",
                       "1/s")
        for r in range(repeats):
            res = run_engine(nodes, faults, seed + r)
            if res.done != faults:
                raise ConfigError(f"engine bench: only {res.done} of {faults} remediations "
                                  f"reached Done at {nodes} nodes")
            fig.add(res.rate)
            whole.add(res.rate_with_world)
            say(f"  engine {nodes:,} nodes, repeat {r + 1}: {res.decisions:,} decisions in "
                f"{res.cpu_seconds:.2f}s CPU ({res.world_seconds:.2f}s of it the simulated "
                f"world), {res.done} Done")
        figs += [fig, whole]
    figs[0].note = ("Replay + SimWorld in simulated time, policies/default.yaml in act mode with "
                    "permissive guardrails, one warm spare per fault in its NVLink domain; "
                    "decisions counted by Replay.on_decision over the CPU time of Replay.run "
                    "minus the simulated world's (SimWorld answering actions)")
    return figs
