"""Events (``events.k8s.io/v1``) on Nodes and NodeRemediations: idempotent by key, and
repeats folded into one Event's ``series`` (count, last observed) on a back-off, the way
Kubernetes' own recorder does (:mod:`healer.adapters.kube.event_series`).

An Event's *key* names one occurrence (emitted twice, e.g. re-emitted after a restart, it is
written once). Its *series* key names what it says (by default: the node, reason, type, action,
remediation and note): a new occurrence of an open series updates that series' Event instead
of creating another. Updates that are not due yet are written by :meth:`KubeEvents.flush_series`
(the caller's loop calls it by :meth:`KubeEvents.next_series_due`).
"""

from __future__ import annotations

import hashlib
import socket
from collections import OrderedDict
from typing import Any, Protocol

from healer.adapters.clock import SYSTEM_CLOCK
from healer.adapters.kube.crd import GROUP, KIND, VERSION
from healer.adapters.kube.event_series import EventSeries, Series, SeriesPolicy, WriteBudget
from healer.adapters.kube.lite import LiteClient
from healer.core.text import printable
from healer.core.timefmt import rfc3339
from healer.core.vocabulary import EVENT_KEY_ANNOTATION, NODE_LABEL, REPORTING_CONTROLLER
from healer.errors import ConflictError, NotFoundError, PermanentError, TransientError
from healer.ports import Clock

NOTE_LIMIT = 1000
#: Keys of Events written recently, remembered to skip a second write (bounded).
RECENT_KEYS = 4096


def event_name(key: str) -> str:
    """A deterministic, DNS-safe name: the same key is the same Event (emitted once)."""
    return "healer." + hashlib.sha256(key.encode()).hexdigest()[:24]


def _micro(t: float) -> str:
    """A Kubernetes MicroTime."""
    return rfc3339(t, micros=True)


class BudgetSpent(TransientError):
    """The recorder's write budget allows no write now (the Event waits; nothing failed)."""


class EventWriter(Protocol):
    """How Events reach the API server (the daemon's client, or the agent's lean one)."""

    async def create(self, namespace: str, body: dict[str, Any], what: str) -> None:
        """POST the Event; ConflictError when one of that name exists."""
        ...

    async def patch(self, namespace: str, name: str, body: dict[str, Any], what: str) -> None:
        """Merge-patch the Event; NotFoundError when it is gone."""
        ...


class LiteEventWriter:
    """EventWriter over :class:`~healer.adapters.kube.lite.LiteClient` (the node agent)."""

    def __init__(self, client: LiteClient) -> None:
        self.client = client

    async def create(self, namespace: str, body: dict[str, Any], what: str) -> None:
        await self.client.request(
            "POST", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events", body, what=what)

    async def patch(self, namespace: str, name: str, body: dict[str, Any], what: str) -> None:
        await self.client.request(
            "PATCH", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events/{name}", body,
            content_type="application/merge-patch+json", what=what)


class KubeEvents:
    """The EventRecorder port. Events about Nodes (cluster-scoped) are written to ``default``:
    the API server accepts an Event about a cluster-scoped object in no other namespace."""

    namespace = "default"

    def __init__(self, writer: EventWriter, *, instance: str | None = None,
                 clock: Clock = SYSTEM_CLOCK, series: SeriesPolicy | None = None,
                 budget: WriteBudget | None = None) -> None:
        self.writer = writer
        #: bounds the writes (creates and updates) when given: a create over it raises
        #: TransientError (the caller keeps the Event queued), an update waits
        self.budget = budget
        self.instance = (instance or socket.gethostname())[:128]
        self._clock = clock
        self.series = EventSeries(series)
        self._recent: OrderedDict[str, None] = OrderedDict()
        #: API writes (creates and series updates) this recorder sent
        self.writes = 0

    async def emit(self, *, key: str, node: str, reason: str, note: str, type: str = "Normal",
                   action: str = "", remediation: str = "", series: str = "") -> None:
        """Write the Event for occurrence ``key`` (once), or count it in its open series."""
        if key in self._recent:
            return
        skey = series or "\0".join((node, reason, type, action, remediation, note))
        now = self._clock.now()
        self.series.expire(now)
        if self.budget is not None and self.series.open_series(skey) is None and \
                not self.budget.take(now):
            raise BudgetSpent(f"Event write budget spent (at most {self.budget.burst} at "
                                 f"once, then one every {self.budget.every:g}s)")
        occ = self.series.observe(skey, event_name(key), now)
        if not occ.create:
            self._remember(key)
            if occ.update is not None:
                await self._write_series(occ.update)
            return
        try:
            await self._create(key=key, node=node, reason=reason, note=note, type=type,
                               action=action, remediation=remediation)
        except BaseException:
            self.series.forget(skey)  # not written: the next occurrence creates it
            raise
        self._remember(key)

    def _remember(self, key: str) -> None:
        self._recent[key] = None
        if len(self._recent) > RECENT_KEYS:
            self._recent.popitem(last=False)

    def budget_wait(self) -> float:
        """Seconds until the write budget allows a write (0: it does, or there is none)."""
        return self.budget.next_in(self._clock.now()) if self.budget is not None else 0.0

    def next_series_due(self) -> float | None:
        """Seconds until a series update is due (None: none pending)."""
        now = self._clock.now()
        at = self.series.next_due(now)
        if at is None:
            return None
        wait = max(0.0, at - now)
        return max(wait, self.budget.next_in(now)) if self.budget is not None else wait

    async def flush_series(self) -> int:
        """Write the series updates that are due; returns how many were written."""
        n = 0
        for s in self.series.due(self._clock.now()):
            await self._write_series(s)
            n += 1
        return n

    async def _write_series(self, s: Series) -> None:
        if self.budget is not None and not self.budget.take(self._clock.now()):
            return  # stays due: written once the budget allows
        count = s.count
        body = {"series": {"count": count, "lastObservedTime": _micro(s.last_observed)}}
        try:
            self.writes += 1
            await self.writer.patch(self.namespace, s.name, body, f"patch event {s.name} series")
        except NotFoundError:
            self.series.forget(s.key)  # gone (an Event's TTL): the next occurrence creates
            return
        except PermanentError:
            self.series.forget(s.key)  # refused for good: never retried, never in the way
            raise
        self.series.written(s, count, self._clock.now())

    async def _create(self, *, key: str, node: str, reason: str, note: str, type: str,
                      action: str, remediation: str) -> None:
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
            self.writes += 1
            await self.writer.create(self.namespace, body, f"create event {reason} for {node}")
        except ConflictError:
            return  # already emitted: idempotent
