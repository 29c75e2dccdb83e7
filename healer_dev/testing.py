"""In-memory fakes of every port, plus a manual clock, for fast component tests.

They behave like the real adapters where it matters to the engine (cordon provenance, drain
ownership by reason prefix, idempotent claims, optimistic concurrency in the store) and every
one can be told to fail: ``fake.inject_error("method", SomeError(...), times=2)``.
``FakeSlurm`` can persist its state to a JSON file so a daemon killed with ``kill -9`` and
restarted sees the same Slurm (the crash-resume tests use that).

These are test doubles of the ports, never a replacement for the adapters' own tests against
the real systems.
"""

from __future__ import annotations

import asyncio
import fcntl
import heapq
import itertools
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from healer.core.model import (
    FenceProvider,
    NodeCondition,
    NodeRecord,
    NodeView,
    Signal,
    Taint,
)
from healer.core.topology import rank_spares, same_domain_spares, slinky_topology_spec
from healer.core.vocabulary import (
    CLAIMED_BY,
    CLOUD_SHUTDOWN_TAINT,
    CORDONED_BY,
    CORDONED_BY_HEALER,
    FENCED_ANNOTATION,
    INCIDENT_ANNOTATION,
    OUT_OF_SERVICE_BY,
    OUT_OF_SERVICE_EFFECT,
    OUT_OF_SERVICE_TAINT,
    OUT_OF_SERVICE_VALUE,
    REASON_ANNOTATION,
    REMEDIATION_TAINT,
    REPAIR_LABEL,
    REPAIR_PENDING,
    REPAIR_RESULT,
    ROLE_LABEL,
    SLURM_REASON_PREFIX,
    SPARE_ROLE,
    TAINT_EFFECT,
    TAINT_VALUE,
)
from healer.errors import ConflictError, NotFoundError, TransientError
from healer.ports import (
    FenceSpec,
    HookResult,
    HookSpec,
    NodeEvent,
    SlurmJob,
    SlurmNodeState,
    StepOutcome,
    StoredRecord,
    Undrain,
)


class Faulty:
    """Mixin: ``inject_error(method, error, times)`` makes the next calls of ``method`` fail."""

    def __init__(self) -> None:
        self._errors: dict[str, list[BaseException]] = defaultdict(list)
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def inject_error(self, method: str, error: BaseException, times: int = 1) -> None:
        self._errors[method].extend([error] * times)

    def _enter(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        if self._errors.get(method):
            raise self._errors[method].pop(0)

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)


class ManualClock:
    """A clock that only moves when told. ``sleep`` returns once ``advance`` passes its time."""

    def __init__(self, start: float = 1_767_600_000.0) -> None:
        self.t = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.t + max(seconds, 0.0), next(self._seq), fut))
        await fut

    def next_wakeup(self) -> float | None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking every sleeper whose time has come, in order."""
        end = self.t + seconds
        while True:
            await settle()
            nxt = self.next_wakeup()
            if nxt is None or nxt > end:
                break
            self.t = max(self.t, nxt)
            while self._sleepers and self._sleepers[0][0] <= self.t:
                _, _, fut = heapq.heappop(self._sleepers)
                if not fut.done():
                    fut.set_result(None)
        self.t = end
        await settle()


async def settle(rounds: int = 50) -> None:
    """Let every ready task run (no time passes)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


# ---------------------------------------------------------------------------------------------


@dataclass
class _Node:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    taints: list[Taint] = field(default_factory=list)
    rv: int = 1
    conditions: dict[str, NodeCondition] = field(default_factory=dict)

    def view(self) -> NodeView:
        return NodeView(self.name, dict(self.labels), dict(self.annotations), self.unschedulable,
                        tuple(self.taints), tuple(self.conditions.values()))


