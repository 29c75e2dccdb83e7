"""History reading: what a backtest replays, read from Prometheus and Kubernetes.

The telemetry comes from :func:`healer.adapters.prometheus.history.history` (a source's
queries as range queries, through the offline tools' Prometheus client, prometheus-api-client:
ADR 0012; a day at a time: :func:`iter_history`, so memory is bounded by a day of history, the
next day fetched while this one is replayed).
:func:`instants` cuts a stream of signals into the polls the daemon would have seen. The real
Nodes' labels, when a kubeconfig is given, are read once (:func:`kube_node_labels`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable

from healer.core.model import GpuRef, Signal, SignalKind
from healer.errors import ConfigError

#: What history is read with, ``(start, end, step) → signals``: a source's range queries
#: (:func:`healer.adapters.prometheus.history.history` bound to a ``PrometheusSource``), or a
#: test's stand-in.
ReadHistory = Callable[[float, float, float], Awaitable[list[Signal]]]


#: History is fetched a day at a time: Prometheus 2.x evaluates ``timestamp()`` (the freshness
#: query) in a range query in time that grows with the square of the range.
HISTORY_CHUNK = 86400.0


def history_chunks(start: float, end: float, step: float,
                   chunk: float = HISTORY_CHUNK) -> list[tuple[float, float]]:
    """``[start, end]`` cut into ranges of about ``chunk`` seconds (a multiple of ``step``);
    neighbours share their boundary."""
    span = step * max(1, round(chunk / step))
    out: list[tuple[float, float]] = []
    a = start
    while a < end:
        b = min(a + span, end)
        out.append((a, b))
        a = b
    return out


async def iter_history(read: ReadHistory, start: float, end: float, step: float, *,
                       chunk: float = HISTORY_CHUNK) -> AsyncGenerator[list[Signal], None]:
    """``read`` over ``[start, end]``, a chunk at a time in time order, the next
    chunk fetched while the caller works on this one.

    Each chunk keeps what lies before the next chunk's start, so every sample and XID is
    reported once. (Give the source an ``xid_overlap`` of at least one scrape interval: each
    chunk takes its XID baseline from the sample before its start.)
    """
    bounds = history_chunks(start, end, step, chunk)

    async def one(i: int) -> list[Signal]:
        a, b = bounds[i]
        last = i == len(bounds) - 1
        got = await read(a, b, step)
        return [s for s in got if a <= s.observed_at and (last or s.observed_at < b)]

    pending: asyncio.Future[list[Signal]] | None = None
    try:
        for i in range(len(bounds)):
            current = await pending if pending is not None else await one(i)
            pending = asyncio.ensure_future(one(i + 1)) if i + 1 < len(bounds) else None
            yield current
    finally:
        if pending is not None:
            if not pending.done():
                pending.cancel()
            elif not pending.cancelled():
                pending.exception()  # the caller gave up: never "exception never retrieved"


async def fetch_history(read: ReadHistory, start: float, end: float, step: float, *,
                        chunk: float = HISTORY_CHUNK) -> list[Signal]:
    """:func:`iter_history`, joined."""
    return [s async for part in iter_history(read, start, end, step, chunk=chunk)
            for s in part]


def instants(signals: Iterable[Signal], start: float, end: float) -> list[list[Signal]]:
    """The signals within ``[start, end]``, grouped by instant in time order, without the
    metric samples of a node (or GPU) at an instant where it had no fresh heartbeat.

    That is what the daemon's poll does: range functions keep answering from old samples while
    an exporter is down, but that is not fresh data (stale telemetry is never a fault).
    """
    sigs = [s for s in signals if start <= s.observed_at <= end]
    times = [s.observed_at for s in sigs]
    if times != sorted(times):
        sigs.sort(key=lambda s: s.observed_at)  # stable: the order within an instant is kept
    out: list[list[Signal]] = []
    i, n = 0, len(sigs)
    while i < n:
        t = sigs[i].observed_at
        j = i
        while j < n and sigs[j].observed_at == t:
            j += 1
        batch = sigs[i:j]
        i = j
        fresh: set[str] = set()
        stale: dict[str, set[GpuRef | None]] = {}
        for s in batch:
            if s.kind is SignalKind.FRESH:
                fresh.add(s.node)
            elif s.kind is SignalKind.STALE:
                stale.setdefault(s.node, set()).add(s.gpu)
        kept = [s for s in batch if s.kind is not SignalKind.METRIC or s.node in fresh
                or ((gone := stale.get(s.node)) is not None and None not in gone
                    and s.gpu not in gone)]
        if kept:
            out.append(kept)
    return out


async def kube_node_labels(kubeconfig: str, context: str | None = None
                           ) -> dict[str, dict[str, str]]:
    """Every Node's labels, read once from the API server."""
    from healer.adapters.kube.client import make_api_client
    from healer.adapters.kube.nodes import KubeNodes

    try:
        api = await make_api_client(kubeconfig, context)
    except Exception as e:  # kubernetes_asyncio's own errors: a bad kubeconfig
        raise ConfigError(f"cannot use kubeconfig {kubeconfig}: {e}") from e
    try:
        views = await KubeNodes(api).list()
    finally:
        await api.close()
    return {v.name: dict(v.labels) for v in views}

