"""The spare-validation loop: warm spares stay healthy while they wait.

Every :data:`SPARE_VALIDATION_EVERY` seconds, while leading, while the fleet's
``spareValidation`` is on and while some policy acts (``mode: act``: validating runs Jobs on
spares and changes their labels, which neither ``observe`` nor ``dryRun`` — nor ``--dry-run``,
which caps every policy there — may do), one label-selected read per spare selector (the
fleet's and each NodeSet's; cost follows the number of spares, never the fleet) and one
``SpareValidator.periodic_round``: runs in progress advanced, due idle spares started (at most
``maxParallel`` runs at once), a repaired failed spare returned to the pool. The loop beats
its own ``/healthz`` heartbeat (``spare-validation``).

The composition root (:mod:`healer.app`) builds the one validator and hands it to this loop and
to every spare pool (the fleet's and each NodeSet's), so a claim validates through the same
object as the loop (one lock per spare, one run).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import structlog

from healer.adapters.spare_validation import SpareValidator
from healer.core.model import NodeView
from healer.core.modes import Mode
from healer.core.rules import PolicySet
from healer.errors import HealerError
from healer.obs.http import Health
from healer.ports import Clock, NodeAPI
from healer.runtime.controller import Controller
from healer.runtime.executor import Ports
from healer.runtime.loops import LOOP_SLACK

log = structlog.get_logger("healer.spare_validation")

#: How often the spare pool is looked at (a run's Jobs are read, due spares started).
SPARE_VALIDATION_EVERY = 30.0


def spare_validation(health: Health, validator: SpareValidator, ports: Ports,
                     ctl: Controller, clock: Clock) -> Coroutine[Any, Any, None]:
    """The loop over every warm spare (the fleet's and each NodeSet's selector)."""
    async def spares() -> Sequence[NodeView]:
        return await spare_nodes(ports.nodes, ctl.policies)

    def acting() -> bool:
        return ctl.leading and any(p.mode is Mode.ACT for p in ctl.policies.policies)

    return validate_spares(health, validator, spares, acting, clock)


async def spare_nodes(nodes: NodeAPI, policies: PolicySet) -> list[NodeView]:
    """Every warm spare: of the fleet's spare selector and of each NodeSet's own, one
    label-selected read per distinct selector (a selector without matchLabels picks none)."""
    found: dict[str, NodeView] = {}
    for query in dict.fromkeys(s.to_query() for s in policies.spare_selectors
                               if s.match_labels):
        for v in await nodes.list(query):
            found.setdefault(v.name, v)
    return sorted(found.values(), key=lambda v: v.name)


async def validate_spares(health: Health, validator: SpareValidator,
                          spares: Callable[[], Awaitable[Sequence[NodeView]]],
                          acting: Callable[[], bool], clock: Clock,
                          every: float = SPARE_VALIDATION_EVERY) -> None:
    """The loop: a round every ``every`` seconds while ``acting()`` (leading, and some policy
    acts) and validation is on; a failed round is logged once, its recovery once."""
    failing = False
    while True:
        health.beat("spare-validation", every + LOOP_SLACK)
        if acting() and validator.enabled:
            try:
                plan = await validator.periodic_round(await spares())
                if plan.start:
                    log.info("validating idle spares", spares=list(plan.start),
                             in_progress=list(plan.poll))
                if failing:
                    log.info("spare validation recovered")
                failing = False
            except HealerError as e:
                if not failing:  # an outage is logged once, its recovery once
                    log.warning("spare validation round failed", error=str(e))
                failing = True
        await clock.sleep(every)