class FakeNodes(Faulty):
    """NodeAPI with the same provenance rules as the real adapter."""

    def __init__(self, nodes: Sequence[NodeView] = ()) -> None:
        super().__init__()
        self._nodes: dict[str, _Node] = {}
        self._subscribers: list[asyncio.Queue[NodeEvent]] = []
        for n in nodes:
            self.add(n)

    def add(self, n: NodeView) -> None:
        self._nodes[n.name] = _Node(n.name, dict(n.labels), dict(n.annotations), n.unschedulable,
                                    list(n.taints), conditions={c.type: c for c in n.conditions})
        self._publish("ADDED", n.name)

    def set_condition(self, name: str, cond: NodeCondition) -> None:
        """What a detector (healer's agent, NPD) does: publish one condition, by type."""
        self._nodes[name].conditions[cond.type] = cond
        self._publish("MODIFIED", name)

    def delete(self, name: str) -> None:
        """What a cloud does to the Node of an instance it deleted."""
        node = self._nodes.pop(name)
        for q in self._subscribers:
            q.put_nowait(NodeEvent("DELETED", node.view(), str(node.rv + 1)))

    def set_taint(self, name: str, taint: Taint | None, key: str = "") -> None:
        """Add ``taint`` (or, with None, remove every taint of ``key``): another controller."""
        n = self._nodes[name]
        n.taints = [t for t in n.taints if t.key != (taint.key if taint else key)]
        if taint is not None:
            n.taints.append(taint)
        self._publish("MODIFIED", name)

    def _publish(self, etype: str, name: str) -> None:
        node = self._nodes[name]
        node.rv += 1
        for q in self._subscribers:
            q.put_nowait(NodeEvent(etype, node.view(), str(node.rv)))

    def set(self, name: str, *, unschedulable: bool | None = None,
            labels: Mapping[str, str | None] | None = None,
            annotations: Mapping[str, str | None] | None = None) -> None:
        """What an admin (or another controller) does to a node."""
        n = self._nodes[name]
        if unschedulable is not None:
            n.unschedulable = unschedulable
        for src, dst in ((labels, n.labels), (annotations, n.annotations)):
            for k, v in (src or {}).items():
                if v is None:
                    dst.pop(k, None)
                else:
                    dst[k] = v
        self._publish("MODIFIED", name)

    def node(self, name: str) -> NodeView:
        return self._nodes[name].view()

    async def get(self, name: str) -> NodeView:
        self._enter("get", name)
        if name not in self._nodes:
            raise NotFoundError(f"node {name} not found")
        return self._nodes[name].view()

    async def list(self, selector: str = "") -> list[NodeView]:
        self._enter("list", selector)
        return [n.view() for n in self._nodes.values()]

    async def watch(self) -> AsyncIterator[NodeEvent]:
        q: asyncio.Queue[NodeEvent] = asyncio.Queue()
        self._subscribers.append(q)
        try:
            for n in list(self._nodes.values()):
                yield NodeEvent("ADDED", n.view(), str(n.rv))
            yield NodeEvent("SYNCED", None)
            while True:
                yield await q.get()
        finally:
            self._subscribers.remove(q)

    async def cordon(self, name: str, incident: str, reason: str) -> bool:
        self._enter("cordon", name, incident)
        n = self._nodes[name]
        if n.unschedulable and n.annotations.get(CORDONED_BY) != CORDONED_BY_HEALER:
            n.annotations[INCIDENT_ANNOTATION] = incident
            self._publish("MODIFIED", name)
            return False
        if n.annotations.get(INCIDENT_ANNOTATION) == incident and n.unschedulable:
            return True
        n.unschedulable = True
        n.annotations.update({CORDONED_BY: CORDONED_BY_HEALER, INCIDENT_ANNOTATION: incident,
                              REASON_ANNOTATION: reason})
        if not any(t.key == REMEDIATION_TAINT for t in n.taints):
            n.taints.append(Taint(REMEDIATION_TAINT, TAINT_VALUE, TAINT_EFFECT))
        self._publish("MODIFIED", name)
        return True

    async def uncordon(self, name: str, incident: str) -> bool:
        self._enter("uncordon", name, incident)
        n = self._nodes[name]
        if n.annotations.get(INCIDENT_ANNOTATION) != incident:
            return False
        ours = n.annotations.get(CORDONED_BY) == CORDONED_BY_HEALER
        for k in (CORDONED_BY, INCIDENT_ANNOTATION, REASON_ANNOTATION):
            n.annotations.pop(k, None)
        n.taints = [t for t in n.taints if t.key != REMEDIATION_TAINT]
        if ours:
            n.unschedulable = False
        self._publish("MODIFIED", name)
        return ours

    async def taint_out_of_service(self, name: str, incident: str) -> bool:
        self._enter("taint_out_of_service", name, incident)
        n = self._nodes[name]
        if any(t.key == OUT_OF_SERVICE_TAINT for t in n.taints):
            return n.annotations.get(OUT_OF_SERVICE_BY) == incident
        n.taints.append(Taint(OUT_OF_SERVICE_TAINT, OUT_OF_SERVICE_VALUE, OUT_OF_SERVICE_EFFECT))
        n.annotations[OUT_OF_SERVICE_BY] = incident
        self._publish("MODIFIED", name)
        return True

    async def clear_out_of_service(self, name: str, incident: str) -> bool:
        self._enter("clear_out_of_service", name, incident)
        n = self._nodes[name]
        if n.annotations.get(OUT_OF_SERVICE_BY) != incident:
            return False
        n.taints = [t for t in n.taints if t.key != OUT_OF_SERVICE_TAINT]
        del n.annotations[OUT_OF_SERVICE_BY]
        self._publish("MODIFIED", name)
        return True

    async def patch_metadata(self, name: str, *, labels: Mapping[str, str | None] | None = None,
                             annotations: Mapping[str, str | None] | None = None,
                             resource_version: str | None = None) -> NodeView:
        self._enter("patch_metadata", name)
        if name not in self._nodes:
            raise NotFoundError(f"node {name} not found")
        n = self._nodes[name]
        if resource_version is not None and resource_version != str(n.rv):
            raise ConflictError(f"node {name} changed")
        self.set(name, labels=labels, annotations=annotations)
        return n.view()


