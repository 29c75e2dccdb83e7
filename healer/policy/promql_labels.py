"""Which labels a PromQL expression's result can carry, read from its syntax tree.

A ``promql`` rule's series are mapped to nodes by a label (the source's host labels or the
rule's ``nodeLabel``) and to parts by its ``per`` labels. An expression that drops that label
by construction (``sum(rate(x[5m]))``, ``max by (device) (x)``, ``x * on(gpu) y``, a number)
could never name a node: the policy is refused at load instead of matching nothing forever.

The tree is ``promql-parser``'s (:func:`healer.policy.checks.check_promql` checks size and
nesting first). The rules follow Prometheus' evaluation: an aggregation keeps its ``by`` labels
(every label but its ``without`` ones; ``topk``/``bottomk``/``limitk`` keep the input's), a
one-to-one vector match with ``on(...)`` keeps only those labels and with ``ignoring(...)``
drops them, ``group_left``/``group_right`` keep the many side's labels plus the included ones,
``and``/``unless`` keep the left side's, ``or`` either side's, ``label_replace``/``label_join``
add their destination, ``absent`` keeps its equality matchers' labels, and a scalar has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import promql_parser as pp

_KEEP_INPUT = frozenset({"topk", "bottomk", "limitk", "limit_ratio"})
_ADD_LABEL = frozenset({"label_replace", "label_join"})
_ABSENT = frozenset({"absent", "absent_over_time"})


@dataclass(frozen=True, slots=True)
class Labels:
    """The labels a result may carry: every label but ``names`` (``open``), or only
    ``names``; ``scalar``: a number, no series at all."""

    open: bool
    names: frozenset[str] = frozenset()
    scalar: bool = False

    def may_have(self, label: str) -> bool:
        return (label not in self.names) if self.open else (label in self.names)

    def keep(self, names: Sequence[str]) -> Labels:
        wanted = frozenset(names)
        kept = wanted - self.names if self.open else wanted & self.names
        return Labels(False, kept)

    def drop(self, names: Sequence[str]) -> Labels:
        if self.open:
            return Labels(True, self.names | frozenset(names))
        return Labels(False, self.names - frozenset(names))

    def add(self, names: Sequence[str]) -> Labels:
        if self.open:
            return Labels(True, self.names - frozenset(names))
        return Labels(False, self.names | frozenset(names))


ANY = Labels(True)
SCALAR = Labels(False, scalar=True)


def result_labels(expr: Any) -> Labels:
    """The labels the result of a parsed expression may carry (see the module)."""
    if isinstance(expr, pp.VectorSelector | pp.MatrixSelector):
        return ANY
    if isinstance(expr, pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
        return result_labels(expr.expr)
    if isinstance(expr, pp.NumberLiteral | pp.StringLiteral):
        return SCALAR
    if isinstance(expr, pp.AggregateExpr):
        return _aggregate(expr)
    if isinstance(expr, pp.Call):
        return _call(expr)
    if isinstance(expr, pp.BinaryExpr):
        return _binary(expr)
    return ANY  # a node type this parser version adds: never refuse on what we cannot read


def _aggregate(expr: Any) -> Labels:
    inner = result_labels(expr.expr)
    op = str(expr.op)
    if op in _KEEP_INPUT:
        return inner
    mod = expr.modifier
    out = Labels(False)
    if mod is not None and mod.type == pp.AggModifierType.By:
        out = inner.keep(list(mod.labels))
    elif mod is not None:
        out = inner.drop(list(mod.labels))
    if op == "count_values" and isinstance(expr.param, pp.StringLiteral):
        out = out.add([str(expr.param.val)])
    return out


def _call(expr: Any) -> Labels:
    name = expr.func.name
    args = list(expr.args)
    if expr.func.return_type == pp.ValueType.Scalar:
        return SCALAR
    if name in _ABSENT and args:
        sel = args[0].vector_selector if isinstance(args[0], pp.MatrixSelector) else args[0]
        if isinstance(sel, pp.VectorSelector):
            eq = [m.name for m in sel.matchers.matchers if m.op == pp.MatchOp.Equal]
            return Labels(False, frozenset(eq))
        return Labels(False)
    vectors = [a for a in args if not isinstance(a, pp.NumberLiteral | pp.StringLiteral)]
    if not vectors:  # vector(1), time()-like
        return Labels(False)
    out = result_labels(vectors[0])
    if name in _ADD_LABEL and len(args) > 1 and isinstance(args[1], pp.StringLiteral):
        out = out.add([str(args[1].val)])
    return out


def _binary(expr: Any) -> Labels:
    lhs, rhs = result_labels(expr.lhs), result_labels(expr.rhs)
    op = str(expr.op)
    if lhs.scalar and rhs.scalar:
        return SCALAR
    if lhs.scalar or rhs.scalar:
        return rhs if lhs.scalar else lhs
    mod = expr.modifier
    if op in ("and", "unless"):
        return lhs
    if op == "or":
        if lhs.open or rhs.open:
            both = [x.names for x in (lhs, rhs) if x.open]
            return Labels(True, frozenset.intersection(*both))
        return Labels(False, lhs.names | rhs.names)
    card = mod.card if mod is not None else pp.VectorMatchCardinality.OneToOne
    matching = mod.matching if mod is not None else None
    include = list(mod.group_labels or ()) if mod is not None else []
    if card == pp.VectorMatchCardinality.ManyToOne:
        return lhs.add(include)
    if card == pp.VectorMatchCardinality.OneToMany:
        return rhs.add(include)
    if matching is None:
        return lhs
    if matching.type == pp.LabelModifierType.Include:
        return lhs.keep(list(matching.labels))
    return lhs.drop(list(matching.labels))


def check_keeps(expr: str, node_labels: Sequence[str], per: Sequence[str]) -> None:
    """Raise ``ValueError`` if ``expr`` (already checked by ``check_promql``) cannot carry
    any of ``node_labels`` or one of the ``per`` labels."""
    labels = result_labels(pp.parse(expr))
    if labels.scalar:
        raise ValueError("expected a PromQL expression that returns series labelled with "
                         "their node, got a scalar")
    if not any(labels.may_have(lb) for lb in node_labels):
        raise ValueError(f"expected a PromQL expression whose series keep the node label "
                         f"({' or '.join(node_labels)}; set nodeLabel if your series name "
                         f"the node by another label); this one drops it (aggregate by it)")
    missing = [lb for lb in per if not labels.may_have(lb)]
    if missing:
        raise ValueError(f"expected a PromQL expression whose series keep the per labels; "
                         f"it drops {', '.join(missing)}")
