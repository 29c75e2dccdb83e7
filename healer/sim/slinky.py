"""A SIMULATOR of SchedMD's Slinky slurm-operator (v1.x NodeSet controller), for tests and the
demo. It is not Slinky and ships nothing of it: it re-enacts, against a real kube-apiserver and a
real Slurm (``scontrol``), the documented behaviour of slurm-operator v1.x that healer relies
on (the project's Slinky reference notes, section 4: CRDs, well-known keys, the cordon ⇄ drain
sync, pod conditions, names, disruption protection, topology):

* :func:`nodeset_crd` / :func:`install`: a ``NodeSet`` CustomResourceDefinition
  (``slinky.slurm.net/v1beta1``, namespaced, status and scale subresources) with the fields
  healer reads.
* :class:`SlinkyEmulator`: a controller for every NodeSet of one Slurm cluster in a namespace.

  - StatefulSet mode: pods ``<nodeset>-<ordinal>`` (hostname = pod name = Slurm node name),
    placed by the real kube-scheduler (template nodeSelector/affinity/tolerations, the
    ``nodeset.slinky.slurm.net/worker`` NoExecute toleration, one pod per Node). A deleted or
    evicted pod is recreated under the same name, so it may land on another Node.
  - DaemonSet mode: one pod per eligible Node (``generateName: <nodeset>-``, ``spec.nodeName``),
    none started on a cordoned Node (existing ones kept); hostname = the Node's
    ``hostname-override`` annotation or its name cut at the first ``.``.
  - slurmd lifecycle: deleting a pod runs the slurmd preStop hook (``scontrol update
    nodename=<n> state=down reason='slurm-operator: Pod is terminating'``: it KILLS the node's
    running jobs) and stops its slurmd through ``on_slurmd(node, False)``; a Running pod gets
    its slurmd started through ``on_slurmd(node, True)``. The pod's identity is kept in the
    Slurm node's ``comment`` (JSON PodInfo, as the operator does); when it shows that the pod
    moved to another Kubernetes node the Slurm node is set back to service (the operator sets
    it IDLE; ``scontrol`` spells that ``state=resume``).
  - cordon ⇄ drain: for a Slurm node whose reason is empty or starts with ``slurm-operator: ``
    (and that is not DOWN for "Not responding"): cordoned Node → pod annotation
    ``pod-cordon=true`` + DRAIN with ``slurm-operator: `` + the Node's ``node-cordon-reason``
    annotation (else the default text), keeping a reason the node already has; pod-cordon
    alone → DRAIN "Pod (<ns>/<pod>) was cordoned" (the documented trigger: it lasts until the
    annotation is removed); Node uncordoned → the pod-cordon left by the Node cordon is removed
    and the node UNDRAINed (not resumed); otherwise UNDRAIN. Any other reason is external: the
    emulator leaves that Slurm node alone.
  - Slurm state → pod conditions ``SlurmNodeState<Base>`` + flags, message = the Slurm reason
    (stale ones removed); NodeSet status counts; ``pod-protect=true`` on busy pods plus the
    PodDisruptionBudget ``<cluster>-worker-protect`` (``maxUnavailable: 0``), so evicting a
    busy slurmd answers 429; Node annotation ``topology.slinky.slurm.net/spec`` copied to the
    pod (and kept in :attr:`SlinkyEmulator.topology`: what the operator would push to Slurm as
    ``topology_str``, which Slurm 22.05 does not have).
  - scale-in: pods beyond ``replicas`` (or on Nodes a DaemonSet no longer fits) are cordoned and
    drained ("... is pending termination for scale-in", overriding the reason) and deleted
    once drained.

Left out: Controller/LoginSet/RestApi/Accounting/Token objects, slurmrestd (everything goes
through ``scontrol``), rolling updates and revisions, PVCs, ``pinToNode``,
``ScheduledUpdate`` reservations, pod deadlines, unregistered-pod remediation, record pruning,
``--propagated-node-conditions`` and Events.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import logging
import os
import re
import shlex
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client, watch

from healer.adapters.kube.client import call, to_dict
from healer.adapters.slurm.parse import parse_kv_line, parse_node_line, scontrol_error_kind
from healer.errors import ConflictError, HealerError, NotFoundError, TransientError
from healer.ports import SlurmNodeState

__all__ = [
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "SlinkyEmulator",
    "SlurmdHook",
    "install",
    "nodeset_crd",
]

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL, KIND = "slinky.slurm.net", "v1beta1", "nodesets", "NodeSet"
API_VERSION = f"{GROUP}/{VERSION}"

# well-known keys (api/v1beta1/well_known.go)
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
CLUSTER_LABEL = "slinky.slurm.net/cluster"
POD_NAME = "nodeset.slinky.slurm.net/pod-name"
POD_INDEX = "nodeset.slinky.slurm.net/pod-index"
POD_HOSTNAME = "nodeset.slinky.slurm.net/pod-hostname"
SCALING_MODE = "nodeset.slinky.slurm.net/scaling-mode"
POD_PROTECT = "nodeset.slinky.slurm.net/pod-protect"
POD_CORDON = "nodeset.slinky.slurm.net/pod-cordon"
NODE_CORDON_REASON = "nodeset.slinky.slurm.net/node-cordon-reason"
HOSTNAME_OVERRIDE = "nodeset.slinky.slurm.net/hostname-override"
TOPOLOGY = "topology.slinky.slurm.net/spec"
WORKER_TAINT = "nodeset.slinky.slurm.net/worker"

REASON_PREFIX = "slurm-operator: "
TERMINATING_REASON = REASON_PREFIX + "Pod is terminating"
CONDITION_PREFIX = "SlurmNodeState"
MAX_REASON = 256
SPEC_HASH = "healer.io/spec-hash"
DEFAULT_IMAGE = "ghcr.io/slinkyproject/slurmd:25.11-ubuntu24.04"

#: Slurm base state → condition suffix (exactly one per registered node)
BASE_CONDITIONS = {"ALLOCATED": "Allocated", "DOWN": "Down", "ERROR": "Error",
                   "FUTURE": "Future", "IDLE": "Idle", "MIXED": "Mixed", "UNKNOWN": "Unknown"}
#: Slurm state flag → condition suffix (the flags Slinky mirrors)
FLAG_CONDITIONS = {"COMPLETING": "Completing", "DRAIN": "Drain", "FAIL": "Fail",
                   "INVALID": "Invalid", "INVALID_REG": "InvalidReg",
                   "MAINTENANCE": "Maintenance", "NOT_RESPONDING": "NotResponding",
                   "UNDRAIN": "Undrain"}

#: ``on_slurmd(slurm_node, running)``: start (True) or stop (False) that node's slurmd
SlurmdHook = Callable[[str, bool], Awaitable[None]]

_WS = re.compile(r"\s+")


# --------------------------------------------------------------------------------- the CRD


def _int(desc: str, minimum: int | None = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer", "format": "int32", "description": desc}
    if minimum is not None:
        out["minimum"] = minimum
    return out


_OBJ = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_MAP = {"type": "object", "additionalProperties": {"type": "string"}}


def nodeset_crd() -> dict[str, Any]:
    """The ``NodeSet`` CustomResourceDefinition, reduced to what healer and the emulator read
    (other Slinky fields are kept, not validated: ``spec`` preserves unknown fields)."""
    template = {
        "type": "object",
        "description": "the slurmd pod template",
        "properties": {
            "metadata": {"type": "object", "properties": {"labels": _MAP, "annotations": _MAP}},
            "spec": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {
                    "hostname": {"type": "string",
                                 "description": "hostname prefix; the ordinal is appended"},
                    "nodeSelector": _MAP,
                    "affinity": _OBJ,
                    "tolerations": {"type": "array", "items": _OBJ},
                },
            },
        },
    }
    spec = {
        "type": "object",
        "required": ["controllerRef"],
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "controllerRef": {"type": "object", "required": ["name"],
                              "description": "the Controller (Slurm cluster) of this NodeSet",
                              "properties": {"name": {"type": "string"},
                                             "namespace": {"type": "string"}}},
            "replicas": {**_int("slurmd pods (ignored in DaemonSet mode)"), "default": 1},
            "scalingMode": {"type": "string", "enum": ["StatefulSet", "DaemonSet"],
                            "default": "StatefulSet"},
            "ordinalPadding": _int("zero padding of the pod ordinal"),
            "workloadDisruptionProtection": {"type": "boolean", "default": True},
            "oversubscribeNode": {"type": "boolean"},
            "slurmd": {**_OBJ, "properties": {"image": {"type": "string"}}},
            "template": template,
        },
    }
    status = {
        "type": "object",
        "properties": {
            "replicas": _int("pods created"),
            "updatedReplicas": _int("pods of the current template"),
            "readyReplicas": _int("pods Running and Ready"),
            "availableReplicas": _int("pods available"),
            "unavailableReplicas": _int("pods not available"),
            "slurmIdle": _int("Slurm nodes IDLE"),
            "slurmAllocated": _int("Slurm nodes ALLOCATED or MIXED"),
            "slurmDown": _int("Slurm nodes DOWN"),
            "slurmDrain": _int("Slurm nodes with the DRAIN flag"),
            "observedGeneration": {"type": "integer", "format": "int64"},
            "selector": {"type": "string", "description": "label selector of the pods"},
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}",
                     "annotations": {"healer.io/simulated": "healer.sim.slinky"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "nodeset", "kind": KIND,
                      "listKind": f"{KIND}List", "shortNames": ["nss", "slurmd"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {
                    "status": {},
                    "scale": {"specReplicasPath": ".spec.replicas",
                              "statusReplicasPath": ".status.replicas",
                              "labelSelectorPath": ".status.selector"},
                },
                "additionalPrinterColumns": [
                    {"name": "Mode", "type": "string", "jsonPath": ".spec.scalingMode"},
                    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
                    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
                    {"name": "Idle", "type": "integer", "jsonPath": ".status.slurmIdle"},
                    {"name": "Allocated", "type": "integer",
                     "jsonPath": ".status.slurmAllocated"},
                    {"name": "Down", "type": "integer", "jsonPath": ".status.slurmDown"},
                    {"name": "Drain", "type": "integer", "jsonPath": ".status.slurmDrain"},
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "A set of slurmd pods (SIMULATED Slinky NodeSet, reduced).",
                    "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                   "metadata": {"type": "object"}, "spec": spec,
                                   "status": status},
                }},
            }],
        },
    }


async def install(api_client: client.ApiClient, *, timeout: float = 30.0) -> None:  # noqa: ASYNC109
    """Create (or update) the NodeSet CRD and wait until it is Established and served."""
    ext = client.ApiextensionsV1Api(api_client)
    body = nodeset_crd()
    name = body["metadata"]["name"]
    digest = hashlib.sha256(json.dumps(body["spec"], sort_keys=True).encode()).hexdigest()[:16]
    body["metadata"]["annotations"][SPEC_HASH] = digest
    try:
        await call(f"create CRD {name}",
                   lambda: ext.create_custom_resource_definition(body))  # type: ignore[arg-type]
    except ConflictError:
        current = to_dict(api_client, await call(
            f"read CRD {name}", lambda: ext.read_custom_resource_definition(name)))
        if (current["metadata"].get("annotations") or {}).get(SPEC_HASH) != digest:
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await call(f"replace CRD {name}", lambda: ext.replace_custom_resource_definition(
                name, body))  # type: ignore[arg-type]
    co = client.CustomObjectsApi(api_client)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = "not read yet"
    while True:
        crd = to_dict(api_client, await call(
            f"read CRD {name}", lambda: ext.read_custom_resource_definition(name)))
        conds = {c.get("type"): c for c in (crd.get("status") or {}).get("conditions") or []}
        est = conds.get("Established") or {}
        last = f"Established={est.get('status', 'missing')} {est.get('message', '')}".strip()
        if est.get("status") == "True":
            try:
                await co.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1)
                return
            except Exception as e:  # not served yet (404 from discovery lag)
                last = f"established but not served: {type(e).__name__}: {e}"[:300]
        if loop.time() >= deadline:
            raise TransientError(f"CRD {name} not served within {timeout:g} s ({last})")
        await asyncio.sleep(0.1)


# ----------------------------------------------------------------------------- small helpers


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return dict(obj.get("metadata") or {})


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(_meta(obj).get("labels") or {})


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(_meta(obj).get("annotations") or {})


def _terminating(obj: Mapping[str, Any]) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def _running(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName")) and \
        (pod.get("status") or {}).get("phase") == "Running"


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


async def _reap(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def slurm_node_name(pod: Mapping[str, Any]) -> str:
    """The Slurm node a slurmd pod registers: its ``pod-hostname`` label, else its hostname."""
    spec = pod.get("spec") or {}
    return str(_labels(pod).get(POD_HOSTNAME) or spec.get("hostname") or _meta(pod).get("name"))


def daemonset_hostname(node: Mapping[str, Any]) -> str:
    """DaemonSet mode: the ``hostname-override`` annotation, else the Node name up to the
    first ``.``."""
    override = _annotations(node).get(HOSTNAME_OVERRIDE)
    return override or str(_meta(node).get("name", "")).split(".", 1)[0]


def sanitise_reason(text: str) -> str:
    """A Node's cordon reason as the operator uses it: one line, at most 256 characters."""
    return _WS.sub(" ", text).strip()[:MAX_REASON]