class FakeEvents(Faulty):
    def __init__(self) -> None:
        super().__init__()
        self.events: dict[str, tuple[str, str, str, str]] = {}  # key → node, reason, type, note

    async def emit(self, *, key: str, node: str, reason: str, note: str, type: str = "Normal",
                   action: str = "", remediation: str = "") -> None:
        self._enter("emit", key)
        self.events.setdefault(key, (node, reason, type, note))

    def reasons(self, node: str | None = None) -> list[str]:
        return [r for n, r, _, _ in self.events.values() if node is None or n == node]


class FakeStore(Faulty):
    """StateStore with resourceVersions and conflicts, like NodeRemediation objects."""

    def __init__(self) -> None:
        super().__init__()
        self.objects: dict[str, tuple[NodeRecord, int]] = {}
        self.writes = 0

    async def list(self) -> list[StoredRecord]:
        self._enter("list")
        return [StoredRecord(r, name, str(rv)) for name, (r, rv) in self.objects.items()]

    async def save(self, record: NodeRecord, previous: StoredRecord | None) -> StoredRecord:
        self._enter("save", record.incident.id)
        name = previous.name if previous is not None else record.incident.id
        cur = self.objects.get(name)
        if previous is None and cur is not None and cur[0].incident.id != record.incident.id:
            raise ConflictError(f"{name} exists")
        if previous is not None and cur is not None and str(cur[1]) != previous.resource_version:
            raise ConflictError(f"{name} changed since it was read")
        rv = (cur[1] if cur else 0) + 1
        self.objects[name] = (record, rv)
        self.writes += 1
        return StoredRecord(record, name, str(rv))

    def record(self, incident: str) -> NodeRecord:
        return self.objects[incident][0]

    async def delete(self, name: str) -> None:
        self._enter("delete", name)
        self.objects.pop(name, None)


