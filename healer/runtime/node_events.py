"""The node-events source: the Kubernetes Node watch, turned into the controller's input.

Every watch event becomes a :class:`~healer.core.node_events.NodeChange` through the one pure
function :func:`healer.core.node_events.node_change` (the node's condition signals and the
triggers an admin caused); the controller only caches the node, ingests the signals and queues
the triggers. The watch's own heartbeat (``node-watch``) and the ``nodes-synced`` readiness
are this loop's: a watch that stops coming round makes ``/healthz`` fail.
"""

from __future__ import annotations

from healer.core.node_events import node_change
from healer.obs.http import Health
from healer.ports import NodeAPI, NodeEvent
from healer.runtime.controller import Controller

#: The node watch re-lists or bookmarks at least this often; longer without an event makes
#: ``/healthz`` fail.
WATCH_MAX_AGE = 600.0


class NodeEvents:
    """Feeds the controller from ``nodes.watch()`` (see the module doc)."""

    def __init__(self, nodes: NodeAPI, controller: Controller,
                 health: Health | None = None) -> None:
        self.nodes = nodes
        self.controller = controller
        self.health = health

    async def run(self) -> None:
        """Watch the Nodes until cancelled (the watch itself re-lists after a 410)."""
        self._beat()
        async for ev in self.nodes.watch():
            self._beat()
            if ev.type == "SYNCED" and self.health is not None:
                self.health.set_ready("nodes-synced", True)
            await self.deliver(ev)

    async def deliver(self, ev: NodeEvent) -> None:
        """One watch event → the controller (SYNCED and events without a node carry nothing)."""
        if ev.type == "SYNCED" or ev.node is None:
            return
        ctl = self.controller
        old = ctl.nodes.get(ev.node.name)
        record = ctl.engine.records.get(ev.node.name)
        if ev.type == "DELETED":
            await ctl.on_node_change(node_change(old or ev.node, None, ctl.clock.now(),
                                                 record=record))
            return
        await ctl.on_node_change(node_change(
            old, ev.node, ctl.clock.now(), record=record, is_spare=ctl.policies.is_spare))

    def _beat(self) -> None:
        if self.health is not None:
            self.health.beat("node-watch", WATCH_MAX_AGE)
