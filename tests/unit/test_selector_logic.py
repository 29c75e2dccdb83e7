"""core/selector_logic: satisfiable and implies, decided from the selectors, agree with brute
force over every labelling of the keys and values they mention (plus one value none of them
mentions, which stands for all the others)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healer.core.rules import LabelSelector
from healer.core.selector_logic import conflict, implies, satisfiable

KEYS = ("a", "b", "c")
VALUES = ("1", "2", "3")
OTHER = "other"

_values = st.frozensets(st.sampled_from(VALUES), min_size=1, max_size=3)
_expr = st.one_of(
    st.tuples(st.sampled_from(KEYS), st.sampled_from(("In", "NotIn")), _values),
    st.tuples(st.sampled_from(KEYS), st.sampled_from(("Exists", "DoesNotExist")),
              st.just(frozenset())))
selectors = st.builds(
    lambda labels, exprs: LabelSelector(dict(labels), tuple(exprs)),
    st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2),
    st.lists(_expr, max_size=4))


def _labellings() -> list[dict[str, str]]:
    states = (None, *VALUES, OTHER)
    return [{k: v for k, v in zip(KEYS, combo, strict=True) if v is not None}
            for combo in itertools.product(states, repeat=len(KEYS))]


LABELLINGS = _labellings()


@settings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(selectors, selectors)
def test_implies_and_satisfiable_agree_with_brute_force(a: LabelSelector,
                                                        b: LabelSelector) -> None:
    assert satisfiable(a) == any(a.matches(lb) for lb in LABELLINGS)
    assert implies(a, b) == all(b.matches(lb) for lb in LABELLINGS if a.matches(lb))
    assert (conflict(a) == "") == satisfiable(a)


@pytest.mark.parametrize(("a", "b", "expected"), [
    ({"pool": "a"}, {"pool": "a"}, True),
    ({"pool": "a", "gpu": "h100"}, {"pool": "a"}, True),
    ({"pool": "a"}, {"pool": "a", "gpu": "h100"}, False),
    ({"healer.io/role": "spare"}, {"healer.io/role": "spare"}, True),
    ({"example.com/nodeset": "h100"}, {"healer.io/role": "spare", "pool": "west"}, False),
])
def test_implies_on_match_labels(a: dict[str, str], b: dict[str, str], expected: bool) -> None:
    assert implies(LabelSelector(a), LabelSelector(b)) is expected


def test_the_conflicting_key_is_named() -> None:
    sel = LabelSelector({"pool": "a"}, (("pool", "In", frozenset({"b"})),))
    assert conflict(sel) == "pool"
    assert not satisfiable(LabelSelector({}, (("x", "Exists", frozenset()),
                                              ("x", "DoesNotExist", frozenset()))))
    assert satisfiable(LabelSelector({}, (("x", "DoesNotExist", frozenset()),
                                          ("x", "NotIn", frozenset({"1"})))))
