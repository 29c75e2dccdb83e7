"""Floors: what the same machine does at best, measured in the same run, so that the bench's
figures travel between machines as ratios (``figure / floor``) and a target stated on a ratio
means the same on a fast and on a slow machine.

* :func:`reference_loop`: the seconds a fixed pure-Python loop (10 million additions) takes
  here: the machine's speed for CPython code. CPU figures (a poll's parse, decisions/s, the
  daemon's idle CPU) are divided by it.
* :func:`write_round_trip`: one write to the same API server (a ConfigMap merge patch from
  the bench's own client, sequential), p50: the floor of any latency that is API writes in a
  row (a fault → its cordon is several of them).

:func:`per_floor` turns a figure into its ratio figure (one value per repeat, over that
repeat's floor) with a target on the ratio.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from kubernetes_asyncio import client

from .report import Figure

#: the reference loop: additions in a plain CPython ``for`` loop
LOOP_ADDITIONS = 10_000_000
#: What the reference loop took on this project's 2-core development machine, quiet
#: (2026-11-28): the targets on ratios are the absolute targets over it.
REFERENCE_LOOP_S = 0.18
#: One API write round trip (p50) there, with 10,000 kwok nodes.
REFERENCE_RTT_S = 0.0076


def reference_loop(repeats: int = 3) -> float:
    """Seconds (the fastest of ``repeats``) for :data:`LOOP_ADDITIONS` additions."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = 0
        for i in range(LOOP_ADDITIONS):
            n += i
        best = min(best, time.perf_counter() - t0)
    return best


async def write_round_trip(api: client.ApiClient, trials: int = 40,
                           namespace: str = "default") -> float:
    """p50 seconds of one merge patch of a scratch ConfigMap (created, then deleted)."""
    core = client.CoreV1Api(api)
    name = "healer-bench-floor"
    await core.create_namespaced_config_map(namespace, {"metadata": {"name": name}})  # type: ignore[arg-type]
    times = []
    try:
        for i in range(trials):
            t0 = time.perf_counter()
            await core.patch_namespaced_config_map(
                name, namespace, {"data": {"n": str(i)}},
                _content_type="application/merge-patch+json", _preload_content=False)  # type: ignore[call-arg]
            times.append(time.perf_counter() - t0)
    finally:
        await core.delete_namespaced_config_map(name, namespace)
    return statistics.median(times)


def per_floor(fig: Figure, floors: Sequence[float], floor_name: str, *, scale: float = 1.0,
              unit: str = "x", target: float | None = None, bound: str = "<=") -> Figure:
    """``fig``'s values over the floor of the same repeat (times ``scale``, to put both in
    one unit), as a figure of its own with a target on the ratio."""
    out = Figure(fig.group, f"{fig.name} / {floor_name}", unit, target, bound)
    for v, f in zip(fig.values, floors, strict=False):
        if f > 0:
            out.add(v * scale / f)
    return out
