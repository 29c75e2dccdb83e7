"""Nodes: read, watch (re-list on 410, bookmarks), cordon/uncordon with provenance, labels.

A Node is read as hostile input (anyone who may patch its status writes its conditions): at
most :data:`MAX_CONDITION_TYPES` conditions are kept per read, messages and reasons are cut,
and each condition carries the field manager that wrote its message (``managedFields``), which
is how the core knows a GPU identity block is the agent's own.

Every write is a JSON merge patch carrying the ``resourceVersion`` it was computed from, so a
concurrent writer makes it fail with 409 and it is recomputed from a fresh read: healer never
overwrites a field it did not mean to change and never uncordons a node someone else cordoned.
While the watch runs, a write is first computed from what it last saw (:attr:`KubeNodes.cache`,
:mod:`healer.adapters.kube.node_cache`) instead of a read; a write the cache says is not needed
is confirmed by a read first.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from healer.adapters.clock import SYSTEM_CLOCK
from healer.adapters.kube.client import call, to_dict, translate
from healer.adapters.kube.client import plain_json as _json
from healer.adapters.kube.node_cache import NodeCache
from healer.adapters.retry import Backoff
from healer.core.model import NodeCondition, NodeView, Taint
from healer.core.timefmt import parse_rfc3339, rfc3339
from healer.core.vocabulary import (
    CORDONED_AT,
    CORDONED_BY,
    CORDONED_BY_HEALER,
    GPU_CONDITION,
    INCIDENT_ANNOTATION,
    OUT_OF_SERVICE_BY,
    OUT_OF_SERVICE_EFFECT,
    OUT_OF_SERVICE_TAINT,
    OUT_OF_SERVICE_VALUE,
    REASON_ANNOTATION,
    REMEDIATION_TAINT,
    TAINT_EFFECT,
    TAINT_VALUE,
)
from healer.errors import TransientError
from healer.ports import Clock, NodeEvent


def _ts(value: Any) -> float:
    """An API timestamp → seconds since the epoch (0 when absent or unreadable)."""
    return parse_rfc3339(value) or 0.0


#: At most this many condition types are read per Node (the first of each type; Ready and
#: healer's GPUHealthy wherever they are): a Node carrying thousands of conditions costs one
#: look at each one's type and at most this many parsed conditions per read.
MAX_CONDITION_TYPES = 32
#: A condition's message is read up to this many characters (its end kept: the agent's GPU
#: identity block is last); its reason up to REASON_CHARS.
MESSAGE_CHARS = 8192
REASON_CHARS = 1024
#: managedFields entries looked at per Node (the API server keeps about ten update managers).
MAX_MANAGERS = 64
_CONDITION_TYPE = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_./]{0,315}")
_ALWAYS = ("Ready", GPU_CONDITION)


def _message_writers(meta: Mapping[str, Any]) -> dict[str, str]:
    """Condition type → the field manager that owns its ``message`` (managedFields); ""
    when more than one manager claims it (a shared server-side apply)."""
    out: dict[str, str] = {}
    entries = meta.get("managedFields")
    if not isinstance(entries, list):
        return out
    for entry in entries[:MAX_MANAGERS]:
        if not isinstance(entry, Mapping):
            continue
        fields = entry.get("fieldsV1")
        status = fields.get("f:status") if isinstance(fields, Mapping) else None
        conds = status.get("f:conditions") if isinstance(status, Mapping) else None
        if not isinstance(conds, Mapping):
            continue
        manager = str(entry.get("manager") or "")
        for key, owned in list(conds.items())[:MAX_CONDITION_TYPES * 4]:
            if not (isinstance(key, str) and key.startswith("k:{") and len(key) <= 400
                    and isinstance(owned, Mapping) and "f:message" in owned):
                continue
            try:
                ctype = json.loads(key[2:]).get("type")
            except (ValueError, AttributeError):
                continue
            if isinstance(ctype, str):
                out[ctype] = manager if out.get(ctype, manager) == manager else ""
    return out


def _conditions(raw: Any, writers: Mapping[str, str]) -> tuple[NodeCondition, ...]:
    """At most :data:`MAX_CONDITION_TYPES` conditions, the first of each type (a second
    GPUHealthy too: the core must see a conflicting one), types a rule could name."""
    if not isinstance(raw, list):
        return ()
    picked: list[Mapping[str, Any]] = []
    seen: dict[str, int] = {}
    for c in raw:
        ctype = c.get("type") if isinstance(c, Mapping) else None
        if not isinstance(ctype, str) or _CONDITION_TYPE.fullmatch(ctype) is None:
            continue
        n = seen.get(ctype, 0)
        if n >= (2 if ctype == GPU_CONDITION else 1):
            continue
        if len(seen) >= MAX_CONDITION_TYPES and ctype not in _ALWAYS:
            continue
        seen[ctype] = n + 1
        picked.append(c)
    out = []
    for c in picked:
        message = str(c.get("message") or "")
        if len(message) > MESSAGE_CHARS:
            message = "…" + message[-(MESSAGE_CHARS - 1):]
        ctype = str(c["type"])
        out.append(NodeCondition(ctype, str(c.get("status", ""))[:16],
                                 str(c.get("reason") or "")[:REASON_CHARS], message,
                                 _ts(c.get("lastTransitionTime")),
                                 _ts(c.get("lastHeartbeatTime")), writers.get(ctype, "")))
    return tuple(out)


def node_view(obj: Mapping[str, Any]) -> NodeView:
    """A plain Node dict (as the API serves it) → the core's NodeView (conditions bounded,
    each with the field manager that wrote its message)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    taints = tuple(Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
                   for t in spec.get("taints") or [])
    conds = _conditions(status.get("conditions"), _message_writers(meta))
    return NodeView(str(meta.get("name", "")), dict(meta.get("labels") or {}),
                    dict(meta.get("annotations") or {}), bool(spec.get("unschedulable")),
                    taints, conds)


