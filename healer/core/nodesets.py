"""Several NodeSets, several Slurm clusters: what one ``kind: SlurmNodeSet`` document says. Pure.

One healer deployment may remediate the GPU nodes of several NodeSets (Slinky NodeSets, or
groups of bare-Slurm nodes), of one or several Slurm clusters. Each :class:`NodeSetRules` names
its nodes (a label selector), the Slurm cluster that runs them and how healer reaches it, and
what is its own: the spares that may replace its nodes (their selector, and the tolerations its
slurmd pods have: a spare with a taint they do not tolerate can never host one), the
topology labels its placement reads, and guardrails over its nodes alone (on top of each
policy's and the fleet's).

A node belongs to at most one NodeSet: the first, by name, whose selector matches it
(:meth:`NodeSets.of`). Without any ``SlurmNodeSet`` document the deployment serves the one
NodeSet its command line names, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from healer.core.limits import Guardrails
from healer.core.selector import LabelSelector
from healer.core.slurm_drivers import SlurmDriverKind
from healer.core.topology import TOPOGRAPH, TopologyKeys

__all__ = ["NodeSetRules", "NodeSets", "SlurmEndpoint", "Toleration", "TolerationOperator",
           "TopologyKeys", "untolerated"]


class TolerationOperator(Enum):
    EQUAL = "Equal"
    EXISTS = "Exists"


@dataclass(frozen=True, slots=True)
class Toleration:
    """A Kubernetes toleration (``key`` empty with Exists: every taint)."""

    key: str = ""
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str = ""
    effect: str = ""  # NoSchedule, PreferNoSchedule, NoExecute; "" = every effect

    def tolerates(self, key: str, value: str, effect: str) -> bool:
        if self.effect and self.effect != effect:
            return False
        if not self.key:
            return self.operator is TolerationOperator.EXISTS
        if self.key != key:
            return False
        return self.operator is TolerationOperator.EXISTS or self.value == value


def untolerated(taints: Iterable[tuple[str, str, str]], tolerations: Sequence[Toleration],
                ignore: frozenset[str] = frozenset()) -> list[str]:
    """The taints ``(key, value, effect)`` that keep a pod with ``tolerations`` off a node
    (``key:effect``), leaving out the keys in ``ignore`` (healer's own spare taint, which healer
    takes off when it opens a spare). PreferNoSchedule keeps no pod off."""
    return [f"{k}:{e}" for k, v, e in taints
            if k not in ignore and e in ("NoSchedule", "NoExecute")
            and not any(t.tolerates(k, v, e) for t in tolerations)]


@dataclass(frozen=True, slots=True)
class SlurmEndpoint:
    """How healer reaches one Slurm cluster."""

    driver: SlurmDriverKind = SlurmDriverKind.SLINKY
    slurmrestd_url: str = ""
    token_secret: str = ""  # NAMESPACE/NAME[:KEY]
    slurm_conf: str = ""


@dataclass(frozen=True, slots=True)
class NodeSetRules:
    """One ``kind: SlurmNodeSet`` document, compiled."""

    name: str
    selector: LabelSelector
    cluster: str
    slurm: SlurmEndpoint = SlurmEndpoint()
    namespace: str = "slurm"  # the Slinky NodeSet's namespace
    nodeset: str = ""  # the Slinky NodeSet's name ("" for bare Slurm)
    spare_selector: LabelSelector | None = None  # None: the fleet's
    tolerations: tuple[Toleration, ...] | None = None  # None: not said, spares not filtered
    topology: TopologyKeys = TOPOGRAPH
    guardrails: Guardrails = field(default_factory=Guardrails)
    source: str = ""

    @property
    def scope(self) -> str:
        """How metrics and ``/debug/state`` name this NodeSet's guardrail scope (a policy
        name cannot contain the colon)."""
        return f"nodeset:{self.name}"


@dataclass(frozen=True, slots=True)
class NodeSets:
    """Every NodeSet of the deployment, sorted by name."""

    items: tuple[NodeSetRules, ...] = ()

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.items, key=lambda n: n.name))
        if ordered != self.items:
            object.__setattr__(self, "items", ordered)

    def clusters(self) -> dict[str, SlurmEndpoint]:
        """Each Slurm cluster's endpoint (the compiler checks that they agree)."""
        return {n.cluster: n.slurm for n in self.items}

    def of(self, labels: Mapping[str, str]) -> NodeSetRules | None:
        """The NodeSet a node with ``labels`` belongs to: the first by name that selects it."""
        for n in self.items:
            if n.selector.matches(labels):
                return n
        return None

    def get(self, name: str) -> NodeSetRules | None:
        for n in self.items:
            if n.name == name:
                return n
        return None

    def __bool__(self) -> bool:
        return bool(self.items)
