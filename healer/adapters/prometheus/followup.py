"""A live poll's second round: the follow-up queries its first round's answers call for.

At most three kinds, all restricted to a few hosts with a regex matcher on the host label
(``Hostname=~"a|b"``, chunked when long), both evaluated at the poll's time:

* the raw XID samples (:func:`~.promql.xid_expr`) of the hosts the XID pre-query listed,
  plus those whose cursor still holds a non-zero code or counts;
* the per-GPU freshness rows (:func:`~.promql.freshness_expr`, no ``up`` part) of the nodes
  that need them: new, GPU count changed, was stale, with a metric signal or an XID to
  report, or due for the inventory refresh (see :mod:`.nodes`); parsed first;
* ONE recovery query for every currently violating series that is absent from the filtered
  answer of its metric query while its GPU is fresh: the unfiltered expression of each such
  query restricted to those hosts, tagged ``healer_q=<index of the query in the plan>``
  (``label_replace``) and joined with ``or``. A ``promql`` rule's expression cannot be
  restricted, nor a ``series`` rule's (its node label is not the DCGM host label): it is sent
  unfiltered (whole fleet) when one of its series is owed a recovery.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from healer.adapters.prometheus.freshness import NodeSummary
from healer.adapters.prometheus.parse import Emission, Slot
from healer.adapters.prometheus.promql import (
    TAG_LABEL,
    PlannedQuery,
    host_regexes,
    metric_expr,
)
from healer.adapters.prometheus.view import PollView

#: The longest follow-up query we build (characters; a GET URL stays well under 16 KiB).
MAX_QUERY = 8000


@dataclass(slots=True)
class Pending:
    """The follow-ups a poll's first round left, with what their parse needs."""

    now: float
    view: PollView  # the first round's
    window: float
    since: float
    fresh: list[str] = field(default_factory=list)  # per-GPU rows (host-restricted)
    xid: list[str] = field(default_factory=list)  # raw XID queries (host-restricted)
    recovery: list[str] = field(default_factory=list)
    owed: dict[int, set[Slot]] = field(default_factory=dict)  # query index → series
    fetch: set[str] = field(default_factory=set)  # nodes whose per-GPU rows are asked for
    held: set[str] = field(default_factory=set)  # of them, those whose FRESH/STALE waits
    nodes: NodeSummary = field(default_factory=dict)  # the first round's summaries
    deferred: dict[int, list[Emission]] = field(default_factory=dict)  # query index →

    @property
    def exprs(self) -> list[str]:
        return [*self.fresh, *self.xid, *self.recovery]


def recovery_queries(queries: Sequence[PlannedQuery], owed: Mapping[int, set[Slot]],
                     host_of: Mapping[str, tuple[str, str]], *, by: Sequence[str],
                     matchers: Mapping[str, str] | None, join: str) -> list[str]:
    """The recovery follow-up: one query (more only when very long) for every owed series."""
    parts: list[str] = []
    for i in sorted(owed):
        q = queries[i]
        hosts = [host_of.get(node) for node, _ in owed[i]]
        exprs: list[str]
        if q.rule is None or q.rule.promql or q.rule.series or any(h is None for h in hosts):
            exprs = [q.unfiltered]
        else:
            exprs = [metric_expr(q.rule, by=by, matchers=matchers, join=join, regex=rx)
                     for rx in host_regexes([h for h in hosts if h is not None])]
        parts.extend(f'label_replace({e}, "{TAG_LABEL}", "{i}", "", "")' for e in exprs)
    out: list[str] = []
    for p in parts:
        if out and len(out[-1]) + len(p) + 4 <= MAX_QUERY:
            out[-1] += " or " + p
        else:
            out.append(p)
    return out
