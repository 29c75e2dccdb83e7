"""Slurm's view of the fleet for the guardrails: :class:`~healer.ports.SlurmStates` over any
driver that can list every node (issue 12: guardrails count what Slurm counts).

* scontrol: one ``scontrol show node -o`` per read; slurmrestd: one ``GET .../nodes``.
* Slurm names are mapped to Kubernetes nodes by ``hosts`` (Slurm name → Node name; on Slinky
  the slurmd pods', :meth:`healer.adapters.slinky.SlinkyPods.hosts`), or taken as the Node's
  name when there is no map (bare Slurm, DaemonSet-mode NodeSets).
* The Slinky driver implements ``node_states`` itself (:class:`healer.adapters.slinky.
  SlinkyDriver`); :func:`slurm_states` picks whichever a driver's handles
  (:class:`~healer.ports.SlurmHandles`) offer.

A read lists the whole fleet (Slurm 22.05's clients have no "changed since" query; slurmrestd's
``update_time`` would save bytes, not the runtime's work); the runtime feeds the core only the
nodes whose cause changed (:mod:`healer.runtime.slurm_feed`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from healer.ports import SlurmHandles, SlurmNodeState, SlurmStates

__all__ = ["NodeLister", "SlurmNodeFeed", "slurm_states"]

NodeLister = Callable[[], Awaitable[Sequence[SlurmNodeState]]]
Hosts = Callable[[], Awaitable[Mapping[str, str]]]


class SlurmNodeFeed:
    """:class:`~healer.ports.SlurmStates` from a node lister and a name map."""

    def __init__(self, lister: NodeLister, hosts: Hosts | None = None) -> None:
        self.lister = lister
        self.hosts = hosts

    async def node_states(self) -> Mapping[str, SlurmNodeState]:
        states = await self.lister()
        if self.hosts is None:
            return {s.name: s for s in states}
        hosts = await self.hosts()
        return {hosts[s.name]: s for s in states if s.name in hosts}


def slurm_states(handles: SlurmHandles, hosts: Hosts | None = None) -> SlurmStates | None:
    """The Slurm feed a driver's handles offer: its own ``node_states`` (Slinky), or its
    ``nodes`` listing (scontrol, slurmrestd) mapped through ``hosts``; None if neither."""
    if handles.states is not None:
        return handles.states
    if handles.lister is not None:
        return SlurmNodeFeed(handles.lister.nodes, hosts)
    return None
