"""The optimistic world a backtest replays against: :class:`BacktestWorld`, a
:class:`~healer.sim.world.SimWorld` with no jobs (every drain completes at once), a spare pool
that may be unlimited (a new spare is made in the failed node's NVLink domain when none is
free there), and repair results after a fixed delay or never. It also counts what the report
needs from the world: actions executed and every spare taken from or given back to the pool."""

from __future__ import annotations

from collections.abc import Mapping

from healer.core import actions as a
from healer.core.machine import Trigger, TriggerKind
from healer.core.model import StepOutcome, Taint
from healer.core.topology import DOMAIN_LABEL, TIER_PREFIX
from healer.core.vocabulary import ROLE_LABEL, SPARE_ROLE, SPARE_TAINT, TAINT_EFFECT, TAINT_VALUE
from healer.sim.world import (
    Latencies,
    Result,
    SimNode,
    SimSlurmNode,
    SimWorld,
)

#: Prefix of the simulated spares' names.
SPARE_PREFIX = "backtest-spare-"


class BacktestWorld(SimWorld):
    """:class:`SimWorld` with no jobs, a spare pool that may be unlimited, and repair results
    after a fixed delay (or never)."""

    def __init__(self, nodes: list[SimNode], *, latencies: Latencies, spares: int | None,
                 spare_labels: Mapping[str, str], repair_after: float | None) -> None:
        self.spare_labels = {**spare_labels, ROLE_LABEL: SPARE_ROLE}
        pool = [self._spare(i + 1, {}) for i in range(spares or 0)]
        super().__init__([*nodes, *pool], [], latencies)
        self.unlimited = spares is None
        self.repair_after = repair_after
        self._made = len(pool)
        self._repairs: set[str] = set()
        self.changes = 0  # actions executed (a node view may have changed)
        #: (at, +1 claimed / -1 back in the pool, incident) for the spares-needed count
        self.pool_changes: list[tuple[float, int, str]] = []

    def add_node(self, node: SimNode) -> None:
        """A node joins the fleet (with its Slurm node, named like it)."""
        self.nodes[node.name] = node
        self.slurm[node.name] = SimSlurmNode(node.name, node.name)
        self.touch(node.name)
        self.changes += 1

    def _spare(self, n: int, like: Mapping[str, str]) -> SimNode:
        labels = dict(self.spare_labels)
        labels.update({k: v for k, v in like.items()
                       if k == DOMAIN_LABEL or k.startswith(TIER_PREFIX)})
        return SimNode(f"{SPARE_PREFIX}{n:03d}", labels, spare=True,
                       taints=[Taint(SPARE_TAINT, TAINT_VALUE, TAINT_EFFECT)])

    def _do_ClaimSpare(self, act: a.ClaimSpare, now: float) -> Result:
        claimed = self.nodes.get(self._claims.get(act.incident, ""))
        mine = claimed is not None and claimed.claimed_by == act.incident
        if self.unlimited and not mine:
            bad = self.nodes[act.node]
            dom = bad.labels.get(DOMAIN_LABEL)
            free = self.free_spares(act.node)
            if not free or (dom and all(n.labels.get(DOMAIN_LABEL) != dom for n in free)):
                self._made += 1
                spare = self._spare(self._made, bad.labels)
                self.nodes[spare.name] = spare
                self.touch(spare.name)
        res = super()._do_ClaimSpare(act, now)
        if not mine and res[0] is StepOutcome.DONE:
            self.pool_changes.append((now, 1, act.incident))
        return res

    def _do_ReleaseSpare(self, act: a.ReleaseSpare, now: float) -> Result:
        n = self.nodes.get(act.spare)
        if n is not None and n.claimed_by == act.incident and n.spare:
            self.pool_changes.append((now, -1, act.incident))
        return super()._do_ReleaseSpare(act, now)

    def _do_ReturnToPool(self, act: a.ReturnToPool, now: float) -> Result:
        if not self.nodes[act.node].spare:
            self.pool_changes.append((now, -1, act.incident))
        return super()._do_ReturnToPool(act, now)

    def execute(self, action: a.Action, now: float) -> list[tuple[float, Trigger]]:
        self.changes += 1
        out = super().execute(action, now)
        if (isinstance(action, a.MarkRepair) and self.repair_after is not None
                and action.incident not in self._repairs):
            self._repairs.add(action.incident)
            t = now + self.repair_after
            out.append((t, Trigger(TriggerKind.REPAIR, action.node, t, incident=action.incident,
                                   repair_passed=True)))
        return out
