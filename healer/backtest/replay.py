"""Replay: the history driven through the ONE engine (health evaluation, the state machine,
the guardrails: :class:`healer.sim.engine.Replay` over :class:`healer.core.engine.Engine`)
against the optimistic :class:`~healer.backtest.world.BacktestWorld`.

:class:`Backtest` is incremental: it is fed signals in time order, a chunk at a time (a long
range never has to fit in memory), and nodes join the fleet when their first signal is due.
:func:`replay_history` replays signals already in hand (pure); :func:`backtest` fetches them
from Prometheus a day at a time (:mod:`healer.backtest.history`) and replays them as they come.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from healer.backtest.collect import Collector, build_report
from healer.backtest.history import instants, iter_history, kube_node_labels
from healer.backtest.inputs import DEFAULT_NODE_LABELS, check_range, parse_labels
from healer.backtest.report import Report
from healer.backtest.world import BacktestWorld
from healer.core.health import Verdict
from healer.core.model import HealthState, Signal
from healer.core.rules import Mode, PolicySet
from healer.errors import ConfigError
from healer.sim.engine import Replay
from healer.sim.world import Latencies, SimNode


class HistoryReplay(Replay):
    """:class:`Replay` for history: signals arrive one poll (instant) at a time, and every
    verdict change is logged (for the stale stretches of the report). The engine keeps each
    node's signals bounded and wakes only what a signal can change, as in the daemon."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.verdict_log: dict[str, list[tuple[float, HealthState, str]]] = defaultdict(list)

    def feeder(self, batch: Sequence[Signal]) -> Callable[[float], None]:
        """A callback that delivers ``batch`` (signals of one instant) when it is due."""

        def feed(now: float) -> None:
            self.ingest(batch)

        return feed

    def on_verdict(self, node: str, verdict: Verdict) -> None:
        log = self.verdict_log[node]
        if not log or log[-1][1] is not verdict.state:
            log.append((self.now, verdict.state, verdict.summary()))



def evaluated_policies(policies: PolicySet, as_configured: bool) -> PolicySet:
    """Every policy in ``act`` mode, unless ``as_configured``."""
    if as_configured:
        return policies
    return replace(policies, policies=tuple(replace(p, mode=Mode.ACT)
                                            for p in policies.policies))


class Backtest:
    """An incremental backtest: :meth:`feed` signals in time order (a chunk at a time, so that
    a long range never has to fit in memory), then :meth:`report`.

    ``nodes`` maps node name → labels (from Kubernetes: every node is in the fleet from the
    start); without it, a node joins the fleet when its telemetry is first seen and gets
    ``node_labels`` (default ``nvidia.com/gpu.present=true``).
    """

    def __init__(self, policies: PolicySet, start: float, end: float, *, step: float = 60.0,
                 node_labels: Mapping[str, str] | None = None,
                 nodes: Mapping[str, Mapping[str, str]] | None = None,
                 spares: int | None = None, as_configured: bool = False,
                 latencies: Latencies | None = None, repair_after: float | None = None,
                 source: str = "", label_source: str = "") -> None:
        if end <= start:
            raise ConfigError("the backtest range is empty: --from must be before --to")
        if step <= 0:
            raise ConfigError("--step must be positive")
        if spares is not None and spares < 0:
            raise ConfigError("--spares must not be negative")
        self.policies = policies
        self.start, self.end, self.step = start, end, step
        self.spares, self.as_configured, self.repair_after = spares, as_configured, repair_after
        self.latencies = latencies or Latencies()
        self.source = source
        self.evaluated = evaluated_policies(policies, as_configured)
        self.default_labels = dict(node_labels) if node_labels is not None \
            else parse_labels(DEFAULT_NODE_LABELS)
        self.kube = nodes is not None
        self.labels_of: dict[str, dict[str, str]] = {
            n: dict(lb) for n, lb in (nodes or {}).items()}
        if label_source:
            self.label_source = label_source
        elif self.kube:
            self.label_source = "labels from Kubernetes"
        else:
            self.label_source = "labels " + (",".join(
                f"{k}={v}" for k, v in sorted(self.default_labels.items())) or "(none)")
        spare_labels = dict(self.default_labels)
        spare_labels.update(self.evaluated.fleet.spare_selector.match_labels)
        self.world = BacktestWorld([SimNode(n, dict(lb)) for n, lb in
                                    sorted(self.labels_of.items())],
                                   latencies=self.latencies, spares=spares,
                                   spare_labels=spare_labels, repair_after=repair_after)
        self.collector = Collector()
        self.replay = HistoryReplay(self.evaluated, self.world, start, on_step=self.collector,
                                    keep_timeline=False)
        self.seen: set[str] = set()
        self.signals = 0
        self.seconds = 0.0  # spent replaying
        self._last = -math.inf

    def _joiner(self, nodes: Sequence[str]) -> Callable[[float], None]:
        """Nodes join the fleet when their first signal is due (not when it is fed), so that
        feeding in chunks or at once gives the same fleet at every instant."""

        def join(_now: float) -> None:
            for node in nodes:
                if node in self.labels_of:
                    continue
                # not in Kubernetes: no policy selects it; else the labels every node gets
                labels = {} if self.kube else dict(self.default_labels)
                self.labels_of[node] = labels
                self.world.add_node(SimNode(node, dict(labels)))

        return join

    def feed(self, signals: Iterable[Signal]) -> None:
        """Replay ``signals``; every one must be later than those fed before."""
        began = time.monotonic()  # the replay's cost in real time (the report's timings)
        batches = instants(signals, self.start, self.end)
        if batches and batches[0][0].observed_at <= self._last:
            raise ValueError("backtest signals must be fed in time order")
        for b in batches:
            new = sorted({sig.node for sig in b} - self.seen)
            if new:
                self.seen.update(new)
                self.replay.add_callback(b[0].observed_at, self._joiner(new))
            self.replay.add_callback(b[0].observed_at, self.replay.feeder(b))
            self.signals += len(b)
        if batches:
            self._last = batches[-1][0].observed_at
            self.replay.run(self._last)
        self.seconds += time.monotonic() - began

    def report(self) -> Report:
        """Run to the end of the range; the report."""
        began = time.monotonic()  # the replay's cost in real time (the report's timings)
        self.replay.run(self.end)
        report = build_report(
            self.replay.verdict_log, self.world, self.collector, self.policies, self.evaluated,
            self.signals, sorted(self.seen), self.labels_of, start=self.start, end=self.end,
            step=self.step, spares=self.spares, as_configured=self.as_configured,
            latencies=self.latencies, repair_after=self.repair_after, source=self.source,
            label_source=self.label_source)
        self.seconds += time.monotonic() - began
        return report


