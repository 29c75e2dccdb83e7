"""DCGM telemetry through Prometheus: PromQL → :class:`~healer.core.model.Signal`.

:class:`PrometheusSource` implements the ``TelemetrySource`` port (``name = "dcgm"``). Every
poll sends a fixed set of **fleet-wide** instant queries, all evaluated at the same time:

* one per distinct metric expression of the policy set: ``increase(FIELD[window])``,
  ``rate(...)``, ``max_over_time(...)`` or the plain gauge, aggregated ``max by`` (``min by``
  for ``<``/``<=`` rules) host, instance and GPU labels; a rule with ``promql`` runs its
  expression as given; a ``series`` rule (any exporter's metric: node-exporter's InfiniBand
  ports) aggregates by its node label and ``per`` labels only, without the source's DCGM
  matchers or join (:func:`~.promql.series_expr`), and its samples carry the part
  (:class:`~healer.core.parts.PartRef`, an HCA port) instead of a GPU, stamped with the node's
  heartbeat. Its :class:`PlannedQuery` carries every distinct (op, threshold) of the
  rules it serves (``predicates``);
* one for XIDs (shared by every XID rule): the raw samples of ``DCGM_FI_DEV_XID_ERRORS`` (the
  *last* XID, per GPU) and ``DCGM_EXP_XID_ERRORS_COUNT`` (per XID in a sliding window) since the
  previous poll. A per-GPU cursor turns a change of the last value and every increase of a count
  into one ``Signal(XID, value=code)`` per new occurrence, reported once. A repeated identical
  XID is visible only through the count series (the last value does not change);
* one for freshness, proportional to nodes, not GPUs: per node (host, ``instance``) the
  newest heartbeat sample (``timestamp()``) and how many GPUs have a heartbeat at most
  ``stale_after`` old (two rows, told apart by ``FRESH_MARK``), plus the exporters whose
  ``up`` is 0 (:func:`node_freshness_expr`). The per-GPU rows (UUID, serial and ``hpc_job``
  labels) come in the follow-up, host-restricted, only for the nodes that need them: a node
  seen for the first time, whose fresh-GPU count differs from its known GPUs (a GPU missing,
  old, added), that was stale, that has a metric signal or an XID to report, or whose turn
  it is in the inventory refresh (every node once per about ``forget_after / 4``, spread
  over the polls by a hash of its name). A node judged from its two rows alone is FRESH (or
  ``series-old``) at once; the others' FRESH/STALE comes with the follow-up (see
  :mod:`.nodes`).

**What a live poll emits for metrics (the contract with the core).** The core evaluates a
metric rule only from the series it receives, the latest signal per (node, GPU, key) deciding;
an absent series means "no match". So a poll emits ``Signal(METRIC, key, gpu=GpuRef(index,
UUID), value)`` for a (node, GPU, key) only when

(a) its value satisfies at least one predicate of the query (it *violates*), every poll; or
(b) it violated when it was last emitted and no longer does: exactly one *recovery* signal
    with the real value, after which the series is silent while healthy.

A healthy series that never violated is never emitted. The per-key set of currently violating
(node, GPU) makes (b) reliable: a violating series that goes missing or stale stays in it (its
recovery comes when it is seen healthy again), a node's entries go when the freshness tracker
forgets the node, a key's when no query serves it after a policy reload. Of duplicate series
of one GPU (one per job) the worst counts, a violating one before a healthy one. A NaN or ±Inf
value is not a reading: it is skipped (counted as malformed), never a violation nor a
recovery. Signals are stamped with the time their GPU was last scraped (an instant query's own
timestamp is only the evaluation time): a node's metric signals come in the follow-up round,
with its per-GPU rows, unless those rows were in the first answer; recoveries of a node whose
rows were not fetched take the node's newest scrape time. Samples of a GPU or node with no
heartbeat in this poll are dropped (range functions still see their old samples), its STALE
signal says why. The backtest path (:func:`.history.history`, range queries) is not
filtered: every sample.

Stale telemetry is *unknown*, never healthy and never failed: a node whose series are absent
(exporter down, scrape failing, series gone) or older than ``stale_after``, a GPU whose series
vanished, and every known node while Prometheus cannot be queried get ``Signal(STALE,
key=source)``; a node whose data is fresh gets ``Signal(FRESH)``. The outage and its recovery
are logged once each. Node names come from the ``Hostname`` label (released dcgm-exporter) or
``hostname`` (newer builds), or from ``node_map``/``join`` for exporters labelled differently.

HTTP: the daemon's poll goes through its own client (:mod:`.http`: one ``requests`` session,
synchronous, run in the source's threads), raw bodies decoded with orjson, parsed in
tight loops without an object per healthy sample (:meth:`PrometheusSource.parse_poll` is that
parse, without HTTP, for benchmarks). A malformed
entry never raises out of a poll: it is skipped and counted (``PollStats.malformed_samples``
this poll, ``PrometheusSource.drops`` by metric and reason since start; see :mod:`.sanity`
for what a sample may be: finite, a possible XID code or count or temperature, stamped inside
the query's window). The heartbeat counts finite samples only, so a ``+Inf`` reading is no
sign of life; a body that is not an API answer is a :class:`~.http.BadAnswer`.
Errors are mapped to :mod:`healer.errors`: connection problems, timeouts, 5xx and 429 are
``TransientError`` (retried within the poll by :data:`healer.adapters.retry.QUICK`, a
Retry-After honoured), other 4xx are ``PermanentError``
(a bad ``promql`` rule, bad credentials). The backtest's history reads through the offline
tools' client (:mod:`.offline`: prometheus-api-client, the same session settings, bounds and
error mapping; ADR 0012 says which client serves what and why).

Modules. Pure (no I/O, no clock: the time is an argument; an import-linter contract in
``pyproject.toml`` keeps them so): :mod:`.promql` (query generation), :mod:`.labels`,
:mod:`.sanity` (what a sample may be, the drop counter), :mod:`.xid` (the cursor),
:mod:`.freshness` (the tracker), :mod:`.nodes` (freshness answers), :mod:`.view` (sample
stamps), :mod:`.parse` (answers → signals), :mod:`.followup` (the second round's queries),
:mod:`.stats`. I/O:
:mod:`.access` (how to reach Prometheus: URL, TLS, bearer token file), :mod:`.http` (the
daemon's client), :mod:`.offline` (the offline tools' client), :mod:`.source` (the one source:
its settings, the poll's HTTP), :mod:`.rounds` (the live poll: its state between polls, each
round's queries and the parse of their answers), :mod:`.history` (the backtest's
range queries).
"""

from healer.adapters.prometheus.source import PrometheusSource

__all__ = ["PrometheusSource"]
