"""Decoded Prometheus answers → signals, in tight loops over the parsed lists.

:class:`PollParser` holds what must outlive one poll: the GPU and detail caches, the per-key
set of currently violating series (for the one recovery signal, see the package docstring)
and the jobs per GPU of each node's last per-GPU freshness rows (:mod:`.nodes`). A malformed
entry (not an object, a label map that is not one, a value that is not ``[time, "number"]``,
a NaN or ±Inf, a value or time no exporter sends: see :mod:`.sanity`) is skipped, counted in
``malformed`` (this poll) and in ``drops`` (by metric and reason, cumulative); it never raises.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from healer.adapters.prometheus.labels import GpuCache, labels_of, node_name
from healer.adapters.prometheus.promql import (
    JOB_LABEL,
    TAG_LABEL,
    XID_COUNT,
    XID_GAUGE,
    PlannedQuery,
)
from healer.adapters.prometheus.sanity import (
    MAX_XID,
    MAX_XID_COUNT,
    XID,
    Drops,
    point,
    rule_range,
    value_reason,
    xid_label,
)
from healer.adapters.prometheus.view import PollView
from healer.adapters.prometheus.xid import XidCursor, XidEvent, XidSeries, XidTracker
from healer.core.model import GpuRef, Signal, SignalKind
from healer.core.parts import PartRef
from healer.core.rules import MetricRule, Op

NodeMap = Callable[[dict[str, Any]], str | None]
#: What a metric series is about: a GPU, a part of the node (a rule's ``per`` labels: an HCA
#: port), or the node itself (None)
Entity = GpuRef | PartRef | None
Slot = tuple[str, Entity]
#: (node, GPU or part, value, violates): one series a metric answer emits
Emission = tuple[str, Entity, float, bool]
_INF = math.inf
_MALFORMED = (TypeError, KeyError, IndexError, ValueError, AttributeError, OverflowError)


class PollParser:
    """Parses the answers of one source's queries; see the module."""

    def __init__(self, source: str, host_labels: Sequence[str],
                 node_map: NodeMap | None = None, drops: Drops | None = None) -> None:
        self.source = source
        #: samples and answers dropped, by (metric, reason) (see :mod:`.sanity`)
        self.drops = drops if drops is not None else Drops()
        self.host_labels = tuple(host_labels)
        self.node_map = node_map
        self.gpu = GpuCache()
        #: signal key → node → the GPUs whose last emitted sample violated a predicate
        self.violating: dict[str, dict[str, set[Entity]]] = {}
        #: node → GPU → its ``hpc_job`` labels, as of the node's last per-GPU rows
        self.jobs: dict[str, dict[GpuRef, tuple[str, ...]]] = {}
        self.malformed = 0  # since the last reset, by the caller
        self._details: dict[tuple[str, str, tuple[str, ...] | None],
                            tuple[tuple[str, str], ...]] = {}
        #: node → the (label, value) that selects its series (for host-restricted follow-ups)
        self.host_of: dict[str, tuple[str, str]] = {}

    # -- labels ---------------------------------------------------------------------------

    def node_of(self, labels: dict[str, Any]) -> str | None:
        if self.node_map is not None:
            mapped = self.node_map(labels)
            if mapped:
                return mapped
        return node_name(labels, self.host_labels)

    def host_matcher(self, labels: dict[str, Any]) -> tuple[str, str] | None:
        """The label and raw value that select this series' node: the host label that named
        it, or ``instance`` when ``node_map`` did."""
        if self.node_map is not None and self.node_map(labels):
            inst = labels.get("instance")
            return ("instance", inst) if isinstance(inst, str) and inst else None
        for lb in self.host_labels:
            v = labels.get(lb)
            if v and isinstance(v, str) and v.strip():
                return lb, v
        return None

    def mappers(self, rule: MetricRule | None
                ) -> tuple[Callable[[dict[str, Any]], str | None],
                           Callable[[dict[str, Any]], Entity], bool]:
        """(labels → node, labels → entity, whether its labels select a node's DCGM series)
        for one rule's series: a rule's ``node_label`` names the node, its ``per`` labels the
        part (:class:`PartRef`); else the host labels and the GPU."""
        node_of: Callable[[dict[str, Any]], str | None] = self.node_of
        entity_of: Callable[[dict[str, Any]], Entity] = self.gpu
        own = rule is not None and bool(rule.node_label)
        if rule is not None and rule.node_label:
            node_label = (rule.node_label,)

            def node_of(labels: dict[str, Any]) -> str | None:
                return node_name(labels, node_label)
        if rule is not None and rule.per:
            per = rule.per

            def entity_of(labels: dict[str, Any]) -> Entity:
                return PartRef(tuple((lb, str(labels.get(lb, ""))) for lb in per))
        return node_of, entity_of, not own

    def detail(self, node: str, gpu: Entity, name: str, value: str
               ) -> tuple[tuple[str, str], ...]:
        if not isinstance(gpu, GpuRef):
            gpu = None
        of_node = self.jobs.get(node) if gpu is not None else None
        jobs = of_node.get(gpu) if of_node is not None and gpu is not None else None
        key = (name, value, jobs)
        out = self._details.get(key)
        if out is None:
            kw = {name: value}
            if jobs:
                kw[JOB_LABEL] = ",".join(jobs)
            if len(self._details) > 100_000:
                self._details.clear()
            out = self._details[key] = Signal.details(**kw)
        return out

    def xid_signals(self, events: Iterable[XidEvent]) -> list[Signal]:
        """XID occurrences → their XID signals (with the GPU's job labels)."""
        detail = self.detail
        return [Signal(e.node, self.source, SignalKind.XID, XID_GAUGE, float(e.code), e.at,
                       e.gpu, detail(e.node, e.gpu, "via", e.via)) for e in events]

    def forget(self, node: str) -> None:
        """The freshness tracker forgot ``node``: so does the violating set."""
        for nodes in self.violating.values():
            nodes.pop(node, None)
        self.host_of.pop(node, None)
        self.jobs.pop(node, None)

    def keep_keys(self, keys: set[str]) -> None:
        """After a policy reload: drop the violating state of keys no query serves now."""
        for key in [k for k in self.violating if k not in keys]:
            del self.violating[key]

    # -- metrics --------------------------------------------------------------------------

    def metric_live(self, q: PlannedQuery, result: Sequence[Any], view: PollView,
                    only: set[Slot] | None = None
                    ) -> tuple[list[Signal], int, int, list[Slot], list[Emission]]:
        """One metric answer of a live poll → (signals, unmapped, dropped as stale, owed,
        deferred).

        Emits only violating series and the one recovery of a series that violated when it
        was last emitted (see the package docstring); the worst of duplicate series counts.
        ``owed``: the currently violating series absent from the answer whose GPU is fresh —
        their recovery needs their real value (the follow-up query). ``only``: consider these
        series only (the answer of that follow-up). ``deferred``: what a node without per-GPU
        rows would emit (``view.defers``): :meth:`emit` it with the follow-up's view.
        """
        tests = q.tests()
        single = tests[0] if len(tests) == 1 else None
        viol = self.violating.setdefault(q.key, {})
        lower = q.op in (Op.LT, Op.LE)
        best: dict[Slot, tuple[float, bool]] = {}
        unmapped = malformed = 0
        node_of, gpu_of, hosts = self.mappers(q.rule)
        lo, hi = rule_range(q.rule)
        drop = self.drops.add
        for entry in result:
            try:
                raw = entry["value"][1]
                if raw is True or raw is False:
                    raise TypeError(raw)
                v = float(raw)
            except _MALFORMED:
                malformed += 1
                drop(q.key, value_reason(entry))
                continue
            if not lo <= v <= hi or v == _INF or v == -_INF:  # NaN fails the first
                malformed += 1
                drop(q.key, value_reason(entry))
                continue
            if single is not None:
                bad = single[0](v, single[1])
            else:
                bad = not tests or any(f(v, t) for f, t in tests)
            if not bad and not viol:
                continue  # healthy, and nothing of this key to recover: the common case
            labels = labels_of(entry)
            if labels is None:
                malformed += 1
                drop(q.key, "malformed")
                continue
            node = node_of(labels)
            if node is None:
                unmapped += 1
                continue
            if not bad and node not in viol:
                continue
            gpu = gpu_of(labels)
            if not bad and gpu not in viol[node]:
                continue
            slot = (node, gpu)
            if only is not None and slot not in only:
                continue
            if bad and hosts and node not in self.host_of:
                host = self.host_matcher(labels)
                if host is not None:
                    self.host_of[node] = host
            old = best.get(slot)
            if old is None or (bad and not old[1]) or (
                    bad is old[1] and (v < old[0] if lower else v > old[0])):
                best[slot] = (v, bad)
        self.malformed += malformed
        deferred: list[Emission] = []
        items: list[Emission] = []
        defers = view.defers
        for (node, gpu), (v, bad) in best.items():
            (deferred if defers(node) else items).append((node, gpu, v, bad))
        signals, stale = self.emit(q, items, view)
        owed: list[Slot] = []
        if only is None:
            stamp = view.stamp
            for node, gpus in viol.items():
                for gpu in gpus:
                    if (node, gpu) not in best and stamp(node, gpu) is not None:
                        owed.append((node, gpu))
        return signals, unmapped, stale, owed, deferred

    def emit(self, q: PlannedQuery, items: Sequence[Emission], view: PollView
             ) -> tuple[list[Signal], int]:
        """(node, GPU, value, violates) of one query → (signals, dropped as stale); updates
        the violating set."""
        viol = self.violating.setdefault(q.key, {})
        signals: list[Signal] = []
        stale = 0
        rule = ",".join(q.rules)
        key, source, kind = q.key, self.source, SignalKind.METRIC
        stamp = view.stamp
        for node, gpu, v, bad in items:
            scraped = stamp(node, gpu)
            if scraped is None:
                # no heartbeat from it now: range functions (increase, rate, ...) still see
                # old samples, but they say nothing fresh; the STALE signal says why
                stale += 1
                continue
            if bad:
                viol.setdefault(node, set()).add(gpu)
            else:
                gpus = viol.get(node)
                if gpus is not None:
                    gpus.discard(gpu)
                    if not gpus:
                        del viol[node]
            if isinstance(gpu, PartRef):
                signals.append(Signal(node, source, kind, key, v, scraped, None,
                                      self.detail(node, None, "rule", rule), gpu))
            else:
                signals.append(Signal(node, source, kind, key, v, scraped, gpu,
                                      self.detail(node, gpu, "rule", rule)))
        return signals, stale

    def recovery(self, queries: Sequence[PlannedQuery], result: Sequence[Any],
                 view: PollView, owed: dict[int, set[Slot]]
                 ) -> tuple[list[Signal], int, int]:
        """The answer of the recovery follow-up (entries tagged with ``TAG_LABEL`` = the
        query's index in ``queries``) → (signals, unmapped, dropped as stale)."""
        per: dict[int, list[Any]] = defaultdict(list)
        for entry in result:
            labels = labels_of(entry)
            try:
                per[int(labels[TAG_LABEL])].append(entry)  # type: ignore[index]
            except _MALFORMED:
                self.malformed += 1
                self.drops.add("recovery", "malformed")
        signals: list[Signal] = []
        unmapped = stale = 0
        for i, entries in sorted(per.items()):
            if i not in owed or not 0 <= i < len(queries):
                continue
            sigs, bad, old, _, _ = self.metric_live(queries[i], entries, view, owed[i])
            signals.extend(sigs)
            unmapped += bad
            stale += old
        return signals, unmapped, stale

    def points(self, entry: Any, metric: str, lo_t: float = -_INF, hi_t: float = _INF,
               lo: float = -_INF, hi: float = _INF, integral: bool = False
               ) -> list[tuple[float, float]]:
        """A range-vector entry's samples that pass :func:`~.sanity.point` (and are whole
        numbers when ``integral``); every other one is counted in ``drops`` under ``metric``."""
        raw = entry.get("values") if isinstance(entry, dict) else None
        if not isinstance(raw, list):
            self.malformed += 1
            self.drops.add(metric, "malformed")
            return []
        out: list[tuple[float, float]] = []
        bad: dict[str, int] = {}
        for p in raw:
            got = point(p, lo_t, hi_t, lo, hi)
            if isinstance(got, str):
                bad[got] = bad.get(got, 0) + 1
            elif integral and got[1] != int(got[1]):
                bad["out-of-range"] = bad.get("out-of-range", 0) + 1
            else:
                out.append(got)
        for reason, n in bad.items():
            self.malformed += n
            self.drops.add(metric, reason, n)
        return out

    def metric_history(self, q: PlannedQuery, result: Sequence[Any], lo_t: float = -_INF,
                       hi_t: float = _INF) -> list[Signal]:
        """A range answer → one METRIC signal per node, GPU and step (unfiltered); samples
        outside ``[lo_t, hi_t]`` or the rule's possible values are dropped and counted."""
        best: dict[Slot, dict[float, float]] = {}
        lower = q.op in (Op.LT, Op.LE)
        lo, hi = rule_range(q.rule)
        node_of, entity_of, _ = self.mappers(q.rule)
        for entry in result:
            labels = labels_of(entry)
            if labels is None:
                self.drops.add(q.key, "malformed")
                continue
            node = node_of(labels)
            if node is None:
                continue
            points = self.points(entry, q.key, lo_t, hi_t, lo, hi)
            if not points:
                continue
            slots = best.setdefault((node, entity_of(labels)), {})
            for t, v in points:
                old = slots.get(t)
                if old is None or (v < old if lower else v > old):
                    slots[t] = v
        rule = ",".join(q.rules)
        signals: list[Signal] = []
        for (node, entity), slots in best.items():
            detail = self.detail(node, entity, "rule", rule)  # once per series, not per point
            gpu = entity if isinstance(entity, GpuRef) else None
            part = entity if isinstance(entity, PartRef) else None
            signals.extend(Signal(node, self.source, SignalKind.METRIC, q.key, v, t, gpu,
                                  detail, part) for t, v in slots.items())
        return signals

    # -- XIDs -----------------------------------------------------------------------------

    def xid_points(self, entry: Any, metric: Any, lo_t: float, hi_t: float
                   ) -> tuple[tuple[float, float], ...]:
        """An XID series' samples: codes 0..MAX_XID, counts 0..MAX_XID_COUNT, whole numbers,
        in ``[lo_t, hi_t]``; the others are dropped and counted (see :mod:`.sanity`)."""
        top = float(MAX_XID) if metric == XID_GAUGE else float(MAX_XID_COUNT)
        return tuple(self.points(entry, XID, lo_t, hi_t, 0.0, top, integral=True))

    def _xid_labels(self, entry: Any) -> dict[str, Any] | None:
        """An XID answer entry's labels; None (counted as malformed) if it has none."""
        labels = labels_of(entry)
        if labels is None:
            self.malformed += 1
            self.drops.add(XID, "malformed")
        return labels

    def xid_of(self, metric: Any, labels: dict[str, Any]) -> tuple[bool, int | None]:
        """(usable, the ``xid`` label of a count series): a count series whose ``xid`` label
        is not a code 1..MAX_XID is dropped (counted)."""
        if metric != XID_COUNT:
            return True, None
        raw = labels.get("xid")
        if raw is None or raw == "":
            return True, None
        code = xid_label(raw)
        if code is None:
            self.malformed += 1
            self.drops.add(XID, "out-of-range")
            return False, None
        return True, code

    def xid_series(self, result: Sequence[Any], lo_t: float = -_INF, hi_t: float = _INF
                   ) -> tuple[list[XidSeries], int]:
        """The XID answer → the series with node and GPU resolved (+ unmapped count);
        samples outside ``[lo_t, hi_t]`` or not a possible code or count are dropped."""
        out: list[XidSeries] = []
        unmapped = 0
        for entry in result:
            labels = self._xid_labels(entry)
            if labels is None:
                continue
            node = self.node_of(labels)
            gpu = self.gpu(labels)
            if node is None or gpu is None:
                unmapped += 1
                continue
            metric = labels.get("__name__", "")
            if metric not in (XID_GAUGE, XID_COUNT):
                continue
            ok, xid = self.xid_of(metric, labels)
            if ok:
                out.append(XidSeries(node, gpu, metric, xid,
                                     self.xid_points(entry, metric, lo_t, hi_t)))
        return out, unmapped

    def xid_flagged(self, result: Sequence[Any]
                    ) -> tuple[set[tuple[str, str]], int, set[str]]:
        """The XID pre-query's answer → ((label, value) selecting each listed GPU's node,
        unmapped, the nodes). Only the labels are read: any answer shape listing series."""
        hosts: set[tuple[str, str]] = set()
        nodes: set[str] = set()
        unmapped = 0
        for entry in result:
            labels = self._xid_labels(entry)
            if labels is None:
                continue
            node = self.node_of(labels)
            host = self.host_matcher(labels) if node is not None else None
            if node is None or host is None:
                unmapped += 1
                continue
            self.host_of[node] = host
            hosts.add(host)
            nodes.add(node)
        return hosts, unmapped, nodes

    def xid_live(self, result: Sequence[Any], tracker: XidTracker, since: float,
                 known: Callable[[str, GpuRef], bool] | None = None,
                 previous: float = -math.inf, lo_t: float = -_INF, hi_t: float = _INF
                 ) -> tuple[list[XidEvent], int, int]:
        """The XID answer of a live poll → (events, unmapped, samples).

        Only samples in ``[lo_t, hi_t]`` (the query's window) that are possible codes or
        counts are read (see :mod:`.sanity`): a stamp from the future never moves a cursor
        past good data, a bad sample never stops it from moving past the good ones.

        A series whose every sample is ``"0"`` on a GPU whose cursor already says "no XID,
        no counts" changes nothing but the cursor's time: it skips the per-sample work (a GPU
        whose cursor holds counts goes to the tracker, which sees gone count series). A GPU
        without a cursor for which ``known`` is true gets the implicit baseline of
        :meth:`XidTracker.baseline`: its samples at or before ``previous`` (the previous
        completed XID poll's time) if it has any, else "last code 0, no counts".
        """
        quiet: list[tuple[XidCursor, float, Any]] = []
        busy: list[tuple[str, GpuRef, Any, dict[str, Any], Any]] = []
        unmapped = 0
        cursors = tracker._cursors
        node_of, gpu_of = self.node_of, self.gpu
        for entry in result:
            labels = self._xid_labels(entry)
            if labels is None:
                continue
            node = node_of(labels)
            gpu = gpu_of(labels)
            if node is None or gpu is None:
                unmapped += 1
                continue
            metric = labels.get("__name__")
            if metric != XID_GAUGE and metric != XID_COUNT:
                continue
            cur = cursors.get((node, gpu))
            if cur is None and known is not None and known(node, gpu):
                cur = tracker.baseline(node, gpu, previous)
            if cur is not None and (cur.code == 0 and not cur.counts if metric == XID_GAUGE
                                    else cur.counts == {} and not labels.get("xid")):
                try:
                    values = entry["values"]
                    last = float(values[-1][0])
                    zero = lo_t <= last <= hi_t and all(
                        p[1] == "0" and lo_t <= p[0] <= hi_t and len(p) == 2 for p in values)
                except _MALFORMED:
                    zero = False
                if zero:
                    quiet.append((cur, last, entry))
                    continue
            busy.append((node, gpu, metric, labels, entry))
        series: list[XidSeries] = []
        n = 0
        busy_cursors = {id(c) for c in (cursors.get((b[0], b[1])) for b in busy) if c}
        for cur, last, entry in quiet:
            if id(cur) in busy_cursors:  # interleaved with other samples: the full path
                labels = entry["metric"]
                node, gpu = node_of(labels), gpu_of(labels)
                if node is not None and gpu is not None:
                    busy.append((node, gpu, labels.get("__name__"), labels, entry))
                continue
            n += len(entry["values"])
            if last > cur.t:  # Prometheus returns a series' samples in time order
                cur.t = last
        for node, gpu, metric, labels, entry in busy:
            ok, xid = self.xid_of(metric, labels)
            if not ok:
                continue
            points = self.xid_points(entry, metric, lo_t, hi_t)
            n += len(points)
            series.append(XidSeries(node, gpu, metric, xid, points))
        events = tracker.feed(series, since=since)
        if tracker.capped:
            self.drops.add(XID, "too-many", tracker.capped)
        return events, unmapped, n
