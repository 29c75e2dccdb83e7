"""A fault storm on the real stack, with Slurm capacity already gone (issue 12, Deliver 7):
``maxUnavailable: 2`` holds at every sample, counting what Slurm counts.

SchedMD's real slurm-operator (a NodeSet of 4 slurmd pods on 4 GPU Nodes), a real Slurm 26.05
and the real daemon: StatefulSet mode with the Slinky driver (Slurm names are the pods', mapped
to Nodes through them), and DaemonSet mode with the scontrol driver (Slurm names are the
Nodes'; a replacement is a new Slurm node on the spare). Before healer starts, an admin drains
one Slurm node (their own reason) and sets another DOWN: Kubernetes shows nothing (no cordon,
every Node Ready), so a guardrail that counted only Kubernetes would see 0 of 4 unavailable.
Then a fatal XID hits every GPU Node at once.

The DOWN node's slurmd hangs first (SIGSTOP: it answers nothing; Kubernetes shows nothing of
it). It has to: this Slurm runs ``ReturnToService=2``, under which slurmctld returns a DOWN node
to service (reason cleared) at the next answer of its slurmd, a ping within a few seconds,
whoever set it DOWN. An admin's ``state=down`` on a node whose slurmd answers lasted only until
then, so healer (rightly) counted it only when it happened to read Slurm first. With its slurmd
hung the node stays DOWN (and NOT_RESPONDING) while healer counts it and holds the healthy
nodes. Once the storm has hit it too, its slurmd answers again (SIGCONT): Slurm returns it to
service, the operator drains it on healer's cordon (the DOWN, with an admin's reason, is not
the operator's to drain) and it is replaced.

Sampled continuously (about every 0.3 s) while the storm runs, and asserted over all samples:

* Slurm's own count, independent of healer: at least 4 - 2 of the NodeSet's Slurm nodes can
  take jobs (no DOWN, NOT_RESPONDING, DRAIN... : :func:`healer.core.unavailability.slurm_cause` is
  ""), wherever their pod runs;
* healer's count: ``sum(healer_unavailable_nodes{scope="fleet"})`` never above 2, and it
  names the admin's drain and the DOWN node by cause before the storm.

And it is not vacuous: the first admissions of the healthy nodes are held by
``max-unavailable`` naming ``slurm-drain`` and ``slurm-down``; the DOWN node is replaced (its
Slurm name serves again, on a spare), and only then is one healthy node taken out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from healer.adapters.slurm.parse import parse_nodes
from healer.core.unavailability import slurm_cause
from tests.builders import policy_steps, policy_yaml
from tests.integration.daemon_process import Daemon
from tests.integration.flows.conftest import TEST_LABEL, Flow, FlowFactory
from tests.integration.waiting import wait_for

LIMIT = 2
FLEET = re.compile(r'^healer_unavailable_nodes\{cause="([^"]+)",scope="fleet"\} (\S+)$', re.M)


@dataclass
class Samples:
    serving: list[tuple[float, int, dict[str, str]]] = field(default_factory=list)
    counted: list[tuple[float, int, dict[str, float]]] = field(default_factory=list)
    blocks: dict[str, set[str]] = field(default_factory=dict)  # node -> block messages seen
    errors: list[str] = field(default_factory=list)


async def sample(f: Flow, d: Daemon, out: Samples, stop: asyncio.Event) -> None:
    names = set(f.slurm_names)
    while not stop.is_set():
        t = time.time()
        r = await asyncio.to_thread(f.slurm.run, ["scontrol", "show", "node", "-o"], check=False)
        if r.returncode == 0:
            states = {s.name: s for s in parse_nodes(r.stdout) if s.name in names}
            why = {n: slurm_cause(s.base, s.flags) or "serving" for n, s in states.items()}
            out.serving.append((t, sum(1 for w in why.values() if w == "serving"), why))
        else:
            out.errors.append(r.stderr[-200:])
        status, text = await d.get("/metrics")
        if status == 200:
            causes = {c: float(v) for c, v in FLEET.findall(text)}
            out.counted.append((t, round(sum(causes.values())), causes))
        with contextlib.suppress(Exception):
            for node in f.lay.gpus:
                for item in await f.remediations(node):
                    b = (item.get("status") or {}).get("blocked")
                    if b:
                        out.blocks.setdefault(node, set()).add(
                            f"{b['guardrail']}: {b['message']}")
        await asyncio.sleep(0.3)


def slurmd_pid(f: Flow, name: str) -> int:
    """The pid of the slurmd that the pod runtime runs for Slurm node ``name``."""
    conf = str(f.slurm.conf)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv[0].endswith("/slurmd") and conf in argv and "-Z" in argv and "-N" in argv \
                and argv[argv.index("-N") + 1:argv.index("-N") + 2] == [name]:
            return int(entry.name)
    raise AssertionError(f"no slurmd runs for Slurm node {name}")


@pytest.mark.timeout(780)
@pytest.mark.parametrize(("mode", "driver"), [
    pytest.param("StatefulSet", "slinky", id="StatefulSet-slinky"),
    pytest.param("DaemonSet", "scontrol", id="DaemonSet-scontrol"),
])
async def test_max_unavailable_holds_at_every_sample_counting_slurm(
        flows: FlowFactory, mode: str, driver: str) -> None:
    f = await flows(mode, driver)
    (f.policies / "policy.yaml").write_text(policy_yaml(
        f.tid, name=f"storm-{f.tid}", label=TEST_LABEL,
        fleet={"guardrails": {"maxUnavailable": LIMIT}},
        steps=policy_steps(swap=True, repair_hook="none")))
    gpus = f.lay.gpus
    sn = {g: await f.slurm_name_on(g) for g in gpus}
    drained, down = gpus[0], gpus[3]
    admin = "admin: bad DIMM, ticket 42"
    await asyncio.to_thread(f.slurm.run, ["scontrol", "update", f"nodename={sn[drained]}",
                                          "state=drain", f"reason={admin}"])
    # the DOWN node's slurmd hangs (ReturnToService=2 would return the node to service at its
    # next answer, see the module docstring), then the admin sets it DOWN
    hung = slurmd_pid(f, sn[down])
    os.kill(hung, signal.SIGSTOP)
    await asyncio.to_thread(f.slurm.run, ["scontrol", "update", f"nodename={sn[down]}",
                                          "state=down", "reason=admin: PSU fault"])
    # Slurm itself knows nothing answers there: DOWN stays DOWN (no slurmd to return it)
    await f.wait_slurm(sn[down], lambda s: s.down and "NOT_RESPONDING" in s.flags,
                       within=60, what="DOWN and not responding")
    st = await f.slurm_state(sn[drained])
    assert st is not None
    assert st.drain, st
    assert st.reason == admin, st
    for node in gpus:  # Kubernetes shows nothing of it
        n = await f.core.read_node(node)
        assert not n.spec.unschedulable

    d = f.start_daemon("--slurm-state-interval", "1")
    await f.ready(d)

    async def seen() -> bool:
        _, text = await d.get("/metrics")
        causes = {c: float(v) for c, v in FLEET.findall(text)}
        return causes.get("slurm-drain") == 1 and causes.get("slurm-down") == 1

    try:
        await wait_for(seen, timeout=120, description="healer counts the admin's drain and the "
                       "DOWN node")
    except TimeoutError as e:
        _, text = await d.get("/metrics")
        raise AssertionError(f"{e}\nfleet causes: {FLEET.findall(text)}\n"
                             f"daemon log:\n{d.tail(30)}") from None
    samples = Samples()
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample(f, d, samples, stop))
    t0 = time.time()
    healthy = [gpus[1], gpus[2]]
    try:
        # the storm, healthy nodes first: both are held, by what Slurm shows
        for node in healthy:
            f.xid(node)

        async def held_by_slurm() -> bool:
            for node in healthy:
                rec = await f.remediations(node)
                b = (rec[-1].get("status") or {}).get("blocked") if rec else None
                if not b or b["guardrail"] != "max-unavailable" or not (
                        "slurm-drain" in b["message"] and "slurm-down" in b["message"]):
                    return False
            return True

        await wait_for(held_by_slurm, timeout=60, description="healthy nodes held by Slurm's "
                       "causes")
        for node in (drained, down):  # then the nodes Slurm already lost
            f.xid(node)
        # the hung slurmd answers again: Slurm returns the node to service, clearing the
        # admin's DOWN, so the operator can drain it on healer's cordon
        os.kill(hung, signal.SIGCONT)
        # the DOWN node is replaced: its Slurm name serves again, on a spare
        # up to 5 min more: the operator creates no pod while an expectation of its own (a
        # pod creation or deletion it asked for) is unobserved, and such an expectation
        # expires only after 5 minutes (controller expectations' TTL); in DaemonSet mode the
        # replacement is such a pod creation on the opened spare
        await f.wait_phase(down, "Repair", within=420)
        # then (one unit back) exactly one healthy node may go

        async def one_taken() -> str | None:
            for node in healthy:
                if await f.phase(node) not in ("Failed", "Healthy", "Suspect"):
                    return node
            return None

        taken = await wait_for(one_taken, timeout=120, description="a healthy node admitted")
        assert taken is not None
        await f.wait_phase(taken, "Repair", "HeldForCapacity", within=240)

        async def quiet() -> bool:  # sample a while longer: nothing else may be taken
            return time.time() - t0 > 5 and len(samples.serving) > 20

        await wait_for(quiet, timeout=60, description="enough samples")
    finally:
        stop.set()
        await asyncio.gather(sampler, return_exceptions=True)

    print(f"\n{len(samples.serving)} Slurm samples, {len(samples.counted)} metric samples over "
          f"{time.time() - t0:.0f}s; phases: "
          f"{ {n: await f.phase(n) for n in gpus} }")
    assert samples.serving, samples.errors[-3:]
    assert samples.counted
    worst = min(samples.serving, key=lambda s: s[1])
    top = max(samples.counted, key=lambda s: s[1])
    print(f"fewest Slurm nodes able to take jobs: {worst[1]} of {len(gpus)} ({worst[2]}); "
          f"most healer counted unavailable: {top[1]} ({top[2]})")
    # Slurm's own count: never fewer than 4 - LIMIT Slurm nodes able to take jobs
    assert worst[1] >= len(gpus) - LIMIT, f"at {worst[0] - t0:.1f}s only {worst[1]}: {worst[2]}"
    # healer's count: never above the limit
    assert top[1] <= LIMIT, f"at {top[0] - t0:.1f}s healer counted {top[1]}: {top[2]}"
    # not vacuous: the healthy nodes were held, by Slurm's causes, before the swap freed one
    held = set().union(*(samples.blocks.get(n, set()) for n in healthy))
    assert any("max-unavailable" in b and "slurm-drain" in b and "slurm-down" in b
               for b in held), held
    # the admin's drain is theirs: kept, reason and all, on the node that was never taken
    st = await f.slurm_state(sn[drained])
    assert st is not None
    assert st.drain
    assert st.reason == admin
