"""What a ``promql`` rule may ask of the user's Prometheus, read from its syntax tree.

A ``metric.promql`` expression runs on every poll against the user's Prometheus, for the whole
fleet at once, so its cost must be bounded by the policy, not discovered in production. An
expression is refused when it:

* reads further back than :data:`MAX_LOOKBACK` (a range ``x[10y]``, a subquery's range, an
  offset, or these added along the way: ``max_over_time(rate(x[5m])[1d:1m] offset 1d)`` reads
  two days and five minutes back);
* has a subquery whose step is finer than :data:`MIN_SUBQUERY_STEP`, that evaluates its inner
  expression more than :data:`MAX_SUBQUERY_STEPS` times (``[1y:1ms]``), that leaves its step
  to the server's evaluation interval (which healer cannot see), or that sits inside another
  subquery (its cost multiplies);
* selects series without a metric name (``{__name__=~".+"}``, ``{job="x"}``: every series of
  the server), or names its metric by a regular expression or a negative matcher;
* pins its evaluation time (``@ 1700000000``, ``@ start()``) or reads the future (a negative
  offset): the rule would never see a new sample;
* has a label regex that RE2 (and Prometheus' Go regexp) would read as something else
  (:func:`healer.policy.checks.check_repeats`: ``{a=~"x{1,4294967296}"}``).

The tree is ``promql-parser``'s; :func:`healer.policy.checks.check_promql` bounds size and
nesting first, so the walk here is shallow.
"""

from __future__ import annotations

import datetime
from typing import Any

import promql_parser as pp

from healer.policy.checks import check_repeats

__all__ = ["MAX_LOOKBACK", "MAX_SUBQUERY_STEPS", "MIN_SUBQUERY_STEP", "check_limits"]

#: How far back any rule may read (ranges, subquery ranges and offsets added up): one day.
#: At a 15 s scrape interval a one-day range is 5,760 samples per series, on a fleet of 10,000
#: eight-GPU nodes some 460 million samples per poll; anything longer belongs in a recording
#: rule the rule then reads.
MAX_LOOKBACK = 86400.0
#: The finest subquery step (seconds): finer than a scrape interval only repeats samples.
MIN_SUBQUERY_STEP = 10.0
#: The most evaluations of a subquery's inner expression per poll (a day at one a minute).
MAX_SUBQUERY_STEPS = 1440
#: Subqueries inside subqueries multiply their cost: at most this many levels.
MAX_SUBQUERY_DEPTH = 1


def _seconds(d: datetime.timedelta | None) -> float:
    return d.total_seconds() if d is not None else 0.0


def _human(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s" if seconds >= 1 else f"{seconds * 1000:g}ms"


def check_limits(expr: Any) -> None:
    """Raise ``ValueError`` saying which bound (see the module) the parsed ``expr`` breaks."""
    _walk(expr, 0.0, 0)


def _modifiers(node: Any, what: str) -> float:
    """The node's offset in seconds; refuse ``@`` and a negative offset."""
    if getattr(node, "at", None) is not None:
        raise ValueError(f"expected no @ modifier ({what} pinned to one time would never see "
                         "a new sample; a rule is evaluated at each poll)")
    offset = _seconds(getattr(node, "offset", None))
    if offset < 0:
        raise ValueError(f"expected no negative offset ({what} would read the future, where "
                         "there are no samples)")
    return offset


def _lookback(total: float) -> None:
    if total > MAX_LOOKBACK:
        raise ValueError(f"expected an expression that reads at most {_human(MAX_LOOKBACK)} "
                         f"back (ranges, subquery ranges and offsets together), got "
                         f"{_human(total)}; put a longer view in a recording rule")


def _selector(node: Any) -> None:
    matchers = node.matchers
    groups = [list(matchers.matchers), *(list(g) for g in matchers.or_matchers)]
    for group in groups:
        names = [m for m in group if m.name == "__name__"]
        if not node.name and not any(m.op == pp.MatchOp.Equal for m in names):
            raise ValueError("expected every selector to name its metric (x{...} or "
                             "{__name__=\"x\"}); a selector without one reads every series "
                             "of the server")
        for m in names:
            if m.op != pp.MatchOp.Equal:
                raise ValueError("expected the metric name matched by = only (a regex or a "
                                 "negative match on __name__ reads series by the thousand)")
        for m in group:
            if m.op in (pp.MatchOp.Re, pp.MatchOp.NotRe):
                try:
                    check_repeats(m.value)
                except ValueError as e:
                    raise ValueError(f"label {m.name}: {e}") from None


def _walk(node: Any, back: float, depth: int) -> None:
    if isinstance(node, pp.VectorSelector):
        _selector(node)
        _lookback(back + _modifiers(node, "a selector"))
    elif isinstance(node, pp.MatrixSelector):
        vs = node.vector_selector
        _selector(vs)
        _lookback(back + _modifiers(vs, "a range") + _seconds(node.range))
    elif isinstance(node, pp.SubqueryExpr):
        if depth >= MAX_SUBQUERY_DEPTH:
            raise ValueError(f"expected at most {MAX_SUBQUERY_DEPTH} level of subquery (a "
                             "subquery inside a subquery multiplies its cost)")
        rng, step = _seconds(node.range), _seconds(node.step)
        if node.step is None:
            raise ValueError(f"expected the subquery's step ([{_human(rng)}:1m]): without it "
                             "Prometheus uses its evaluation interval, which healer cannot "
                             "bound")
        if step < MIN_SUBQUERY_STEP:
            raise ValueError(f"expected a subquery step of at least "
                             f"{_human(MIN_SUBQUERY_STEP)}, got {_human(step)}")
        if rng / step > MAX_SUBQUERY_STEPS:
            raise ValueError(f"expected a subquery of at most {MAX_SUBQUERY_STEPS} steps, got "
                             f"[{_human(rng)}:{_human(step)}] ({rng / step:.0f} steps)")
        here = back + _modifiers(node, "a subquery") + rng
        _lookback(here)
        _walk(node.expr, here, depth + 1)
    elif isinstance(node, pp.ParenExpr | pp.UnaryExpr):
        _walk(node.expr, back, depth)
    elif isinstance(node, pp.AggregateExpr):
        _walk(node.expr, back, depth)
        if node.param is not None:
            _walk(node.param, back, depth)
    elif isinstance(node, pp.BinaryExpr):
        _walk(node.lhs, back, depth)
        _walk(node.rhs, back, depth)
    elif isinstance(node, pp.Call):
        for arg in node.args:
            _walk(arg, back, depth)
