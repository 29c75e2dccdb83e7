"""The transition table as a whole: complete, terminating, acyclic where it must be."""

from __future__ import annotations

from collections import defaultdict, deque

from healer.core.machine import ALWAYS, IGNORED, TRANSITIONS, TriggerKind
from healer.core.phases import TERMINAL, Phase


def _edges() -> dict[Phase, set[Phase]]:
    g: dict[Phase, set[Phase]] = defaultdict(set)
    for t in TRANSITIONS:
        if t.target is not None and t.target is not t.source:
            g[t.source].add(t.target)
    return g


def test_every_phase_trigger_pair_is_handled_or_explicitly_ignored() -> None:
    handled = {(t.source, t.trigger) for t in TRANSITIONS}
    for phase in Phase:
        for kind in TriggerKind:
            pair = (phase, kind)
            assert (pair in handled) != (pair in IGNORED), pair
            if pair in IGNORED:
                assert IGNORED[pair].strip(), f"{pair} is ignored without a reason"


def test_handled_external_triggers_end_with_an_unconditional_row() -> None:
    last: dict[tuple[Phase, TriggerKind], object] = {}
    for t in TRANSITIONS:
        last[(t.source, t.trigger)] = t.guard
    for (phase, kind), guard in last.items():
        if kind is TriggerKind.AUTO:
            continue  # an automatic continuation may legitimately not apply
        assert guard is ALWAYS, f"{phase.value}/{kind.value} can fall through every row"


def test_every_phase_can_reach_done_escalated_or_cancelled() -> None:
    g = _edges()
    for start in Phase:
        seen, todo = {start}, deque([start])
        while todo:
            for nxt in g[todo.popleft()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        if start is Phase.HEALTHY:
            continue  # healthy is the resting state; it reaches the others via a verdict
        assert seen & TERMINAL, f"{start.value} cannot finish"


def test_every_phase_is_reachable_from_healthy() -> None:
    g = _edges()
    seen, todo = {Phase.HEALTHY}, deque([Phase.HEALTHY])
    while todo:
        for nxt in g[todo.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(Phase)


def test_terminal_phases_have_no_outgoing_transitions() -> None:
    for t in TRANSITIONS:
        if t.source in TERMINAL:
            assert t.target is None, t


def test_auto_rows_have_no_cycle() -> None:
    g: dict[Phase, set[Phase]] = defaultdict(set)
    for t in TRANSITIONS:
        if t.trigger is TriggerKind.AUTO and t.target is not None:
            g[t.source].add(t.target)
    state: dict[Phase, int] = {}

    def visit(p: Phase) -> None:
        state[p] = 1
        for n in g[p]:
            assert state.get(n) != 1, f"AUTO cycle through {n.value}"
            if n not in state:
                visit(n)
        state[p] = 2

    for p in list(g):
        if p not in state:
            visit(p)


def test_swapping_is_entered_only_before_any_swap() -> None:
    sources = {t.source for t in TRANSITIONS if t.target is Phase.SWAPPING}
    assert sources == {Phase.CORDONED, Phase.HELD_FOR_CAPACITY}
    # and neither of those is reachable once a swap happened
    after = {Phase.SWAPPING, Phase.ANNOTATING, Phase.VALIDATING, Phase.UNDRAINING, Phase.REPAIR}
    back = {t for t in TRANSITIONS if t.source in after and t.target in sources}
    assert not back