def _ours(st: SlurmNodeState) -> bool:
    """``IsNodeReasonOurs``: no reason, or the operator's prefix."""
    return not st.reason or st.reason.startswith(REASON_PREFIX)


def _hands_off(st: SlurmNodeState) -> bool:
    """The cordon sync skips a node with an external reason or DOWN for "Not responding"."""
    return not _ours(st) or (st.down and "Not responding" in st.reason)


def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        effect = t.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key, op = t.get("key") or "", t.get("operator") or "Equal"
        if not key and op == "Exists":
            return True
        if key != taint.get("key"):
            continue
        if op == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expr_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op = str(expr.get("key", "")), str(expr.get("operator", ""))
    values = [str(v) for v in expr.get("values") or []]
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            a, b = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _node_affinity_matches(affinity: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    required = ((affinity.get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    labels = _labels(node)
    fields = {"metadata.name": str(_meta(node).get("name", ""))}
    for term in terms:
        if all(_expr_matches(e, labels) for e in term.get("matchExpressions") or []) and \
                all(_expr_matches(e, fields) for e in term.get("matchFields") or []):
            return True
    return False


# ------------------------------------------------------------------------------ the emulator


class SlinkyEmulator:
    """SIMULATED Slinky NodeSet controller (see the module doc) for one Slurm cluster.

    ``cluster`` is the Controller's name: NodeSets whose ``spec.controllerRef.name`` differs
    are someone else's and ignored. ``slurm_env`` is the environment of ``scontrol`` (it must
    carry ``SLURM_CONF``). ``on_slurmd(node, running)`` starts or stops a Slurm node's slurmd
    (e.g. ``LocalSlurm.start_slurmd`` / ``kill_slurmd`` in a thread); without it the emulator
    only changes Slurm's records. ``run()`` reconciles on every watch event of pods, Nodes and
    NodeSets and at least every ``resync`` seconds; ``reconcile_once()`` is one full pass
    (passes never overlap, so a test may call it as a barrier while ``run()`` is going).
    """

    def __init__(self, api_client: client.ApiClient, *, namespace: str,
                 slurm_env: Mapping[str, str], cluster: str = "slurm", resync: float = 1.0,
                 on_slurmd: SlurmdHook | None = None, scontrol: str = "scontrol",
                 image: str = DEFAULT_IMAGE) -> None:
        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.co = client.CustomObjectsApi(api_client)
        self.pdbs = client.PolicyV1Api(api_client)
        self.namespace = namespace
        self.cluster = cluster
        self.resync = resync
        self.on_slurmd = on_slurmd
        self.scontrol = scontrol
        self.image = image
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMRESTD_"))}
        env.update(slurm_env)
        self.env = env
        #: Slurm node → the topology string the operator would push to Slurm (``topology_str``)
        self.topology: dict[str, str] = {}
        #: every Slurm change made: (time.monotonic(), scontrol argv)
        self.history: list[tuple[float, tuple[str, ...]]] = []
        #: the latest errors of passes run by :meth:`run` (newest last, at most 50)
        self.errors: list[str] = []
        self.passes = 0
        self._lock = asyncio.Lock()
        self._kick = asyncio.Event()
        self._known: dict[str, str] = {}  # uid of a pod seen running → its Slurm node
        self._stopped: set[str] = set()  # uids whose preStop ran
        self._up: dict[str, str] = {}  # Slurm node → uid of the pod whose slurmd is up
        self._bringup: dict[str, asyncio.Task[None]] = {}
        self._slurm: dict[str, tuple[SlurmNodeState, str]] = {}
        self._slurm_dirty = False
        self._pdb_checked = -1e9

    # -- driving ---------------------------------------------------------------------------

    def kick(self) -> None:
        """Ask :meth:`run` for a pass now."""
        self._kick.set()

    async def run(self) -> None:
        """Reconcile until cancelled: on watch events, and every ``resync`` seconds."""
        watchers = [
            asyncio.create_task(self._watch("pods", self.core.list_namespaced_pod,
                                            self.namespace,
                                            label_selector=f"{NAME_LABEL}=slurmd")),
            asyncio.create_task(self._watch("nodes", self.core.list_node)),
            asyncio.create_task(self._watch("nodesets", self.co.list_namespaced_custom_object,
                                            GROUP, VERSION, self.namespace, PLURAL)),
        ]
        try:
            while True:
                self._kick.clear()
                try:
                    await self.reconcile_once()
                except HealerError as e:
                    self._record(e)
                except Exception as e:  # keep reconciling; the error is kept for tests/debug
                    log.exception("slinky emulator pass failed")
                    self._record(e)
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
                # cancellation that arrives as the timeout fires, and run() would never stop
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.resync):
                        await self._kick.wait()
                await asyncio.sleep(0.02)  # coalesce a burst of watch events into one pass
        finally:
            for t in watchers:
                t.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            await self.aclose()

    async def aclose(self) -> None:
        """Cancel slurmd start-ups still running (after :meth:`reconcile_once` used alone)."""
        tasks = [t for t in self._bringup.values() if not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._bringup.clear()

    def _record(self, e: BaseException) -> None:
        self.errors.append(f"{type(e).__name__}: {e}")
        del self.errors[:-50]

    async def _watch(self, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> None:
        backoff = 0.2
        while True:
            try:
                async with watch.Watch() as w:
                    async for _ in w.stream(fn, *args, timeout_seconds=60, **kw):
                        self._kick.set()
                backoff = 0.2
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the resync loop covers the gap; retry the watch
                log.debug("slinky emulator: %s watch: %s", what, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    # -- one pass --------------------------------------------------------------------------

    async def reconcile_once(self) -> None:
        """One full pass over every NodeSet of this cluster in the namespace."""
        async with self._lock:
            self.passes += 1
            nodesets = [ns for ns in await self._list_nodesets()
                        if ((ns.get("spec") or {}).get("controllerRef") or {}).get("name")
                        == self.cluster]
            pods = await self._list_pods()
            nodes = {str(n["metadata"]["name"]): n for n in await self._list_nodes()}
            await self._read_slurm()
            await self._prestops(pods)
            if self._slurm_dirty:
                await self._read_slurm()
            if nodesets:
                await self._ensure_pdb()
            errors: list[BaseException] = []
            for ns in nodesets:
                name = ns["metadata"]["name"]
                mine = [p for p in pods if _labels(p).get(INSTANCE_LABEL) == name]
                try:
                    await self._reconcile_nodeset(ns, mine, nodes)
                except HealerError as e:
                    errors.append(e)
            if errors:
                raise errors[0]

    async def _list_nodesets(self) -> list[dict[str, Any]]:
        try:
            raw = await call(f"list NodeSets in {self.namespace}",
                             lambda: self.co.list_namespaced_custom_object(
                                 GROUP, VERSION, self.namespace, PLURAL))
        except NotFoundError:
            return []  # the CRD is not installed (yet)
        return list(to_dict(self.api, raw).get("items") or [])

    async def _list_pods(self) -> list[dict[str, Any]]:
        raw = await call(f"list slurmd pods in {self.namespace}",
                         lambda: self.core.list_namespaced_pod(
                             self.namespace,
                             label_selector=f"{NAME_LABEL}=slurmd,{CLUSTER_LABEL}={self.cluster}"))
        return list(to_dict(self.api, raw).get("items") or [])

    async def _list_nodes(self) -> list[dict[str, Any]]:
        raw = await call("list nodes", lambda: self.core.list_node())
        return list(to_dict(self.api, raw).get("items") or [])

    # -- Slurm -----------------------------------------------------------------------------

    async def _scontrol(self, *args: str) -> str:
        argv = (self.scontrol, *args)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=self.env)
        try:
            async with asyncio.timeout(30):
                out, err = await proc.communicate()
        except TimeoutError:
            await _reap(proc)
            raise TransientError(f"`{shlex.join(argv)}` did not finish in 30 s") from None
        except BaseException:
            await _reap(proc)
            raise
        text = (err or out).decode(errors="replace").strip()
        if proc.returncode != 0:
            msg = f"`{shlex.join(argv)}` exited {proc.returncode}: {text}"
            if scontrol_error_kind(text) == "not_found":
                raise NotFoundError(msg)
            raise TransientError(msg)
        if args and args[0] == "update":
            self.history.append((time.monotonic(), argv))
            self._slurm_dirty = True
            log.info("slinky emulator: %s", shlex.join(argv))
        return out.decode(errors="replace")

    async def _read_slurm(self) -> None:
        text = await self._scontrol("show", "node", "-o")
        nodes: dict[str, tuple[SlurmNodeState, str]] = {}
        for line in text.splitlines():
            if "NodeName=" not in line:
                continue
            st = parse_node_line(line)
            comment = parse_kv_line(line).get("Comment", "")
            nodes[st.name] = (st, "" if comment in ("(null)", "None") else comment)
        self._slurm = nodes
        self._slurm_dirty = False

    async def _refresh(self, name: str) -> SlurmNodeState | None:
        """Read one Slurm node again (after changing it)."""
        try:
            text = await self._scontrol("show", "node", name, "-o")
        except NotFoundError:
            self._slurm.pop(name, None)
            return None
        for line in text.splitlines():
            if f"NodeName={name} " in line:
                comment = parse_kv_line(line).get("Comment", "")
                self._slurm[name] = (parse_node_line(line),
                                     "" if comment in ("(null)", "None") else comment)
        return self._state(name)

    def _state(self, name: str) -> SlurmNodeState | None:
        got = self._slurm.get(name)
        return got[0] if got else None

    async def _make_drain(self, name: str, st: SlurmNodeState, reason: str, *,
                          override: bool = False) -> None:
        """``MakeNodeDrain``: keep a reason the node already has unless ``override``."""
        want = REASON_PREFIX + reason
        if st.reason and not override:
            want = st.reason
        if st.drain and st.reason == want:
            return
        await self._scontrol("update", f"nodename={name}", "state=drain", f"reason={want}")

    async def _make_undrain(self, name: str, st: SlurmNodeState) -> None:
        """``MakeNodeUndrain``: UNDRAIN (not RESUME: a DOWN base state stays) when drained."""
        if not st.drain:
            return
        await self._scontrol("update", f"nodename={name}", "state=undrain")

    # -- pod deletion: the slurmd preStop hook ------------------------------------------------

    async def _prestops(self, pods: list[dict[str, Any]]) -> None:
        """Run the preStop hook of every pod that ran and is terminating or gone (a pod that
        never ran has no container, so no hook)."""
        present = {str(_meta(p).get("uid")): p for p in pods}
        for uid, pod in present.items():
            if _running(pod) and not _terminating(pod):
                self._known[uid] = slurm_node_name(pod)
        for uid, pod in present.items():
            if _terminating(pod) and uid in self._known and uid not in self._stopped:
                await self._prestop(uid, slurm_node_name(pod))
        for uid, name in list(self._known.items()):
            if uid not in present:
                if uid not in self._stopped:
                    await self._prestop(uid, name)
                del self._known[uid]
        self._stopped &= set(present)

    async def _prestop(self, uid: str, name: str) -> None:
        """What the slurmd container's preStop does, then the container stopping."""
        self._stopped.add(uid)
        if self._state(name) is not None:
            # DOWN kills every job running on the node: that is why a busy slurmd is never
            # deleted (the PodDisruptionBudget answers 429 to its eviction)
            try:
                await self._scontrol("update", f"nodename={name}", "state=down",
                                     f"reason={TERMINATING_REASON}")
            except NotFoundError:
                pass
            except HealerError as e:  # a hook that fails does not stop the container
                self._record(e)
        task = self._bringup.pop(name, None)
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._up.get(name) in (uid, None):  # not a newer pod's slurmd
            self._up.pop(name, None)
            if self.on_slurmd is not None:
                try:
                    await self.on_slurmd(name, False)
                except Exception as e:
                    self._record(e)
                    log.warning("slinky emulator: stopping slurmd %s failed: %s", name, e)

    # -- per NodeSet -----------------------------------------------------------------------

    async def _reconcile_nodeset(self, nodeset: dict[str, Any], pods: list[dict[str, Any]],
                                 nodes: Mapping[str, dict[str, Any]]) -> None:
        spec = nodeset.get("spec") or {}
        live = [p for p in pods if not _terminating(p)]
        if spec.get("scalingMode") == "DaemonSet":
            condemned = await self._daemonset_pods(nodeset, pods, live, nodes)
        else:
            condemned = await self._statefulset_pods(nodeset, pods, live)
        kept: list[dict[str, Any]] = []
        for pod in live:
            node = nodes.get(str((pod.get("spec") or {}).get("nodeName") or ""))
            name, uid = slurm_node_name(pod), str(_meta(pod).get("uid"))
            try:
                pod = await self._sync_metadata(pod, node)
                if _running(pod):
                    await self._ensure_up(name, pod)
                st = self._state(name)
                if st is not None and _running(pod) and self._up.get(name) == uid and \
                        await self._sync_podinfo(nodeset, pod, name, st):
                    st = await self._refresh(name)
                if uid in condemned:
                    if await self._condemn(pod, name, st):
                        continue
                elif st is not None and node is not None:
                    pod = await self._sync_cordon(pod, node, name, st)
            except NotFoundError:
                continue  # the pod went away under us: the next pass sees it gone
            except HealerError as e:  # one pod's trouble must not stall the others
                self._record(e)
                log.warning("slinky emulator: pod %s: %s", _meta(pod).get("name"), e)
            kept.append(pod)
        if self._slurm_dirty:
            await self._read_slurm()
        protect = spec.get("workloadDisruptionProtection", True) is not False
        for pod in kept:
            try:
                await self._sync_conditions(pod, self._state(slurm_node_name(pod)), protect)
            except NotFoundError:
                continue
            except HealerError as e:
                self._record(e)
        await self._sync_status(nodeset, kept)

    def _pod_labels(self, nodeset: Mapping[str, Any], mode: str) -> dict[str, str]:
        name = str(nodeset["metadata"]["name"])
        tmpl = (nodeset.get("spec") or {}).get("template") or {}
        labels = {str(k): str(v) for k, v in _labels(tmpl).items()}
        labels.update({NAME_LABEL: "slurmd", INSTANCE_LABEL: name, COMPONENT_LABEL: "worker",
                       CLUSTER_LABEL: self.cluster, SCALING_MODE: mode})
        return labels

    def _pod_body(self, nodeset: Mapping[str, Any], mode: str) -> dict[str, Any]:
        meta = nodeset["metadata"]
        spec = nodeset.get("spec") or {}
        tspec = copy.deepcopy(((spec.get("template") or {}).get("spec")) or {})
        tolerations = list(tspec.get("tolerations") or [])
        tolerations.append({"key": WORKER_TAINT, "operator": "Exists", "effect": "NoExecute"})
        affinity = copy.deepcopy(tspec.get("affinity") or {})
        if mode == "StatefulSet" and not spec.get("oversubscribeNode"):
            paa = affinity.setdefault("podAntiAffinity", {})
            paa.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append({
                "labelSelector": {"matchLabels": {NAME_LABEL: "slurmd",
                                                  INSTANCE_LABEL: str(meta["name"])}},
                "topologyKey": "kubernetes.io/hostname"})
        image = str((spec.get("slurmd") or {}).get("image") or self.image)
        pod_spec: dict[str, Any] = {
            "containers": [{"name": "slurmd", "image": image}],
            "tolerations": tolerations,
            "enableServiceLinks": False,
        }
        if tspec.get("nodeSelector"):
            pod_spec["nodeSelector"] = dict(tspec["nodeSelector"])
        if affinity:
            pod_spec["affinity"] = affinity
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "namespace": self.namespace,
                "labels": self._pod_labels(nodeset, mode),
                "annotations": {str(k): str(v) for k, v in _annotations(
                    spec.get("template") or {}).items()},
                "ownerReferences": [{"apiVersion": API_VERSION, "kind": KIND,
                                     "name": meta["name"], "uid": meta["uid"],
                                     "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": pod_spec,
        }

    async def _create_pod(self, body: dict[str, Any]) -> dict[str, Any] | None:
        what = body["metadata"].get("name") or body["metadata"].get("generateName", "") + "*"
        try:
            raw = await call(f"create pod {self.namespace}/{what}",
                             lambda: self.core.create_namespaced_pod(
                                 self.namespace, body))  # type: ignore[arg-type]
        except ConflictError:
            return None  # the old one is still there (terminating): next pass
        pod = to_dict(self.api, raw)
        log.info("slinky emulator: created pod %s/%s", self.namespace, pod["metadata"]["name"])
        return pod

    async def _statefulset_pods(self, nodeset: dict[str, Any], pods: list[dict[str, Any]],
                                live: list[dict[str, Any]]) -> set[str]:
        spec = nodeset.get("spec") or {}
        name = str(nodeset["metadata"]["name"])
        replicas = int(spec.get("replicas", 1))
        pad = int(spec.get("ordinalPadding") or 0)
        hostname_prefix = str((((spec.get("template") or {}).get("spec")) or {})
                              .get("hostname") or "")
        by_name = {str(_meta(p).get("name")): p for p in pods}
        for i in range(replicas):
            ordinal = f"{i:0{pad}d}"
            pod_name = f"{name}-{ordinal}"
            if pod_name in by_name:
                continue
            hostname = f"{hostname_prefix}{ordinal}" if hostname_prefix else pod_name
            body = self._pod_body(nodeset, "StatefulSet")
            body["metadata"]["name"] = pod_name
            body["metadata"]["labels"].update({POD_NAME: pod_name, POD_INDEX: str(i),
                                               POD_HOSTNAME: hostname})
            body["spec"]["hostname"] = hostname
            await self._create_pod(body)
        condemned = set()
        for p in live:
            try:
                index = int(_labels(p).get(POD_INDEX, "-1"))
            except ValueError:
                index = -1
            if index >= replicas:
                condemned.add(str(_meta(p).get("uid")))
        return condemned

    def _fits(self, nodeset: Mapping[str, Any], node: Mapping[str, Any], *,
              new: bool) -> bool:
        """DaemonSet mode: may a pod start (``new``) or keep running on ``node``?"""
        if _terminating(node):
            return False
        tspec = (((nodeset.get("spec") or {}).get("template") or {}).get("spec")) or {}
        labels = _labels(node)
        selector = tspec.get("nodeSelector") or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            return False
        if not _node_affinity_matches(tspec.get("affinity") or {}, node):
            return False
        if new and (node.get("spec") or {}).get("unschedulable"):
            return False  # never start a new slurmd on a cordoned Node (keep existing ones)
        tolerations = [*(tspec.get("tolerations") or []),
                       {"key": WORKER_TAINT, "operator": "Exists", "effect": "NoExecute"}]
        for taint in (node.get("spec") or {}).get("taints") or []:
            if str(taint.get("key", "")).startswith("node.kubernetes.io/"):
                continue  # tolerated by daemon pods (not-ready, unschedulable, pressure, ...)
            effects = ("NoSchedule", "NoExecute") if new else ("NoExecute",)
            if taint.get("effect") in effects and not _tolerates(tolerations, taint):
                return False
        return True

    async def _daemonset_pods(self, nodeset: dict[str, Any], pods: list[dict[str, Any]],
                              live: list[dict[str, Any]],
                              nodes: Mapping[str, dict[str, Any]]) -> set[str]:
        name = str(nodeset["metadata"]["name"])
        on_node = {str((p.get("spec") or {}).get("nodeName") or ""): p for p in pods}
        for node_name, node in sorted(nodes.items()):
            if node_name in on_node or not self._fits(nodeset, node, new=True):
                continue
            hostname = daemonset_hostname(node)
            body = self._pod_body(nodeset, "DaemonSet")
            body["metadata"]["generateName"] = f"{name}-"
            body["metadata"]["labels"][POD_HOSTNAME] = hostname
            body["spec"]["nodeName"] = node_name
            body["spec"]["hostname"] = hostname
            await self._create_pod(body)
        condemned = set()
        for p in live:
            host = nodes.get(str((p.get("spec") or {}).get("nodeName") or ""))
            if host is None or not self._fits(nodeset, host, new=False):
                condemned.add(str(_meta(p).get("uid")))
        return condemned

    # -- per pod ---------------------------------------------------------------------------

    async def _patch_pod(self, pod: Mapping[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        name = str(_meta(pod)["name"])
        raw = await call(f"patch pod {self.namespace}/{name}",
                         lambda: self.core.patch_namespaced_pod(
                             name, self.namespace, body,
                             _content_type="application/merge-patch+json"))  # type: ignore[call-arg]
        return to_dict(self.api, raw)

    async def _sync_metadata(self, pod: dict[str, Any],
                             node: Mapping[str, Any] | None) -> dict[str, Any]:
        """The pod-name label (DaemonSet pods get their name from generateName) and the
        Node's topology annotation copied to the pod."""
        labels, ann = _labels(pod), _annotations(pod)
        patch: dict[str, Any] = {}
        if labels.get(POD_NAME) != _meta(pod).get("name"):
            patch.setdefault("labels", {})[POD_NAME] = _meta(pod)["name"]
        name = slurm_node_name(pod)
        if node is not None:
            spec = _annotations(node).get(TOPOLOGY)
            if spec != ann.get(TOPOLOGY):
                patch.setdefault("annotations", {})[TOPOLOGY] = spec
            if spec:
                self.topology[name] = spec
            else:
                self.topology.pop(name, None)
        if not patch:
            return pod
        return await self._patch_pod(pod, {"metadata": patch})

    async def _ensure_up(self, name: str, pod: Mapping[str, Any]) -> None:
        uid = str(_meta(pod).get("uid"))
        if self._up.get(name) == uid:
            return
        if self.on_slurmd is None:
            self._up[name] = uid
            return
        task = self._bringup.get(name)
        if task is not None and not task.done():
            return
        self._bringup[name] = asyncio.create_task(self._bring_up(name, uid))

    async def _bring_up(self, name: str, uid: str) -> None:
        assert self.on_slurmd is not None
        try:
            await self.on_slurmd(name, True)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._record(e)  # the next pass tries again
            log.warning("slinky emulator: starting slurmd %s failed: %s", name, e)
        else:
            self._up[name] = uid
        self._kick.set()

    async def _sync_podinfo(self, nodeset: Mapping[str, Any], pod: Mapping[str, Any],
                            name: str, st: SlurmNodeState) -> bool:
        """``UpdateNodeWithPodInfo``: keep the pod's identity in the Slurm node's comment; a
        pod that moved to another Kubernetes node gets its Slurm node back to service. True
        when Slurm was changed."""
        meta = _meta(pod)
        info = {"namespace": self.namespace, "podName": str(meta.get("name")),
                "node": str((pod.get("spec") or {}).get("nodeName") or ""),
                "nodeSetName": str(nodeset["metadata"]["name"]),
                "nodeSetUID": str(nodeset["metadata"].get("uid", ""))}
        try:
            old = json.loads(self._slurm[name][1] or "{}")
        except ValueError:
            old = {}
        if not isinstance(old, dict):
            old = {}
        if all(old.get(k) == info[k] for k in ("namespace", "podName", "node")):
            return False
        await self._scontrol("update", f"nodename={name}",
                             "comment=" + json.dumps(info, separators=(",", ":")))
        if old.get("node") and old["node"] != info["node"] and (st.down or st.drain):
            await self._scontrol("update", f"nodename={name}", "state=resume")
        return True

    async def _condemn(self, pod: Mapping[str, Any], name: str,
                       st: SlurmNodeState | None) -> bool:
        """Scale-in: cordon and drain (overriding the reason), delete once drained. True when
        the pod was deleted."""
        meta = _meta(pod)
        pod_name = str(meta["name"])
        if st is not None and _ours(st):
            if _annotations(pod).get(POD_CORDON) != "true":
                await self._patch_pod(pod, {"metadata": {"annotations": {POD_CORDON: "true"}}})
            await self._make_drain(name, st, f"Pod ({self.namespace}/{pod_name}) is pending "
                                   "termination for scale-in", override=True)
        if st is None or st.drained:
            await call(f"delete pod {self.namespace}/{pod_name}",
                       lambda: self.core.delete_namespaced_pod(pod_name, self.namespace))
            uid = str(meta.get("uid"))
            if uid in self._known:  # it ran: its preStop runs as it terminates
                await self._prestop(uid, name)
            return True
        return False

    async def _sync_cordon(self, pod: dict[str, Any], node: Mapping[str, Any], name: str,
                           st: SlurmNodeState) -> dict[str, Any]:
        """The Cordon step, then ``syncPodUncordon`` (see the module doc)."""
        if _hands_off(st):
            return pod
        meta = _meta(pod)
        pod_ref = f"{self.namespace}/{meta['name']}"
        cordoned = _annotations(pod).get(POD_CORDON) == "true"
        if (node.get("spec") or {}).get("unschedulable"):
            if not cordoned:
                pod = await self._patch_pod(pod, {"metadata": {"annotations": {
                    POD_CORDON: "true"}}})
            reason = sanitise_reason(_annotations(node).get(NODE_CORDON_REASON, "")) or \
                f"Node ({_meta(node)['name']}) was cordoned, Pod ({pod_ref}) must be cordoned"
            await self._make_drain(name, st, reason)
            return pod
        pod_reason = f"Pod ({pod_ref}) was cordoned"
        if cordoned:
            if not st.drain or st.reason == REASON_PREFIX + pod_reason:
                await self._make_drain(name, st, pod_reason)  # the pod alone was cordoned
                return pod
            # the Node was uncordoned: its cordon is undone (syncPodUncordon)
            pod = await self._patch_pod(pod, {"metadata": {"annotations": {POD_CORDON: None}}})
        await self._make_undrain(name, st)
        return pod

    async def _sync_conditions(self, pod: Mapping[str, Any], st: SlurmNodeState | None,
                               protect: bool) -> None:
        desired: dict[str, str] = {}
        if st is not None:
            desired[CONDITION_PREFIX + BASE_CONDITIONS.get(st.base, "Unknown")] = st.reason
            for flag, suffix in FLAG_CONDITIONS.items():
                if flag in st.flags:
                    desired[CONDITION_PREFIX + suffix] = st.reason
        current = {str(c.get("type")): c for c in (pod.get("status") or {}).get("conditions")
                   or [] if str(c.get("type", "")).startswith(CONDITION_PREFIX)}
        ops: list[dict[str, Any]] = []
        for ctype, message in desired.items():
            cur = current.get(ctype)
            if cur is not None and cur.get("status") == "True" and \
                    (cur.get("message") or "") == message:
                continue
            since = cur.get("lastTransitionTime") if cur is not None and \
                cur.get("status") == "True" else None
            ops.append({"type": ctype, "status": "True", "message": message,
                        "lastTransitionTime": since or _now()})
        ops += [{"type": ctype, "$patch": "delete"} for ctype in current if ctype not in desired]
        name = str(_meta(pod)["name"])
        if ops:
            await call(f"patch pod status {self.namespace}/{name}",
                       lambda: self.core.patch_namespaced_pod_status(
                           name, self.namespace, {"status": {"conditions": ops}},
                           _content_type="application/strategic-merge-patch+json"))  # type: ignore[call-arg]
        busy = protect and st is not None and st.busy
        if busy != (_labels(pod).get(POD_PROTECT) == "true"):
            await self._patch_pod(pod, {"metadata": {"labels": {
                POD_PROTECT: "true" if busy else None}}})

    async def _sync_status(self, nodeset: Mapping[str, Any], pods: list[dict[str, Any]]) -> None:
        meta = nodeset["metadata"]
        states = [st for st in (self._state(slurm_node_name(p)) for p in pods) if st]
        ready = sum(1 for p in pods if _running(p) and _ready(p))
        status = {
            "replicas": len(pods), "updatedReplicas": len(pods), "readyReplicas": ready,
            "availableReplicas": ready, "unavailableReplicas": len(pods) - ready,
            "slurmIdle": sum(1 for s in states if s.base == "IDLE"),
            "slurmAllocated": sum(1 for s in states if s.base in ("ALLOCATED", "MIXED")),
            "slurmDown": sum(1 for s in states if s.base == "DOWN"),
            "slurmDrain": sum(1 for s in states if s.drain),
            "observedGeneration": int(meta.get("generation") or 0),
            "selector": f"{NAME_LABEL}=slurmd,{INSTANCE_LABEL}={meta['name']}",
        }
        current = nodeset.get("status") or {}
        if all(current.get(k) == v for k, v in status.items()):
            return
        with contextlib.suppress(NotFoundError):
            await call(f"patch NodeSet status {self.namespace}/{meta['name']}",
                       lambda: self.co.patch_namespaced_custom_object_status(
                           GROUP, VERSION, self.namespace, PLURAL, meta["name"],
                           {"status": status},
                           _content_type="application/merge-patch+json"))  # type: ignore[call-arg]

    async def _ensure_pdb(self) -> None:
        """The cluster's worker PDB: busy pods (``pod-protect=true``) may not be evicted."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._pdb_checked < 10.0:
            return
        name = f"{self.cluster}-worker-protect"
        body = {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": self.namespace,
                         "labels": {CLUSTER_LABEL: self.cluster,
                                    COMPONENT_LABEL: "worker"}},
            "spec": {"maxUnavailable": 0,
                     "selector": {"matchLabels": {CLUSTER_LABEL: self.cluster,
                                                  POD_PROTECT: "true"}}},
        }
        try:
            await call(f"read PodDisruptionBudget {self.namespace}/{name}",
                       lambda: self.pdbs.read_namespaced_pod_disruption_budget(
                           name, self.namespace))
        except NotFoundError:
            with contextlib.suppress(ConflictError):
                await call(f"create PodDisruptionBudget {self.namespace}/{name}",
                           lambda: self.pdbs.create_namespaced_pod_disruption_budget(
                               self.namespace, body))  # type: ignore[arg-type]
        self._pdb_checked = loop.time()