def replay_history(signals: Iterable[Signal], policies: PolicySet, start: float, end: float, *,
                   step: float = 60.0, node_labels: Mapping[str, str] | None = None,
                   nodes: Mapping[str, Mapping[str, str]] | None = None,
                   spares: int | None = None, as_configured: bool = False,
                   latencies: Latencies | None = None, repair_after: float | None = None,
                   source: str = "", label_source: str = "") -> Report:
    """Replay ``signals`` (a backtest's telemetry, in any order) through the engine; the
    report. Pure (see :class:`Backtest` for the arguments)."""
    bt = Backtest(policies, start, end, step=step, node_labels=node_labels, nodes=nodes,
                  spares=spares, as_configured=as_configured, latencies=latencies,
                  repair_after=repair_after, source=source, label_source=label_source)
    bt.feed(signals)
    return bt.report()




async def backtest(prometheus: str, policies: PolicySet, start: float, end: float, *,
                   step: float = 60.0, node_labels: Mapping[str, str] | None = None,
                   kubeconfig: str | None = None, spares: int | None = None,
                   as_configured: bool = False, latencies: Latencies | None = None,
                   repair_after: float | None = None,
                   source_options: Mapping[str, Any] | None = None) -> Report:
    """Fetch ``[start, end]`` from Prometheus every ``step`` and replay it, a day at a time
    (see the module).

    ``source_options`` are passed to :class:`PrometheusSource` (``bearer_token_file``,
    ``ca_file``, ``verify``, ``host_labels``, ``matchers``, ``stale_after``...). Raises
    TransientError/PermanentError when Prometheus cannot answer.
    """
    from healer.adapters.clock import SYSTEM_CLOCK
    from healer.adapters.prometheus import PrometheusSource
    from healer.adapters.prometheus.history import history

    check_range(start, end, step, SYSTEM_CLOCK.now())
    began = time.monotonic()  # how long the fetch and the replay took, in real time
    nodes = await kube_node_labels(kubeconfig) if kubeconfig else None
    bt = Backtest(policies, start, end, step=step, node_labels=node_labels, nodes=nodes,
                  spares=spares, as_configured=as_configured, latencies=latencies,
                  repair_after=repair_after, source=prometheus,
                  label_source=f"labels from Kubernetes ({kubeconfig})" if kubeconfig else "")
    opts: dict[str, Any] = {"timeout": 60.0, "poll_interval": max(step, 60.0),
                            "xid_overlap": max(120.0, 2 * step)}
    opts.update(source_options or {})
    src = PrometheusSource(prometheus, policies, **opts)
    try:
        async with contextlib.aclosing(iter_history(functools.partial(history, src), start,
                                                    end, step)) as chunks:
            async for part in chunks:
                bt.feed(part)
    finally:
        src.close()
    report = bt.report()
    total = time.monotonic() - began
    return replace(report, timings={"fetch": total - bt.seconds, "replay": bt.seconds})