class FakeSlurm(Faulty):
    """SlurmDriver over an in-memory (optionally file-backed) cluster."""

    def __init__(self, nodes: Sequence[str] = (), path: Path | None = None) -> None:
        super().__init__()
        self.path = path
        if path is None or not path.exists():
            self._state: dict[str, Any] = {
                "nodes": {n: {"base": "IDLE", "flags": [], "reason": ""} for n in nodes},
                "jobs": {}, "signals": [], "log": []}
            self._save()
        else:
            self._state = self._load()

    # persistence (a JSON file under an flock, so a restarted daemon sees the same cluster)
    def _load(self) -> dict[str, Any]:
        assert self.path is not None
        with open(self.path) as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            data: dict[str, Any] = json.load(f)
            return data

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state, indent=1, sort_keys=True))
        tmp.replace(self.path)

    def _sync(self) -> None:
        if self.path is not None and self.path.exists():
            self._state = self._load()

    def _busy(self, node: str) -> bool:
        return any(node in j["nodes"] and j["state"] == "RUNNING"
                   for j in self._state["jobs"].values())

    # test controls
    def add_job(self, job_id: int, node: str) -> None:
        self._sync()
        self._state["jobs"][str(job_id)] = {"nodes": [node], "state": "RUNNING"}
        self._save()

    def end_job(self, job_id: int) -> None:
        self._sync()
        self._state["jobs"][str(job_id)]["state"] = "COMPLETED"
        self._save()

    def node_state(self, node: str) -> dict[str, Any]:
        self._sync()
        return dict(self._state["nodes"][node])

    def set_reason(self, node: str, reason: str, user: str = "", at: str = "") -> None:
        """An admin (or the HealthCheckProgram, as ``user`` at ``at``) drains the node with
        their own reason."""
        self._sync()
        n = self._state["nodes"][node]
        n["flags"] = sorted(set(n["flags"]) | {"DRAIN"})
        n["reason"] = reason
        n["user"], n["at"] = user, at
        self._save()

    def set_down(self, node: str, reason: str, user: str = "root") -> None:
        """An admin sets the node DOWN (``scontrol update state=down reason=...``), or (with
        reason ``Not responding``) slurmctld finds its slurmd silent."""
        self._sync()
        n = self._state["nodes"][node]
        n["base"] = "DOWN"
        n["reason"], n["user"] = reason, user
        self._save()

    async def hold(self, node: str, reason: str) -> None:
        self._enter("hold", node)
        self._sync()
        n = self._state["nodes"][node]
        if "DRAIN" not in n["flags"]:
            n["flags"] = sorted(set(n["flags"]) | {"DRAIN"})
            n["reason"] = reason
            self._state["log"].append(["hold", node, reason])
            self._save()

    async def delete_node(self, node: str) -> bool:
        """``scontrol delete nodename=``: not while a job runs there ("Requested nodes are
        busy", a wait), as Slurm does."""
        self._enter("delete_node", node)
        self._sync()
        if node not in self._state["nodes"]:
            return False
        if self._busy(node):
            raise TransientError(f"delete_node nodename={node}: Requested nodes are busy")
        del self._state["nodes"][node]
        self._state["log"].append(["delete", node])
        self._save()
        return True

    def register(self, node: str, host: str = "") -> None:
        """A slurmd registers ``node`` (again): IDLE, no reason (a new record)."""
        self._sync()
        self._state["nodes"][node] = {"base": "IDLE", "flags": [], "reason": "",
                                      **({"host": host} if host else {})}
        self._save()

    def forget_reason(self, node: str) -> None:
        """The record went with a preStop; the recreated slurmd registered IDLE."""
        self._sync()
        n = self._state["nodes"][node]
        n["base"], n["flags"] = "IDLE", []
        n["reason"] = n["user"] = n["at"] = ""
        self._save()

    def clear_reason(self, node: str) -> None:
        """The owner undrains the node (``scontrol update state=undrain``)."""
        self._sync()
        n = self._state["nodes"][node]
        n["flags"] = [f for f in n["flags"] if f != "DRAIN"]
        n["reason"] = n["user"] = n["at"] = ""
        self._save()

    @property
    def log(self) -> list[list[Any]]:
        self._sync()
        return list(self._state["log"])

    # the port
    async def drain(self, node: str, reason: str, incident: str = "", *,
                    host: str = "") -> bool:
        self._enter("drain", node)
        self._sync()
        n = self._state["nodes"][node]
        theirs = "DRAIN" in n["flags"] or (n["base"] == "DOWN" and n["reason"])
        if theirs and not n["reason"].startswith(SLURM_REASON_PREFIX):
            return False
        if "DRAIN" not in n["flags"] or n["reason"] != reason:
            n["flags"] = sorted(set(n["flags"]) | {"DRAIN"})
            n["reason"] = reason
            self._state["log"].append(["drain", node, reason])
            self._save()
        return True

    async def undrain(self, node: str, incident: str = "", *,
                      host: str = "") -> Undrain:
        self._enter("undrain", node)
        self._sync()
        n = self._state["nodes"].get(node)
        if n is None or "DRAIN" not in n["flags"]:
            return Undrain.NOT_OURS
        if not n["reason"].startswith(SLURM_REASON_PREFIX) or (incident and
                                                                incident not in n["reason"]):
            return Undrain.NOT_OURS
        n["flags"] = [f for f in n["flags"] if f != "DRAIN"]
        n["reason"] = ""
        self._state["log"].append(["undrain", node])
        self._save()
        return Undrain.CLEARED

    async def close(self) -> None:
        """Nothing to release (state lives in a file)."""

    async def state(self, node: str, *, host: str = "") -> SlurmNodeState:
        self._enter("state", node)
        self._sync()
        if node not in self._state["nodes"]:
            raise NotFoundError(f"Slurm node {node!r} not found")
        n = self._state["nodes"][node]
        base = "ALLOCATED" if self._busy(node) else n["base"]
        return SlurmNodeState(node, base, frozenset(n["flags"]), n["reason"])

    async def node_states(self) -> dict[str, SlurmNodeState]:
        """Every Slurm node's state keyed by the Kubernetes node its slurmd runs on (the
        ``SlurmStates`` port the guardrails' Slurm feed reads)."""
        self._enter("node_states")
        self._sync()
        out = {}
        for name, n in self._state["nodes"].items():
            base = "ALLOCATED" if self._busy(name) else n["base"]
            out[n.get("host", name)] = SlurmNodeState(
                name, base, frozenset(n["flags"]), n["reason"], reason_user=n.get("user", ""),
                reason_time=n.get("at", ""))
        return out

    async def jobs_on(self, node: str) -> list[SlurmJob]:
        self._enter("jobs_on", node)
        self._sync()
        return [SlurmJob(int(i), j["state"], tuple(j["nodes"]))
                for i, j in self._state["jobs"].items() if node in j["nodes"]
                and j["state"] == "RUNNING"]

    async def signal_jobs(self, node: str, signal: str, *, batch_only: bool = False) -> list[int]:
        self._enter("signal_jobs", node)
        ids = [j.id for j in await self.jobs_on(node)]
        self._state["signals"].extend([i, signal] for i in ids)
        self._save()
        return ids

    async def requeue_jobs(self, node: str) -> list[int]:
        self._enter("requeue_jobs", node)
        ids = [j.id for j in await self.jobs_on(node)]
        for i in ids:
            self._state["jobs"][str(i)]["state"] = "PENDING"
            self._state["jobs"][str(i)]["nodes"] = []
        self._save()
        return ids

    def move_node(self, slurm_node: str, host: str, log: list[Any] | None = None) -> None:
        """The Slurm node's slurmd now runs on ``host`` (StatefulSet-mode swap)."""
        self._sync()
        self._state["nodes"][slurm_node]["host"] = host
        if log is not None:
            self._state["log"].append(log)
        self._save()


