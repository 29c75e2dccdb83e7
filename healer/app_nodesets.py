"""The composition root's part for several NodeSets (``kind: SlurmNodeSet``, issue 14 item 4).

Each NodeSet gets its own ports — its Slurm cluster's driver, its warm spares (selector,
tolerations, topology labels), its slurmd pods' workload and topology step — built by the same
builders as the one NodeSet of the command line (:func:`healer.app._ports`), the first time one
of its nodes needs them and again when a policy reload changes the NodeSet (the old ports'
connections close at shutdown). :meth:`NodeSetPorts.route` is the executor's route: a node's
NodeSet's ports, or the command line's for a node in no NodeSet. :meth:`NodeSetPorts.
node_states` is the Slurm feed over every NodeSet's cluster at once: one listing per cluster
per read; if any cannot be read, Slurm's view is unknown (the guardrails that count Slurm say
no).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from healer.core.model import NodeView
from healer.core.nodesets import NodeSetRules
from healer.core.rules import PolicySet
from healer.core.text import printable
from healer.errors import HealerError, TransientError
from healer.ports import SlurmDriver, SlurmNodeState, SlurmStates
from healer.runtime.executor import Ports

__all__ = ["COMMAND_LINE", "NodeSetPorts", "NodeSetWiring"]

#: How the metrics name the command line's NodeSet and cluster (no SlurmNodeSet documents).
COMMAND_LINE = "(command line)"

log = structlog.get_logger("healer.app")


@dataclass(frozen=True, slots=True)
class NodeSetWiring:
    """What one NodeSet acts and reads through."""

    ports: Ports
    states: SlurmStates | None  # its Slurm cluster's node states (None: cannot list)
    driver: SlurmDriver  # to close at shutdown


class NodeSetPorts:
    """Each NodeSet's ports, built on first need (see the module docstring)."""

    def __init__(self, build: Callable[[NodeSetRules], NodeSetWiring], default: Ports,
                 policies: Callable[[], PolicySet],
                 default_states: SlurmStates | None = None, *,
                 nodes: Callable[[], Mapping[str, NodeView]] = dict) -> None:
        self.build = build
        self.default = default
        self.policies = policies
        self.default_states = default_states
        #: the nodes as the controller's engine last saw them (their labels pick the NodeSet)
        self.nodes = nodes
        self._built: dict[str, tuple[NodeSetRules, NodeSetWiring]] = {}
        self._retired: list[NodeSetWiring] = []
        #: per NodeSet (COMMAND_LINE without documents), its cluster and why its last read
        #: failed ("": it was read)
        self.readable: dict[str, tuple[str, str]] = {}

    def wiring(self, ns: NodeSetRules) -> NodeSetWiring:
        have = self._built.get(ns.name)
        if have is not None and have[0] == ns:
            return have[1]
        wiring = self.build(ns)
        if have is not None:
            self._retired.append(have[1])
            log.info("NodeSet changed: its ports are rebuilt", nodeset=ns.name)
        self._built[ns.name] = (ns, wiring)
        return wiring

    def nodeset_of(self, node: str) -> NodeSetRules | None:
        ps = self.policies()
        if not ps.nodesets:
            return None
        view = self.nodes().get(node)
        return ps.nodesets.of(view.labels) if view is not None else None

    def route(self, node: str) -> Ports:
        """The ports that act on ``node``: its NodeSet's, else the command line's."""
        ns = self.nodeset_of(node)
        return self.wiring(ns).ports if ns is not None else self.default

    def prepare(self) -> None:
        """Build every NodeSet's ports now (at start: a bad endpoint is found before the
        first incident needs it)."""
        for ns in self.policies().nodesets.items:
            self.wiring(ns)

    async def node_states(self) -> dict[str, SlurmNodeState]:
        """Every cluster's node states, by Kubernetes node: the NodeSets' clusters when there
        are NodeSets (the command line's Slurm is then only the fallback for actions on a node
        in none), else the command line's. Every NodeSet is read; if any cannot be, one
        TransientError names each that failed and why (:attr:`readable` keeps it per NodeSet
        for the metrics)."""
        nodesets = self.policies().nodesets
        if not nodesets:
            if self.default_states is None:
                self.readable = {}
                return {}
            try:
                got = dict(await self.default_states.node_states())
            except HealerError as e:
                self.readable = {COMMAND_LINE: (COMMAND_LINE, printable(str(e), 300))}
                raise
            self.readable = {COMMAND_LINE: (COMMAND_LINE, "")}
            return got
        out: dict[str, SlurmNodeState] = {}
        readable: dict[str, tuple[str, str]] = {}
        for ns in nodesets.items:
            states = self.wiring(ns).states
            if states is None:
                continue
            try:
                out.update(await states.node_states())
            except HealerError as e:  # e.g. its slurmrestd token Secret does not exist
                readable[ns.name] = (ns.cluster, printable(str(e), 300))
            else:
                readable[ns.name] = (ns.cluster, "")
        self.readable = readable
        failed = [f"SlurmNodeSet {name!r} (cluster {cluster}): {error}"
                  for name, (cluster, error) in sorted(readable.items()) if error]
        if failed:
            raise TransientError("; ".join(failed))
        return out

    async def close(self) -> None:
        """Close every NodeSet's Slurm connections (built here; idempotent drivers)."""
        for wiring in [*(w for _, w in self._built.values()), *self._retired]:
            await wiring.driver.close()
        self._built.clear()
        self._retired.clear()
