"""The node agent's footprint at its defaults, and its Event writes in an XID crash loop, on
the real kube-apiserver and pynvml's real ctypes path against the fake libnvidia-ml.

* At its defaults (10 s counters, 30 s heartbeat) the agent's resident memory stays within
  64 MiB and it spends at most 0.5 % of a core while idle (its own CPU time, over a window).
* 100 XIDs on one GPU (an application crash-looping) become one ``GPUXid`` Event whose
  ``series.count`` reaches 100 (events.k8s.io/v1, updated on a back-off), while the agent's
  ``healer_agent_gpu_xid_total`` counts all 100.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from tests.integration.agent.agent_harness import node_events, scenario
from tests.integration.agent.conftest import FakeNvml
from tests.integration.agent.test_agent_publish import (  # noqa: F401 (fixtures)
    Agents,
    agents,
    gpu_node,
    metric_lines,
    wait_agent,
    wait_condition,
)

EVENTS = "default"
#: item 5 of issue 23: the agent's budget on every GPU node
RSS_MIB_MAX = 64.0
IDLE_CPU_MAX = 0.005  # of one core
IDLE_WINDOW = 20.0


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_the_agent_at_its_defaults_is_lean(
        kube_api: client.ApiClient, fake_nvml: FakeNvml, agents: Agents,  # noqa: F811
        gpu_node: str) -> None:  # noqa: F811
    fake_nvml.write(scenario())
    agent = agents.start(gpu_node, interval=10.0, heartbeat=30.0)  # the agent's defaults
    await wait_condition(kube_api, gpu_node, agent, status="True", reason="Healthy")
    await agent.ready()
    pid = agent.proc.pid
    cpu0, t0 = _cpu_seconds(pid), time.monotonic()
    # the measurement window (not a wait for anything): counters read twice, a heartbeat
    await wait_agent(agent, lambda: time.monotonic() - t0 >= IDLE_WINDOW,
                     deadline=IDLE_WINDOW + 30, description="the idle window")
    cpu = (_cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
    rss = _rss_mib(pid)
    print(f"\nagent at its defaults: RSS {rss:.1f} MiB, idle CPU {100 * cpu:.2f} % of a core "
          f"over {IDLE_WINDOW:g}s")
    assert rss <= RSS_MIB_MAX, f"agent RSS {rss:.1f} MiB > {RSS_MIB_MAX} MiB"
    assert cpu <= IDLE_CPU_MAX, f"agent idle CPU {100 * cpu:.2f} % > {100 * IDLE_CPU_MAX} %"


async def test_an_xid_crash_loop_is_one_event_with_a_series(
        kube_api: client.ApiClient, fake_nvml: FakeNvml, agents: Agents,  # noqa: F811
        gpu_node: str) -> None:  # noqa: F811
    fake_nvml.write(scenario())
    agent = agents.start(gpu_node)
    await wait_condition(kube_api, gpu_node, agent, status="True", reason="Healthy")
    # an application crash-looping on GPU 0: 100 XID 43 (a trap; not a node fault)
    fake_nvml.write(scenario(events=[{"gpu": 0, "xid": 43}] * 100))

    async def counted() -> bool:
        lines = metric_lines(await agent.metrics(), "healer_agent_gpu_xid_total")
        return any('xid="43"' in ln and float(ln.split()[-1]) == 100 for ln in lines)

    await wait_agent(agent, counted, description="healer_agent_gpu_xid_total 100")

    async def series_of_100() -> dict[str, Any] | None:
        evs = await node_events(kube_api, EVENTS, gpu_node, "GPUXid")
        assert len(evs) <= 1, [e["metadata"]["name"] for e in evs]  # never one per XID
        if not evs:
            return None
        s = evs[0].get("series") or {}
        return evs[0] if s.get("count") == 100 else None

    # the count 2 is written at once, the rest after the first back-off (10 s)
    ev = await wait_agent(agent, series_of_100, deadline=60,
                          description="one GPUXid Event with series.count 100")
    assert ev["series"]["lastObservedTime"]
    print(f"\n100 XIDs on one GPU -> 1 Event, series.count {ev['series']['count']}")
