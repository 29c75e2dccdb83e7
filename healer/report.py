"""``healer report``: outcomes, measured, over a time window, read from the API server.

The NodeRemediation objects (through :class:`~healer.adapters.kube.store.CRStateStore`) are
the source; :mod:`healer.core.outcomes` computes the figures; each node's GPU count is its
``nvidia.com/gpu`` capacity (else its ``nvidia.com/gpu.count`` label, else ``--gpus-per-node``).
The report says what it covers: the records it read, the oldest, and whether the daemon's
retention (closed records are deleted :data:`RETENTION` after they close) can have pruned
incidents of the window. Text is a table for people; JSON (sorted keys) is for scripts.

Every failure is a one-line :class:`~healer.errors.HealerError` for the CLI to print.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client

from healer.adapters.clock import SYSTEM_CLOCK
from healer.adapters.kube.client import call, make_api_client, to_dict
from healer.adapters.kube.store import CRStateStore
from healer.core.model import NodeRecord
from healer.core.outcomes import (
    GPU_COUNT_LABEL,
    FleetOutcomes,
    IncidentOutcome,
    Percentiles,
    summarize,
)
from healer.core.timefmt import format_duration, rfc3339
from healer.errors import ConfigError, HealerError, NotFoundError
from healer.runtime.controller import RuntimeSettings

#: How long the daemon keeps a closed record (``RuntimeSettings.retention_seconds``).
RETENTION = RuntimeSettings().retention_seconds
#: Node reads in flight at once (only the nodes of the window's incidents are read).
NODE_READS = 16


def span(seconds: float | None) -> str:
    """``0.4s``, ``45s``, ``12m30s``, ``3h5m``, ``4d2h``; ``-`` when unknown."""
    return "-" if seconds is None else format_duration(seconds, units=2)


def gpus_of_node(raw: Mapping[str, Any]) -> int | None:
    """A Node's GPUs: its ``nvidia.com/gpu`` capacity, else its GPU-count label."""
    capacity = (raw.get("status") or {}).get("capacity") or {}
    labels = (raw.get("metadata") or {}).get("labels") or {}
    for text in (capacity.get("nvidia.com/gpu"), labels.get(GPU_COUNT_LABEL)):
        if isinstance(text, str) and text.isdigit() and 0 < int(text) <= 1024:
            return int(text)
    return None


async def _node_gpus(api: client.ApiClient, names: Iterable[str]) -> dict[str, int]:
    core = client.CoreV1Api(api)
    gate = asyncio.Semaphore(NODE_READS)

    async def one(name: str) -> tuple[str, int | None]:
        async with gate:
            try:
                node = await call(f"get node {name}", lambda: core.read_node(name))
            except NotFoundError:
                return name, None  # deleted since: the default count stands
            return name, gpus_of_node(to_dict(api, node))

    found = await asyncio.gather(*(one(n) for n in sorted(set(names))))
    return {n: g for n, g in found if g is not None}


def coverage(fleet: FleetOutcomes, window: float, retention: float = RETENTION) -> str:
    """One sentence: what the report covers, and what retention may have pruned."""
    read = f"{fleet.records} record(s) read"
    if fleet.oldest_opened_at is not None:
        read += f", the oldest opened {rfc3339(fleet.oldest_opened_at)}"
    if window <= retention:
        kept = (f"the daemon keeps closed records {span(retention)} after they close, so no "
                "incident of the window was pruned")
    else:
        kept = (f"the window is longer than the daemon's retention ({span(retention)}): "
                f"incidents closed before {rfc3339(fleet.now - retention)} may have been "
                "pruned and are missing")
    return f"{read}; {kept}"


def as_json(fleet: FleetOutcomes, window: float, nodes: Sequence[str]) -> str:
    body = {"window": {"since": rfc3339(fleet.since), "now": rfc3339(fleet.now),
                       "seconds": window, "nodes": sorted(nodes),
                       "retentionSeconds": RETENTION, "coverage": coverage(fleet, window)},
            **fleet.to_dict()}
    return json.dumps(body, indent=2, sort_keys=True)


def _row(name: str, p: Percentiles) -> str:
    return (f"  {name:34} {p.count:>6} {span(p.p50):>9} {span(p.p90):>9} {span(p.p99):>9} "
            f"{span(p.max):>9}")