class FakeSpares(Faulty):
    """SparePool over FakeNodes: spares are nodes labelled healer.io/role=spare."""

    def __init__(self, nodes: FakeNodes) -> None:
        super().__init__()
        self.nodes = nodes

    async def _candidates(self) -> list[NodeView]:
        return [n for n in await self.nodes.list() if n.labels.get(ROLE_LABEL) == SPARE_ROLE
                and not n.annotations.get(CLAIMED_BY)]

    async def claim(self, node: str, incident: str, *, same_domain: bool = False,
                    labels: Mapping[str, str] | None = None) -> str | None:
        self._enter("claim", node, incident)
        for n in await self.nodes.list():
            if n.annotations.get(CLAIMED_BY) == incident:
                return n.name
        rank = same_domain_spares if same_domain else rank_spares
        try:
            bad = await self.nodes.get(node)
        except NotFoundError:
            if labels is None:
                raise
            bad = NodeView(node, dict(labels))
        ranked = rank(bad, await self._candidates())
        if not ranked:
            return None
        spare = ranked[0].name
        self.nodes.set(spare, labels={ROLE_LABEL: None},
                       annotations={CLAIMED_BY: incident})
        return spare

    async def release(self, spare: str, incident: str) -> None:
        self._enter("release", spare, incident)
        if self.nodes.node(spare).annotations.get(CLAIMED_BY) == incident:
            self.nodes.set(spare, labels={ROLE_LABEL: SPARE_ROLE},
                           annotations={CLAIMED_BY: None})

    async def return_to_pool(self, node: str, incident: str) -> None:
        self._enter("return_to_pool", node, incident)
        self.nodes.set(node, labels={ROLE_LABEL: SPARE_ROLE, REPAIR_LABEL: None},
                       annotations={REPAIR_RESULT: None})

    async def depth(self) -> Mapping[str, int]:
        return {"default": len(await self._candidates())}


