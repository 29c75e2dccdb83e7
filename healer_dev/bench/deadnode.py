"""The ``deadnode`` group of ``make bench``: a node that dies outright, on the real stack.

The world of ``python -m healer_dev demo --scenario dead-node`` (SchedMD's slurm-operator,
Slurm 22.05 with SlurmdTimeout 10 s, kube-controller-manager's node grace 10 s, the default
policy in act with deadAfter 5 s, the Slurm feed every 2 s): a GPU node loses its heartbeat
and its slurmd with the job on it; healer declares it dead, the bench fences it at once
(``healer.io/fenced``, as an admin would), and the clock stops when the same Slurm node serves
again, undrained, from the spare. Figures, the fencing provider's own time excluded:

* dead verdict → replacement serving (target ≤ 60 s);
* heartbeat lost → replacement serving (detection included: the grace, deadAfter, Slurm's
  timeout);
* heartbeat lost → dead verdict.

Each repeat is a fresh stack (about a minute to start) and one death of the same node, so
every run meets the shipped guardrails with nothing open: two deaths in one stack would
rightly trip the fleet breaker (2 nodes bad within 10 min) or the mass-death breaker (2 of
10 nodes NotReady within 5 min). Needs the machine's one slurm-operator stack (it waits for
the lock like any Slinky stack), so ``--smoke`` leaves it out; its test is
``tests/integration/flows/test_dead_node.py``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from healer_dev.demo_world import (
    DEAD_NODE_GRACE,
    DeadNodeRun,
    DemoStack,
    act_policies,
    dead_node,
    healer_ready,
)

from .report import Figure

#: the node that dies in every run (nvl-a: the spare-a domain)
NODE = "node-02"
#: the target of dead verdict → replacement serving (issue 20)
TARGET = 60.0


async def run_group(repeats: int, say: Callable[[str], None]) -> list[Figure]:
    dead = Figure("deadnode", "dead verdict -> replacement serving (fence excluded)", "s",
                  TARGET)
    beat = Figure("deadnode", "heartbeat lost -> replacement serving (fence excluded)", "s")
    detect = Figure("deadnode", "heartbeat lost -> dead verdict", "s")
    for _ in range(max(1, repeats)):
        t0 = time.monotonic()
        run = await _one_run(say)
        dead.add(run.dead_to_serving)
        beat.add(run.heartbeat_to_serving)
        detect.add(run.declared - run.killed)
        say(f"  {NODE}: heartbeat lost -> dead {run.declared - run.killed:.1f}s, dead -> "
            f"serving {run.dead_to_serving:.1f}s (fence {run.fence_wait:.1f}s excluded), "
            f"{time.monotonic() - t0:.0f}s with the stack")
    dead.note = beat.note = (f"SlurmdTimeout 10s, node grace {DEAD_NODE_GRACE:g}s, "
                             "deadAfter 5s, as in the demo; a fresh stack per run")
    return [dead, beat, detect]


async def _one_run(say: Callable[[str], None]) -> DeadNodeRun:
    workdir = Path(tempfile.mkdtemp(prefix="healer-bench-deadnode-"))
    stack = DemoStack(workdir, lambda line: say(f"  {line.strip()}"),
                      node_grace=DEAD_NODE_GRACE)
    try:
        await stack.start()
        stack.start_healer(act_policies(workdir / "policies", dead=True),
                           slurm_state_interval=2.0)
        await stack.wait(lambda: healer_ready(stack.port), 60, "healer /readyz")
        return await dead_node(stack, NODE)
    finally:
        await stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)