def _incident(o: IncidentOutcome) -> str:
    found = o.found_nothing.value if o.found_nothing else "-"
    out = span(o.out_of_service) + ("+" if o.still_out else "")
    return (f"  {o.incident[:40]:40} {o.node[:16]:16} {o.closing.value:10} "
            f"{rfc3339(o.opened_at):20} {span(o.detect):>8} {span(o.to_service):>10} "
            f"{out:>9} {o.gpu_hours_lost:>8.1f}  {found}")


def as_text(fleet: FleetOutcomes, window: float, nodes: Sequence[str]) -> str:
    who = f" on {', '.join(sorted(nodes))}" if nodes else ""
    lines = [f"healer report: incidents opened since {rfc3339(fleet.since)} "
             f"({span(window)}){who}",
             f"  {coverage(fleet, window)}", ""]
    closings = ", ".join(f"{k} {v}" for k, v in fleet.closings.items() if k != "open")
    n_open = fleet.closings["open"]
    lines.append(f"incidents {len(fleet.incidents)} (finished {fleet.finished}, open {n_open}): "
                 f"{closings}")
    rate = fleet.false_positive_rate
    found = fleet.found_nothing
    why = ", ".join(f"{k} {v}" for k, v in found.items())
    lines.append("false-positive rate " + ("-" if rate is None else f"{rate:.1%}")
                 + f" ({sum(found.values())} of {fleet.finished} finished found nothing: "
                 f"{why})")
    lines.append(f"capacity lost {fleet.gpu_hours_lost:.1f} GPU-hours "
                 f"({fleet.node_hours_lost:.1f} node-hours out of service because of healer)")
    lines += ["", f"  {'DURATION':34} {'COUNT':>6} {'P50':>9} {'P90':>9} {'P99':>9} "
                  f"{'MAX':>9}",
              _row("time to detect", fleet.detect),
              _row("time to service (undrained)", fleet.to_service),
              _row("time to replacement (spare)", fleet.to_replacement)]
    lines += [_row(f"step {name}", p) for name, p in sorted(fleet.steps.items())]
    lines += [_row("between incidents, per node", fleet.between_per_node),
              _row("between incidents, per GPU serial", fleet.between_per_serial)]
    for what, repeats in (("nodes", fleet.repeat_nodes), ("GPU serials", fleet.repeat_serials)):
        if repeats:
            lines.append(f"repeat {what}: " + ", ".join(
                f"{r.key} ({r.incidents} incidents, shortest gap {span(r.shortest_gap)})"
                for r in repeats[:10]) + (" ..." if len(repeats) > 10 else ""))
    lines += ["", f"  {'INCIDENT':40} {'NODE':16} {'CLOSING':10} {'OPENED':20} {'DETECT':>8} "
                  f"{'TO SERVICE':>10} {'OUT':>9} {'GPU-H':>8}  FOUND NOTHING"]
    lines += [_incident(o) for o in fleet.incidents] or ["  (no incidents in the window)"]
    if any(o.still_out for o in fleet.incidents):
        lines.append("  OUT+: still out of service now (open), or when healer handed the "
                     "node to a human (escalated, cancelled without undo)")
    return "\n".join(lines)


async def read_records(kubeconfig: str | None, nodes: Sequence[str]
                       ) -> tuple[list[NodeRecord], client.ApiClient]:
    """Every NodeRemediation's record (of ``nodes``, when given) and the open API client."""
    api = await make_api_client(kubeconfig)
    try:
        stored = await CRStateStore(api).list()
    except NotFoundError as e:
        await api.close()
        raise ConfigError(f"the NodeRemediation CRD (noderemediations.healer.io) is not "
                          f"installed on this cluster ({e}); apply deploy/crds/") from None
    except HealerError:
        await api.close()
        raise
    wanted = set(nodes)
    return [s.record for s in stored if not wanted or s.record.node in wanted], api


async def report(kubeconfig: str | None, *, since: float, fmt: str = "text",
                 nodes: Sequence[str] = (), gpus_per_node: int = 8) -> int:
    """Print the outcomes of the incidents opened in the last ``since`` seconds."""
    records, api = await read_records(kubeconfig, nodes)
    try:
        now = SYSTEM_CLOCK.now()
        recent = [r.node for r in records if r.incident.opened_at >= now - since]
        gpus = await _node_gpus(api, recent)
    finally:
        await api.close()
    fleet = summarize(records, now, now - since, lambda n: gpus.get(n, gpus_per_node))
    print(as_json(fleet, since, nodes) if fmt == "json" else as_text(fleet, since, nodes))
    return 0
