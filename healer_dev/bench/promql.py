"""The ``promql`` group: DCGM → Prometheus → healer → first action, on the real stack.

The DCGM exporter simulator (:mod:`healer_dev.sim.dcgm`, one exporter per node) is scraped by a
real Prometheus (:class:`~healer_dev.devstack.prometheus.LocalPrometheus`) every ``scrape``; the
healer daemon (:mod:`healer_dev.bench.daemon`: ``healer run`` with Slurm stood in for) polls it
every ``poll`` seconds (the documented default, ``--poll-interval`` 15) with the shipped
default policies in act mode. An XID 79 is injected on a fresh node per trial; the latency is
from the timestamp of the first scraped sample that carries it (asked of Prometheus:
``timestamp(DCGM_FI_DEV_XID_ERRORS{...} == 79)``) to the watch event of the node's
NodeRemediation (the first action healer takes: the intent record before the drain).
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from healer.errors import ConfigError
from healer_dev.devstack.prometheus import LocalPrometheus
from healer_dev.sim.dcgm import DcgmSim, make_node
from healer_dev.sim.dcgm_server import DcgmFleet

from .cluster import BenchCluster, wait_until
from .policies import write_default
from .report import Figure


@dataclass(frozen=True)
class PromqlSizes:
    trials: int
    poll: float = 15.0
    scrape: str = "15s"


async def run_group(sizes: PromqlSizes, repeats: int, seed: int,
                    say: Callable[[str], None]) -> list[Figure]:
    fig = Figure("promql", f"XID scraped -> NodeRemediation p50, poll {sizes.poll:g}s",
                 "s", sizes.poll)
    fig.note = (f"scrape interval {sizes.scrape}, healer --poll-interval {sizes.poll:g} (the "
                "documented default); the target is one poll interval; "
                f"{sizes.trials} trial(s) per repeat")
    nodes = [f"gpu-{i:02d}" for i in range(sizes.trials * repeats)]
    with tempfile.TemporaryDirectory(prefix="healer-bench-promql-") as tmp:
        work = Path(tmp)
        cl = BenchCluster(work, f"p{secrets.token_hex(3)}", say)
        sim = DcgmSim([make_node(n, 8) for n in nodes])
        fleet = DcgmFleet(sim)
        prom: LocalPrometheus | None = None
        started = False
        try:
            await cl.start_kube()
            await cl.create_nodes(len(nodes), names=nodes)
            addresses = await fleet.start()
            started = True
            prom = LocalPrometheus(work / "prometheus", list(addresses.values()),
                                   scrape_interval=sizes.scrape)
            try:
                await asyncio.to_thread(prom.start)
            except ConfigError as e:
                raise ConfigError(f"Prometheus did not start:\n{e}") from e
            await asyncio.to_thread(prom.wait_for_series,
                                    f"count(up == 1) == {len(addresses)}", 120.0)
            say(f"  DCGM simulator: {len(addresses)} exporters x 8 GPUs, scraped every "
                f"{sizes.scrape} by Prometheus {prom.url}")
            await cl.start_daemon(write_default(work / "policies", permissive=True),
                                  prometheus_url=prom.url, poll_interval=sizes.poll)
            await cl.start_watches()

            async def fresh() -> bool:
                status, body = await cl.http_get("/metrics")
                return status == 200 and \
                    'healer_telemetry_stale_nodes{source="dcgm"} 0.0' in body

            await wait_until(fresh, 3 * sizes.poll + 30, "healer polling fresh telemetry",
                             interval=0.2)
            p = prom
            for r in range(repeats):
                lat: list[float] = []
                for node in nodes[r * sizes.trials:(r + 1) * sizes.trials]:
                    sim.xid(node, 3, 79)
                    expr = f'timestamp(DCGM_FI_DEV_XID_ERRORS{{Hostname="{node}"}} == 79)'

                    async def scraped(expr: str = expr) -> bool:
                        return bool(await asyncio.to_thread(p.query, expr))

                    await wait_until(scraped, 120, f"Prometheus to scrape the XID on {node}",
                                     interval=0.1)
                    at = min(float(s["value"][1]) for s in await asyncio.to_thread(p.query, expr))
                    await wait_until(lambda node=node: node in cl.seen.remediation_wall,  # type: ignore[misc]
                                     3 * sizes.poll + 60, f"healer to open a remediation of {node}",
                                     interval=0.05)
                    lat.append(cl.seen.remediation_wall[node] - at)
                fig.add(statistics.median(lat))
                say(f"  promql repeat {r + 1}: " + ", ".join(f"{x:.1f}s" for x in lat))
        finally:
            await cl.stop()
            if prom is not None:
                await asyncio.to_thread(prom.stop)
            if started:
                await fleet.stop()
    return [fig]
