"""The freshness answers of a poll → per-node summaries, per-GPU rows, sample stamps.

A live poll asks for two rows per node (:func:`~.promql.node_freshness_expr`: the newest
heartbeat, the number of fresh GPUs) and, in its follow-up, the per-GPU rows
(:func:`~.promql.freshness_expr`: UUID, serial and job labels) of the few nodes that need them
(see :meth:`~.freshness.FreshnessTracker.observe_summary`). An answer may mix both shapes: a
row with neither ``FRESH_MARK`` nor ``UP_MARK`` is a per-GPU row. What a poll read stamps its
metric samples (:class:`~.view.PollView`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from healer.adapters.prometheus.freshness import NodeRows, NodeSummary
from healer.adapters.prometheus.parse import PollParser
from healer.adapters.prometheus.promql import FRESH_MARK, JOB_LABEL, UP_MARK
from healer.adapters.prometheus.sanity import FUTURE_SLACK, HEARTBEAT, MAX_GPUS, value_reason
from healer.core.model import GpuRef

_INF = math.inf
_MALFORMED = (TypeError, KeyError, IndexError, ValueError, AttributeError, OverflowError)


@dataclass(slots=True)
class Freshness:
    """One freshness answer, read."""

    rows: NodeRows = field(default_factory=dict)  # per-GPU rows (exact)
    nodes: NodeSummary = field(default_factory=dict)  # per-node summaries
    down: set[str] = field(default_factory=set)  # instances whose ``up`` is 0
    unmapped: int = 0


def read_freshness(parser: PollParser, result: Sequence[Any], now: float = _INF
                   ) -> Freshness:
    """A freshness answer (either shape, see the module) → :class:`Freshness`.

    The job labels of every node with per-GPU rows replace that node's in ``parser.jobs``; a
    summarised node's selecting host label is remembered (``parser.host_of``) the first time.
    A row whose value is not a heartbeat time in ``(0, now]`` (or, for a ``gpus`` row, not a
    GPU count) is dropped and counted under ``heartbeat`` (see :mod:`.sanity`): only its own
    node or GPU then lacks a heartbeat.
    """
    out = Freshness()
    by_node, nodes, down = out.rows, out.nodes, out.down
    unmapped = malformed = newest_rows = 0
    jobs: dict[str, dict[GpuRef, set[str]]] = defaultdict(lambda: defaultdict(set))
    gpu_of = parser.gpu
    node_of = parser.node_of
    host_of = parser.host_of
    drop = parser.drops.add
    latest = now + FUTURE_SLACK
    for entry in result:
        try:
            raw = entry["value"]
            if raw[1] is True or raw[1] is False:
                raise TypeError(raw[1])
            v = float(raw[1])
            float(raw[0])
            labels = entry.get("metric") or {}
            if not -_INF < v < _INF or not isinstance(labels, dict) or len(raw) != 2:
                raise ValueError(v)
        except _MALFORMED:
            malformed += 1
            drop(HEARTBEAT, _reason(entry))
            continue
        mark = labels.get(FRESH_MARK)
        if mark is None and UP_MARK in labels:
            down.add(str(labels.get("instance", "")))
            continue
        if mark == "gpus":
            if not 0 <= v <= MAX_GPUS or v != int(v):
                malformed += 1
                drop(HEARTBEAT, "out-of-range")
                continue
        elif not 0 < v <= latest:  # a heartbeat time: never from the future, nor before 1970
            malformed += 1
            drop(HEARTBEAT, "bad-time")
            continue
        node = node_of(labels)
        if node is None:
            unmapped += 1
            continue
        if mark is not None:
            summary = nodes.get(node)
            if summary is None:
                instance = labels.get("instance", "")
                summary = nodes[node] = [instance if isinstance(instance, str) else "",
                                         -_INF, 0]
                if node not in host_of:
                    host = parser.host_matcher(labels)
                    if host is not None:
                        host_of[node] = host
            if mark == "newest":
                newest_rows += 1
                if v > summary[1]:
                    summary[1] = v
            elif mark == "gpus":
                summary[2] += int(v)
            continue
        gpu = gpu_of(labels)
        row = by_node.get(node)
        if row is None:
            instance = labels.get("instance", "")
            row = by_node[node] = (instance if isinstance(instance, str) else "", {})
            if node not in host_of:
                host = parser.host_matcher(labels)
                if host is not None:
                    host_of[node] = host
        newest = row[1]
        old = newest.get(gpu)
        if old is None or v > old:
            newest[gpu] = v
        job = labels.get(JOB_LABEL)
        if job and gpu is not None:
            jobs[node][gpu].add(str(job))
    if newest_rows < len(nodes):
        for node in [n for n, s in nodes.items() if s[1] == -_INF]:
            del nodes[node]  # a count without its newest row: not a heartbeat
    all_jobs = parser.jobs
    for node in by_node:
        got = jobs.get(node)
        if got:
            all_jobs[node] = {g: tuple(sorted(v)) for g, v in got.items()}
        else:
            all_jobs.pop(node, None)
    parser.malformed += malformed
    out.unmapped = unmapped
    return out


def _reason(entry: Any) -> str:
    reason = value_reason(entry)
    if reason == "out-of-range":  # a finite value refused for its labels or shape
        return "malformed"
    return reason