class FakeWorkload(Faulty):
    """Moves a Slurm node to a spare; never while FakeSlurm says it is busy."""

    def __init__(self, slurm: FakeSlurm, ready_after: int = 1) -> None:
        super().__init__()
        self.slurm = slurm
        self.ready_after = ready_after
        self.moves: dict[str, int] = defaultdict(int)
        self._polls: dict[str, int] = defaultdict(int)

    async def move(self, incident: str, slurm_node: str, source: str, spare: str, *,
                   dead: bool = False, carry: bool = False) -> HookResult:
        self._enter("move", incident)
        st = await self.slurm.state(slurm_node)
        if self.slurm.node_state(slurm_node).get("host") == spare:
            return HookResult(StepOutcome.DONE)
        theirs = st.reason if (st.drain or st.down) and st.reason and not st.reason_is_ours \
            and not (st.down and not st.drain and st.reason == "Not responding") else ""
        if dead:  # Kubernetes removes the pod (out-of-service); the operator recreates it
            self.slurm.move_node(slurm_node, spare, log=["move", slurm_node, spare, incident])
            self.moves[incident] += 1
            return HookResult(StepOutcome.DONE)
        if st.busy:
            return HookResult(StepOutcome.PENDING, "Slurm reports the node busy")
        if theirs and not carry:  # as Slinky's move (ADR 0006, ADR 0016)
            return HookResult(StepOutcome.PENDING, f"Slurm node {slurm_node} is drained or "
                              f"down by someone else (reason {st.reason!r}): held",
                              {"held": "foreign-drain"})
        # one write: a daemon killed in between must not leave a move without its log entry
        self.slurm.move_node(slurm_node, spare, log=["move", slurm_node, spare, incident])
        if theirs:  # carried over: the preStop deleted the record and their reason with it
            self.slurm.forget_reason(slurm_node)
        self.moves[incident] += 1
        return HookResult(StepOutcome.DONE, "", {"carried": theirs} if theirs else {})

    async def replacement_ready(self, incident: str, slurm_node: str, spare: str) -> HookResult:
        self._enter("replacement_ready", incident)
        self._polls[incident] += 1
        if self._polls[incident] >= self.ready_after:
            return HookResult(StepOutcome.DONE)
        return HookResult(StepOutcome.PENDING, "slurmd not Ready yet")


class FakeTopology(Faulty):
    def __init__(self, nodes: FakeNodes) -> None:
        super().__init__()
        self.nodes = nodes

    async def annotate(self, incident: str, node: str, slurm_node: str) -> HookResult:
        self._enter("annotate", incident)
        spec = slinky_topology_spec(self.nodes.node(node))
        self.nodes.set(node, annotations={"topology.slinky.slurm.net/spec": spec})
        return HookResult(StepOutcome.DONE, data={"topology": spec})


@dataclass
class FakeValidator(Faulty):
    failing: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        Faulty.__init__(self)

    async def validate(self, incident: str, target: str, image: str, command: Sequence[str],
                       purpose: str) -> HookResult:
        self._enter("validate", incident, target)
        if target in self.failing:
            return HookResult(StepOutcome.FAILED, "validation failed")
        return HookResult(StepOutcome.DONE)


class FakeCheckpoint(Faulty):
    """slurm-signal semantics over FakeSlurm: signal once, done when no job runs."""

    def __init__(self, slurm: FakeSlurm) -> None:
        super().__init__()
        self.slurm = slurm
        self.signalled: set[str] = set()

    async def checkpoint(self, incident: str, node: str, slurm_node: str,
                         spec: HookSpec) -> HookResult:
        signal = spec.signal
        self._enter("checkpoint", incident)
        self.slurm._sync()
        done = {i for i, _ in self.slurm._state["signals"]}
        if incident not in self.signalled and not {j.id for j in await self.slurm.jobs_on(
                slurm_node)} <= done:
            await self.slurm.signal_jobs(slurm_node, signal)
            self.signalled.add(incident)
        if await self.slurm.jobs_on(slurm_node):
            return HookResult(StepOutcome.PENDING, "jobs still running")
        return HookResult(StepOutcome.DONE)


