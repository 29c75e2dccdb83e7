"""Background recorders for the flow tests: what happened, in order, with wall-clock times.

* :class:`PodLog`: every slurmd pod of a namespace (uid, Slurm node name, host) and the moment a
  deletion (deletionTimestamp set, DELETED, or gone from a re-list) was first seen.
* :class:`NodeLog`: every version of the Nodes a test cares about (cordon, healer's provenance
  annotations, the spare claim, the topology annotation).
* :class:`SlurmLog`: ``scontrol show node -o`` sampled a few times a second (the Slurm state of
  the nodes a test cares about, e.g. busy while a job runs).

Each survives a kube-apiserver or slurmctld restart (watches are re-listed, failed samples are
skipped). Times are ``time.time()`` so they compare with the daemon's ledger timestamps.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client, watch

from healer.adapters.slinky import SLURMD_SELECTOR, slurm_name
from healer.adapters.slurm.parse import parse_nodes
from healer.ports import SlurmNodeState


@dataclass
class PodRecord:
    uid: str
    name: str
    slurm: str
    host: str
    first_seen: float
    deleted_at: float | None = None


@dataclass
class PodLog:
    """slurmd pods of ``namespace``, by uid, in order of first appearance."""

    api: client.ApiClient
    namespace: str
    pods: dict[str, PodRecord] = field(default_factory=dict)
    relists: int = 0

    def _seen(self, raw: Mapping[str, Any], deleted: bool) -> None:
        meta = raw.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        now = time.time()
        rec = self.pods.get(uid)
        if rec is None:
            rec = self.pods[uid] = PodRecord(uid, str(meta.get("name", "")), slurm_name(raw),
                                             "", now)
        host = str((raw.get("spec") or {}).get("nodeName") or "")
        if host:
            rec.host = host
        if (deleted or meta.get("deletionTimestamp")) and rec.deleted_at is None:
            rec.deleted_at = now

    async def run(self) -> None:
        core = client.CoreV1Api(self.api)
        while True:
            try:
                raw = self.api.sanitize_for_serialization(await core.list_namespaced_pod(
                    self.namespace, label_selector=SLURMD_SELECTOR))
                self.relists += 1
                present = set()
                for item in raw.get("items") or []:
                    self._seen(item, False)
                    present.add(item["metadata"]["uid"])
                now = time.time()
                for rec in self.pods.values():  # gone while the watch was down
                    if rec.uid not in present and rec.deleted_at is None:
                        rec.deleted_at = now
                rv = (raw.get("metadata") or {}).get("resourceVersion")
                async with watch.Watch() as w:
                    async for ev in w.stream(core.list_namespaced_pod, self.namespace,
                                             label_selector=SLURMD_SELECTOR,
                                             resource_version=rv, timeout_seconds=30):
                        obj = ev.get("raw_object") or {}
                        if ev.get("type") == "ERROR":
                            break
                        self._seen(obj, ev.get("type") == "DELETED")
            except asyncio.CancelledError:
                raise
            except Exception:  # the API server restarts in some tests: list again
                await asyncio.sleep(0.3)

    def of(self, slurm_node: str) -> list[PodRecord]:
        """The pods that served ``slurm_node``, oldest first."""
        return [p for p in self.pods.values() if p.slurm == slurm_node]

    def deleted(self) -> list[PodRecord]:
        return [p for p in self.pods.values() if p.deleted_at is not None]


@dataclass
class NodeSample:
    at: float
    name: str
    unschedulable: bool
    labels: dict[str, str]
    annotations: dict[str, str]
    taints: list[str]


@dataclass
class NodeLog:
    """Every version of the Nodes named in ``names`` (watch over all Nodes, filtered here)."""

    api: client.ApiClient
    names: set[str]
    samples: list[NodeSample] = field(default_factory=list)

    def _seen(self, raw: Mapping[str, Any]) -> None:
        meta = raw.get("metadata") or {}
        name = str(meta.get("name", ""))
        if name not in self.names:
            return
        spec = raw.get("spec") or {}
        self.samples.append(NodeSample(
            time.time(), name, bool(spec.get("unschedulable")), dict(meta.get("labels") or {}),
            dict(meta.get("annotations") or {}),
            [f"{t.get('key')}={t.get('value') or ''}:{t.get('effect')}"
             for t in spec.get("taints") or []]))

    async def run(self) -> None:
        core = client.CoreV1Api(self.api)
        while True:
            try:
                raw = self.api.sanitize_for_serialization(await core.list_node())
                for item in raw.get("items") or []:
                    self._seen(item)
                rv = (raw.get("metadata") or {}).get("resourceVersion")
                async with watch.Watch() as w:
                    async for ev in w.stream(core.list_node, resource_version=rv,
                                             timeout_seconds=30):
                        if ev.get("type") == "ERROR":
                            break
                        if ev.get("type") != "DELETED":
                            self._seen(ev.get("raw_object") or {})
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(0.3)

    def of(self, name: str) -> list[NodeSample]:
        return [s for s in self.samples if s.name == name]

    def first(self, name: str, pred: Callable[[NodeSample], bool]) -> NodeSample | None:
        return next((s for s in self.of(name) if pred(s)), None)


@dataclass
class SlurmSample:
    at: float
    nodes: dict[str, SlurmNodeState]


@dataclass
class SlurmLog:
    """``scontrol show node -o`` every ``interval`` seconds, kept for ``names``."""

    env: Mapping[str, str]
    names: Collection[str]
    interval: float = 0.3
    samples: list[SlurmSample] = field(default_factory=list)
    failures: int = 0
    last_error: str = ""

    async def run(self) -> None:
        while True:
            proc = await asyncio.create_subprocess_exec(
                "scontrol", "show", "node", "-o", stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
                env=dict(self.env))
            try:
                async with asyncio.timeout(15):
                    out, _ = await proc.communicate()
            except BaseException as e:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                if not isinstance(e, TimeoutError):
                    raise
                self.failures += 1
                continue
            if proc.returncode == 0:
                try:
                    states = {s.name: s for s in parse_nodes(out.decode(errors="replace"))
                              if s.name in self.names}
                except Exception as e:  # a line the parser cannot read must not end the log
                    self.failures += 1
                    self.last_error = repr(e)
                else:
                    self.samples.append(SlurmSample(time.time(), states))
            else:
                self.failures += 1  # slurmctld restarting
            await asyncio.sleep(self.interval)

    def of(self, name: str) -> list[tuple[float, SlurmNodeState]]:
        return [(s.at, s.nodes[name]) for s in self.samples if name in s.nodes]


class Recorders:
    """Starts and stops the recorders of one test as background tasks."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, *recorders: PodLog | NodeLog | SlurmLog) -> None:
        for r in recorders:
            self.tasks.append(asyncio.create_task(r.run(), name=type(r).__name__))

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()
