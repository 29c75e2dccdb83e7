"""Events (``events.k8s.io/v1``) on Nodes and NodeRemediations, idempotent by key."""

from __future__ import annotations

import hashlib
import socket
from typing import Any

from kubernetes_asyncio import client

from healer.adapters.clock import SYSTEM_CLOCK
from healer.adapters.kube.client import call
from healer.adapters.kube.crd import GROUP, KIND, VERSION
from healer.core.text import printable
from healer.core.timefmt import rfc3339
from healer.core.vocabulary import EVENT_KEY_ANNOTATION, NODE_LABEL, REPORTING_CONTROLLER
from healer.errors import ConflictError
from healer.ports import Clock

NOTE_LIMIT = 1000


def event_name(key: str) -> str:
    """A deterministic, DNS-safe name: the same key is the same Event (emitted once)."""
    return "healer." + hashlib.sha256(key.encode()).hexdigest()[:24]


def _micro(t: float) -> str:
    """A Kubernetes MicroTime."""
    return rfc3339(t, micros=True)


class KubeEvents:
    """The EventRecorder port. Events about Nodes (cluster-scoped) are written to ``default``:
    the API server accepts an Event about a cluster-scoped object in no other namespace."""

    namespace = "default"

    def __init__(self, api: client.ApiClient, *, instance: str | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.events = client.EventsV1Api(api)
        self.instance = (instance or socket.gethostname())[:128]
        self._clock = clock

    async def emit(self, *, key: str, node: str, reason: str, note: str, type: str = "Normal",
                   action: str = "", remediation: str = "") -> None:
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": event_name(key), "namespace": self.namespace,
                         "labels": {NODE_LABEL: node[:63]},
                         "annotations": {EVENT_KEY_ANNOTATION: key}},
            "eventTime": _micro(self._clock.now()),
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": self.instance,
            "action": printable((action or reason)[:128]),
            "reason": printable(reason[:128]),
            "note": printable(note, NOTE_LIMIT),  # another's text in it: no control chars
            "type": type,
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        if remediation:
            body["related"] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                               "name": remediation}
        try:
            await call(f"create event {reason} for {node}",
                       lambda: self.events.create_namespaced_event(
                           self.namespace, body))  # type: ignore[arg-type]
        except ConflictError:
            return  # already emitted: idempotent
