"""Fuzz: dependencies that come and go (issue 22 item 9), generated.

Random sequences of reads over several NodeSets, each read failing or not per NodeSet (a
missing token Secret, an unreachable cluster, text with control characters): every read names
exactly the NodeSets that failed, with their clusters; the daemon's ``degraded`` entry says
the last reason while Slurm's view is lost and nothing once it is back; an Event is written
for each change of state or reason, and never for a read that changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healer.app_nodesets import NodeSetPorts, NodeSetWiring
from healer.core import rules as cp
from healer.core.nodesets import NodeSetRules, NodeSets
from healer.errors import HealerError, NotFoundError, TransientError
from healer.obs.http import Health
from healer.ports import SlurmNodeState
from healer.runtime.dependencies import SLURM_VIEW, Dependencies

FUZZ = settings(max_examples=200, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
NAMES = ("a", "b", "c")
ERRORS = [None, None, NotFoundError("read Secret slurm/token: not found"),
          TransientError("connect failure"), TransientError("evil\n\x1b[2J")]


class Reads:
    def __init__(self) -> None:
        self.error: HealerError | None = None

    async def node_states(self) -> Mapping[str, SlurmNodeState]:
        if self.error is not None:
            raise self.error
        return {}


@FUZZ
@given(rounds=st.lists(st.tuples(*(st.sampled_from(range(len(ERRORS))) for _ in NAMES)),
                       min_size=1, max_size=12))
def test_each_read_names_what_failed_and_events_follow_changes_only(
        rounds: list[tuple[int, ...]]) -> None:
    reads = {n: Reads() for n in NAMES}
    ps = cp.PolicySet((), nodesets=NodeSets(tuple(
        NodeSetRules(n, cp.LabelSelector({"p": n}), f"cluster-{n}") for n in NAMES)))
    ports = NodeSetPorts(lambda ns: NodeSetWiring(None, reads[ns.name], None),  # type: ignore[arg-type]
                         None, lambda: ps)  # type: ignore[arg-type]
    health = Health()
    events: list[tuple[str, str]] = []

    async def emit(reason: str, note: str, *, type: str = "Warning") -> None:
        events.append((reason, note))

    deps = Dependencies(health, emit)

    async def run() -> None:
        told: tuple[bool, str] | None = None
        changes = 0
        for combo in rounds:
            for n, i in zip(NAMES, combo, strict=True):
                reads[n].error = ERRORS[i]
            failing = [n for n, i in zip(NAMES, combo, strict=True) if ERRORS[i] is not None]
            try:
                await ports.node_states()
                why = ""
            except TransientError as e:
                why = str(e)
            assert [n for n in NAMES if f"SlurmNodeSet '{n}' (cluster cluster-{n})" in why] \
                == failing
            assert why.isprintable()
            assert {n for n, (_, err) in ports.readable.items() if err} == set(failing)
            now = (not why, why)
            if now != told and not (told is None and not why):
                changes += 1
            told = now
            await deps.slurm_view(not why, why)
            assert health.degraded.get(SLURM_VIEW, "") == why
        assert len(events) == changes, (events, rounds)

    asyncio.run(run())