class FakeRepair(Faulty):
    def __init__(self, nodes: FakeNodes) -> None:
        super().__init__()
        self.nodes = nodes

    async def hand_off(self, incident: str, node: str, spec: HookSpec) -> HookResult:
        self._enter("hand_off", incident)
        self.nodes.set(node, labels={REPAIR_LABEL: REPAIR_PENDING},
                       annotations={REPAIR_RESULT: None})
        return HookResult(StepOutcome.DONE)


class FakeFencing(Faulty):
    """The fencing providers read from FakeNodes, as the real adapter reads the Node; the
    webhook provider records its requests (``requested``) and is acknowledged by
    :meth:`ack` (what a receiver's signed ack makes healer write)."""

    def __init__(self, nodes: FakeNodes) -> None:
        super().__init__()
        self.nodes = nodes
        self.requested: list[tuple[str, str]] = []  # (incident, node), once per incident
        self._acked: set[str] = set()

    def ack(self, incident: str) -> None:
        self._acked.add(incident)

    async def fence(self, incident: str, node: str, spec: FenceSpec) -> HookResult:
        self._enter("fence", incident, node)
        ways = spec.providers
        try:
            view = await self.nodes.get(node)
        except NotFoundError:
            if FenceProvider.NODE_DELETED in ways:
                return HookResult(StepOutcome.DONE, "", {"provider": "nodeDeleted",
                                                         "by": "Node deleted"})
            return HookResult(StepOutcome.PENDING, "Node gone; nodeDeleted not a provider")
        if FenceProvider.MANUAL in ways and view.annotations.get(FENCED_ANNOTATION):
            return HookResult(StepOutcome.DONE, "", {
                "provider": "manual", "by": view.annotations[FENCED_ANNOTATION]})
        if FenceProvider.CLOUD_SHUTDOWN in ways and any(
                t.key == CLOUD_SHUTDOWN_TAINT for t in view.taints):
            return HookResult(StepOutcome.DONE, "", {"provider": "cloudShutdown",
                                                     "by": CLOUD_SHUTDOWN_TAINT})
        if FenceProvider.WEBHOOK in ways:
            if incident in self._acked:
                return HookResult(StepOutcome.DONE, "", {"provider": "webhook", "by": "ack"})
            if (incident, node) not in self.requested:
                self.requested.append((incident, node))
        return HookResult(StepOutcome.PENDING, "waiting for a fencing provider")


class FileSignals:
    """A TelemetrySource reading JSON lines (``{"node": ..., <Signal.to_dict()>}``) appended to
    a file: the test's fake telemetry, surviving a daemon restart."""

    name = "file"

    def __init__(self, path: Path, poll: float = 0.2) -> None:
        self.path = path
        self.poll_interval = poll

    def _read(self, offset: int) -> tuple[list[str], int]:
        if not self.path.exists():
            return [], offset
        with open(self.path) as f:
            f.seek(offset)
            return f.readlines(), f.tell()

    async def run(self, sink: Any) -> None:
        offset = 0
        while True:
            lines, offset = await asyncio.to_thread(self._read, offset)
            sigs = [Signal.from_dict(d["node"], d) for d in map(json.loads, lines)
                    if d.get("node")]
            await sink(sigs)  # every poll, like a real source (its heartbeat)
            await asyncio.sleep(self.poll_interval)


def fake_ports(nodes: Sequence[NodeView], slurm_nodes: Sequence[str] | None = None,
               slurm_path: Path | None = None) -> dict[str, Any]:
    """Every fake, wired together (keys match healer.runtime.executor.Ports fields)."""
    fn = FakeNodes(nodes)
    slurm = FakeSlurm(slurm_nodes if slurm_nodes is not None else
                      [n.name for n in nodes if n.labels.get(ROLE_LABEL) != SPARE_ROLE], slurm_path)
    return {"nodes": fn, "events": FakeEvents(), "slurm": slurm, "spares": FakeSpares(fn),
            "workload": FakeWorkload(slurm), "topology": FakeTopology(fn),
            "validator": FakeValidator(), "checkpoint": FakeCheckpoint(slurm),
            "repair": FakeRepair(fn), "fencing": FakeFencing(fn), "slurm_hold": slurm}


__all__ = ["FakeCheckpoint", "FakeEvents", "FakeFencing", "FakeNodes", "FakeRepair",
           "FakeSlurm", "FakeSpares", "FakeStore", "FakeTopology", "FakeValidator",
           "FakeWorkload", "Faulty",
           "FileSignals", "ManualClock", "fake_ports", "settle"]
