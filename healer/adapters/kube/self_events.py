"""Events about healer itself (``events.k8s.io/v1``): a failed policy reload and the like.

They regard healer's own Pod (``$POD_NAME``, set by the Deployment) in healer's namespace, so
``kubectl describe pod`` and ``kubectl get events -n healer-system`` show them; outside a pod
(a developer's machine, the tests) they regard the leader-election Lease, the object every
healer replica of one installation shares. healer's Role already allows Events there.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from healer.adapters.clock import SYSTEM_CLOCK
from healer.adapters.kube.client import call
from healer.adapters.kube.events import NOTE_LIMIT, _micro, event_name
from healer.core.vocabulary import REPORTING_CONTROLLER
from healer.errors import ConflictError
from healer.ports import Clock


class SelfEvents:
    def __init__(self, api: client.ApiClient, *, namespace: str, instance: str,
                 pod: str = "", lease: str = "healer-leader",
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.events = client.EventsV1Api(api)
        self.namespace, self.instance = namespace, instance[:128]
        self.regarding = ({"apiVersion": "v1", "kind": "Pod", "name": pod,
                           "namespace": namespace} if pod else
                          {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                           "name": lease, "namespace": namespace})
        self._clock = clock

    async def emit(self, reason: str, note: str, *, type: str = "Warning") -> None:
        """One Event; the same (reason, note) at the same second is written once."""
        now = self._clock.now()
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": event_name(f"{self.instance}/{reason}/{note}/{int(now)}"),
                         "namespace": self.namespace},
            "eventTime": _micro(now),
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": self.instance,
            "action": reason[:128],
            "reason": reason[:128],
            "note": note[:NOTE_LIMIT],
            "type": type,
            "regarding": self.regarding,
        }
        try:
            await call(f"create event {reason}",
                       lambda: self.events.create_namespaced_event(
                           self.namespace, body))  # type: ignore[arg-type]
        except ConflictError:
            return