#: Nodes per page of the watch's (re-)list, as client-go's informers page.
LIST_PAGE = 500


def _raw(obj: Any, api: client.ApiClient) -> dict[str, Any]:
    return to_dict(api, obj)


class _PlainWatch(watch.Watch):
    """A watch that hands over the API's JSON as is: no round trip through the client's
    model classes per event (at fleet scale that decode is the watch's main cost)."""

    def get_return_type(self, func: object) -> str:
        return ""  # no model type: events keep the decoded JSON


class KubeNodes:
    """The NodeAPI port on a real API server."""

    def __init__(self, api: client.ApiClient, *, watch_timeout: int = 300,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self._watching = False
        self.watch_timeout = watch_timeout
        self._clock = clock
        #: resourceVersion of every node last seen (for optimistic concurrency)
        self.versions: dict[str, str] = {}
        #: what the watch (and healer's own writes) last saw of every node
        self.cache = NodeCache()
        #: reads a write did not need, thanks to the cache (for the bench and /debug)
        self.reads_saved = 0

    # -- reads -------------------------------------------------------------------------------

    async def get_raw(self, name: str) -> dict[str, Any]:
        raw = await call(f"get node {name}", lambda: _json(
            lambda **kw: self.core.read_node(name, **kw)))
        self._seen(raw)
        return raw

    def _seen(self, raw: dict[str, Any], view: NodeView | None = None) -> NodeView:
        """Remember what the API said of a node (its version; the cache while a watch runs)."""
        rv = str(raw["metadata"].get("resourceVersion", ""))
        view = view or node_view(raw)
        self.versions[view.name] = rv
        if self.cache.synced or self._watching:
            self.cache.put(view, rv, (raw.get("spec") or {}).get("taints") or [])
        return view

    def cached(self, name: str) -> NodeView | None:
        """The node as the watch last saw it (None: not watched, or unknown)."""
        c = self.cache.get(name) if self.cache.synced else None
        return c.view if c is not None else None

    async def view(self, name: str) -> NodeView:
        """The node from the cache when the watch has it, else read."""
        return self.cached(name) or await self.get(name)

    async def get(self, name: str) -> NodeView:
        return node_view(await self.get_raw(name))

    async def list_raw(self, selector: str = "") -> tuple[list[dict[str, Any]], str]:
        raw = await call("list nodes", lambda: _json(
            lambda **kw: self.core.list_node(label_selector=selector, **kw)))
        return list(raw.get("items") or []), str((raw.get("metadata") or {}).get(
            "resourceVersion", ""))

    async def list_pages(self, limit: int = LIST_PAGE
                         ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        """Every node, ``limit`` at a time (the API server's ``continue``): the last page
        carries the list's resourceVersion. A 10,000-node list in one answer is a peak of
        decoded JSON that the process keeps as RSS long after; pages bound it."""
        token = ""
        while True:
            page: dict[str, Any] = {"limit": limit}
            if token:
                page["_continue"] = token
            raw = await call("list nodes", lambda page=page: _json(  # type: ignore[misc]
                lambda **kw: self.core.list_node(**page, **kw)))
            meta = raw.get("metadata") or {}
            token = str(meta.get("continue") or "")
            yield list(raw.get("items") or []), "" if token else str(
                meta.get("resourceVersion", ""))
            if not token:
                return

    async def list(self, selector: str = "") -> list[NodeView]:
        items, _ = await self.list_raw(selector)
        return [node_view(i) for i in items]

    async def watch(self, resource_version: str = "") -> AsyncIterator[NodeEvent]:
        """List, then watch from the list's resourceVersion; forever.

        A ``SYNCED`` event carrying no node follows every (re-)list: the consumer reconciles
        its cache against the list that precedes it. 410 Gone (the resourceVersion was
        compacted away) means re-list; connection loss means watch again from the last
        resourceVersion seen (bookmarks keep it fresh). Given ``resource_version``, the first
        list is skipped and the watch resumes from there.
        """
        rv = resource_version
        backoff = Backoff(0.2, 5.0, clock=self._clock)
        self._watching = True
        while True:
            if not rv:
                names: set[str] = set()
                try:
                    async for items, page_rv in self.list_pages():
                        for item in items:
                            view = self._seen(item)
                            names.add(view.name)
                            yield NodeEvent("ADDED", view, str(
                                item["metadata"].get("resourceVersion", "")))
                        rv = page_rv
                except Exception as e:  # keep the watch alive through any transient trouble
                    err = translate(e, "list nodes")
                    if not isinstance(err, TransientError):
                        raise err from e
                    rv = ""  # a list cut short (its continue token may have expired): again
                    await backoff.sleep()
                    continue
                self.cache.keep_only(names)
                yield NodeEvent("SYNCED", None, rv)
            try:
                async with _PlainWatch() as w:
                    stream = w.stream(self.core.list_node, resource_version=rv,
                                      allow_watch_bookmarks=True,
                                      timeout_seconds=self.watch_timeout)
                    async for ev in stream:
                        etype = ev.get("type")
                        raw = ev.get("raw_object") or {}
                        new_rv = str((raw.get("metadata") or {}).get("resourceVersion", ""))
                        if etype == "BOOKMARK":
                            rv = new_rv or rv
                            continue
                        if etype == "ERROR":
                            if raw.get("code") == 410:
                                rv = ""
                                break
                            raise TransientError(f"node watch error: {raw.get('message')}")
                        rv = new_rv or rv
                        if etype == "DELETED":
                            view = node_view(raw)
                            self.versions.pop(view.name, None)
                            self.cache.remove(view.name)
                        else:
                            view = self._seen(raw)
                        yield NodeEvent(str(etype), view, new_rv)
                backoff.reset()
            except ApiException as e:
                if e.status == 410:
                    rv = ""  # compacted: re-list
                    continue
                await backoff.sleep()
            except (TimeoutError, TransientError, OSError):
                await backoff.sleep()
            except Exception as e:  # aiohttp errors and the like: translate, back off, resume
                err = translate(e, "node watch")
                if not isinstance(err, TransientError):
                    raise err from e
                await backoff.sleep()

    # -- writes --------------------------------------------------------------------------------

    async def _patch(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        raw = await call(f"patch node {name}", lambda: _json(
            lambda **kw: self.core.patch_node(
                name, body, _content_type="application/merge-patch+json",  # type: ignore[call-arg]
                field_manager="healer", **kw)))
        self._seen(raw)
        return raw

    async def _read_modify_write(self, name: str, mutate: Any, what: str) -> Any:
        """Read the node, compute a patch from it, apply it guarded by its resourceVersion;
        on 409 start again from a fresh read (a bounded number of times). The first attempt
        starts from the cache when the watch has the node; a patch it finds unneeded is
        confirmed by a read."""
        first = [True]

        async def once() -> Any:
            cached = self.cache.get(name) if first[0] and self.cache.synced else None
            first[0] = False
            if cached is not None:
                raw = cached.raw()
                body, result = mutate(raw)
                if body is not None:
                    self.reads_saved += 1
                    body.setdefault("metadata", {})["resourceVersion"] = cached.version
                    await self._patch(name, body)
                    return result
            raw = await self.get_raw(name)
            body, result = mutate(raw)
            if body is None:
                return result
            body.setdefault("metadata", {})["resourceVersion"] = raw["metadata"][
                "resourceVersion"]
            await self._patch(name, body)
            return result
        return await call(what, once, attempts=6, retry_conflicts=True)

    async def cordon(self, name: str, incident: str, reason: str) -> bool:
        def mutate(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
            meta, spec = raw["metadata"], raw.get("spec") or {}
            ann = meta.get("annotations") or {}
            taints = list(spec.get("taints") or [])
            if spec.get("unschedulable") and ann.get(CORDONED_BY) != CORDONED_BY_HEALER:
                # someone else cordoned it: never take their cordon over (so healer will never
                # uncordon it); only record which incident is looking at the node
                if ann.get(INCIDENT_ANNOTATION) == incident:
                    return None, False
                return {"metadata": {"annotations": {
                    INCIDENT_ANNOTATION: incident, REASON_ANNOTATION: reason[:250]}}}, False
            has_taint = any(t.get("key") == REMEDIATION_TAINT for t in taints)
            if ann.get(INCIDENT_ANNOTATION) == incident and spec.get("unschedulable") and has_taint:
                return None, True  # already done: idempotent
            if not has_taint:
                taints.append({"key": REMEDIATION_TAINT, "value": TAINT_VALUE,
                               "effect": TAINT_EFFECT})
            return {"spec": {"unschedulable": True, "taints": taints},
                    "metadata": {"annotations": {
                        CORDONED_BY: CORDONED_BY_HEALER, INCIDENT_ANNOTATION: incident,
                        REASON_ANNOTATION: reason[:250],
                        CORDONED_AT: rfc3339(self._clock.now())}}}, True
        return bool(await self._read_modify_write(name, mutate, f"cordon {name}"))

    async def uncordon(self, name: str, incident: str) -> bool:
        def mutate(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
            meta, spec = raw["metadata"], raw.get("spec") or {}
            ann = meta.get("annotations") or {}
            if ann.get(INCIDENT_ANNOTATION) != incident:
                return None, False  # not ours (or already undone)
            ours = ann.get(CORDONED_BY) == CORDONED_BY_HEALER
            taints = [t for t in spec.get("taints") or [] if t.get("key") != REMEDIATION_TAINT]
            body: dict[str, Any] = {"metadata": {"annotations": {
                CORDONED_BY: None, INCIDENT_ANNOTATION: None, REASON_ANNOTATION: None,
                CORDONED_AT: None}}}
            if ours:
                body["spec"] = {"unschedulable": None, "taints": taints or None}
            return body, ours
        return bool(await self._read_modify_write(name, mutate, f"uncordon {name}"))

    async def taint_out_of_service(self, name: str, incident: str) -> bool:
        def mutate(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
            ann = raw["metadata"].get("annotations") or {}
            taints = list((raw.get("spec") or {}).get("taints") or [])
            if any(t.get("key") == OUT_OF_SERVICE_TAINT for t in taints):
                return None, ann.get(OUT_OF_SERVICE_BY) == incident  # ours, or someone else's
            taints.append({"key": OUT_OF_SERVICE_TAINT, "value": OUT_OF_SERVICE_VALUE,
                           "effect": OUT_OF_SERVICE_EFFECT})
            return {"spec": {"taints": taints},
                    "metadata": {"annotations": {OUT_OF_SERVICE_BY: incident}}}, True
        return bool(await self._read_modify_write(name, mutate, f"taint {name} out of service"))

    async def clear_out_of_service(self, name: str, incident: str) -> bool:
        def mutate(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
            ann = raw["metadata"].get("annotations") or {}
            if ann.get(OUT_OF_SERVICE_BY) != incident:
                return None, False  # not ours (or already cleared): someone else's stays
            taints = [t for t in (raw.get("spec") or {}).get("taints") or []
                      if t.get("key") != OUT_OF_SERVICE_TAINT]
            return {"spec": {"taints": taints or None},
                    "metadata": {"annotations": {OUT_OF_SERVICE_BY: None}}}, True
        return bool(await self._read_modify_write(name, mutate,
                                                  f"clear out-of-service taint of {name}"))

    async def patch_metadata(self, name: str, *, labels: Mapping[str, str | None] | None = None,
                             annotations: Mapping[str, str | None] | None = None,
                             resource_version: str | None = None) -> NodeView:
        meta: dict[str, Any] = {}
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        if resource_version:
            meta["resourceVersion"] = resource_version
        return node_view(await self._patch(name, {"metadata": meta}))
