"""The topology step: the Slinky annotation on a replacement node, the proof that Slurm got it,
and that Slurm registered the replacement so that it will really schedule on it.

The step ends DONE only when the replacement is placed and annotated the way Slurm will see it:

1. **The annotation** ``topology.slinky.slurm.net/spec`` on the replacement Node, from one of two
   sources:

   * ``labels`` (default): computed from the Node's topograph fabric labels
     (:func:`healer.core.topology.slinky_topology_spec`), written, and read back. A Node without
     such labels gets nothing written; what it carries (maybe nothing) is verified as is.
   * ``topograph``: healer does not compute it. It POSTs the operator's ``/v1/generate`` request
     once per incident (kept in memory: a repeat after a restart is harmless, topograph merges
     requests), waits while topograph reports the request in progress, then waits until the
     annotation is on the Node (topograph's slinky engine with ``useDynamicNodes`` writes it).
     A request topograph refuses (4xx) fails the step with topograph's answer; an unreachable
     topograph is a TransientError (retried by the executor within the step's attempt budget).

2. **Verification** of that annotation (the spec) before undrain:

   a. placement: the slurmd pod of the Slurm node runs on the replacement Node;
   b. the Slinky operator has copied the Node's annotation to that pod (v1.1+ does so in its
      pod-binding webhook and on every NodeSet sync, and the slurmd reads it from there), with
      the same value. slurm-operator v1.0 never copies it: when the ``copies_topology`` probe
      says so, b is skipped and the note says so (a probe that cannot tell: b is awaited);
   c. where Slurm reports the node's topology (slurmrestd v0.0.44 node ``topology``,
      ``scontrol`` on Slurm >= 25.05), it equals the annotation; where Slurm keeps topology
      strings but has none for the node yet and the operator pushes them (v1.1+), it is
      awaited. Not reported (older Slurm): skipped.

3. **Registration** (ADR 0017, :mod:`healer.adapters.slurm.registration`): the replacement's
   Slurm node is valid as the NodeSet declared it: no ``INVALID_REG`` (in Slurm's view, or in
   the pod's mirrored conditions), the ``--conf`` features, the GPU count. A replacement that
   fails is never undrained by healer: the step FAILS with the reason, which escalates the
   remediation with an Event saying it (an ``INVALID_REG`` node stays drained by Slurm). Slurm
   is read right after the placement, before waiting for the operator's copy (b): a refused
   registration fails at once, without waiting for the pod to mirror it.

   Without Slinky (no slurmd pods in the NodeSet namespace, or no pod finder) a and b are
   skipped, and the result says so. Anything not yet true is PENDING with a message naming what
   is awaited; the policy's step deadline escalates a wait that never ends.

DONE's data: ``topology`` (the verified spec, "" if none), ``source``, ``slurmNode`` and
``checks`` (the checks that passed, comma-separated); with Slinky pods also
``operatorCopiesTopology`` ("true"/"false").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from healer.adapters.slinky import pod_state, slurm_name
from healer.adapters.slurm.registration import Declared, declared_by_pod, registration_problems
from healer.adapters.topograph import RequestState, RequestStatus
from healer.core.topology import TOPOGRAPH, TOPOLOGY_ANNOTATION, TopologyKeys, slinky_topology_spec
from healer.errors import NotFoundError, PermanentError, TransientError
from healer.ports import HookResult, NodeAPI, SlurmNodeState, StepOutcome

SOURCES = ("labels", "topograph")
NO_COPY_NOTE = ("slurm-operator <v1.1 does not copy topology to pods: verified the Node "
                "annotation and placement only")


class SlurmdPods(Protocol):
    """The live (not terminating) slurmd pods of the Slinky cluster, as dicts
    (:class:`healer.adapters.slinky.SlinkyPods`)."""

    async def pods(self) -> list[dict[str, Any]]: ...


class SlurmNodeReader(Protocol):
    """Slurm's own view of a node (any :class:`~healer.ports.SlurmDriver`)."""

    async def state(self, node: str) -> SlurmNodeState: ...


class TopographAPI(Protocol):
    """:class:`healer.adapters.topograph.TopographClient`."""

    async def generate(self) -> str: ...

    async def status(self, uid: str) -> RequestStatus: ...


def same_topology(reported: str, spec: str) -> bool:
    """Slurm's topology string against the annotation: the same comma-separated entries
    (``<topology>:<block>`` or ``<topology>:<sw_top>:...:<sw_0>``), order and blanks aside."""
    def entries(s: str) -> frozenset[str]:
        return frozenset(e.strip() for e in s.split(",") if e.strip())

    return entries(reported) == entries(spec)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _pod_ref(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class KubeTopology:
    """The Topology port on Kubernetes (see the module doc).

    ``nodes``: the Node API; ``topology_name``: the Slurm topology the labels source names
    (``default`` without ``topology.yaml`` topologies); ``pods``: where the slurmd pods are
    (None: not on Slinky, placement and pod checks skipped); ``slurm``: Slurm's view of the node
    for the topology check (None: skipped); ``topograph``: a client for topograph mode (None:
    the labels source); ``copies_topology``: whether the running operator copies the annotation
    to the slurmd pod (:meth:`healer.adapters.slinky.OperatorCapabilities.copies_topology`;
    None, or a probe answering None: assumed, and awaited).
    """

    def __init__(self, nodes: NodeAPI, topology_name: str = "default", *,
                 pods: SlurmdPods | None = None, slurm: SlurmNodeReader | None = None,
                 topograph: TopographAPI | None = None,
                 copies_topology: Callable[[], Awaitable[bool | None]] | None = None,
                 keys: TopologyKeys = TOPOGRAPH) -> None:
        self.nodes = nodes
        self.keys = keys  # the labels its topology is read from (the NodeSet's)
        self.copies_topology = copies_topology
        self.topology_name = topology_name
        self.pods = pods
        self.slurm = slurm
        self.topograph = topograph
        self.source = "topograph" if topograph is not None else "labels"
        #: incident → the id of the /v1/generate request sent for it (this process only)
        self.requests: dict[str, str] = {}

    async def annotate(self, incident: str, node: str, slurm_node: str) -> HookResult:
        if self.topograph is None:
            got = await self._from_labels(node)
        else:
            got = await self._from_topograph(self.topograph, incident, node)
        if isinstance(got, HookResult):
            return got
        spec, notes = got
        result = await self._verify(node, slurm_node, spec, notes)
        if result.outcome is StepOutcome.DONE:
            self.requests.pop(incident, None)  # a re-run asks topograph again: harmless
        return result

    # -- the annotation --------------------------------------------------------------------

    async def _from_labels(self, node: str) -> HookResult | tuple[str, list[str]]:
        view = await self.nodes.get(node)
        spec = slinky_topology_spec(view, self.topology_name, self.keys)
        if not spec:
            current = view.annotations.get(TOPOLOGY_ANNOTATION, "")
            note = "node has no topology labels" + (
                f"; verifying the annotation it carries ({current})" if current else "")
            return current, [note]
        if view.annotations.get(TOPOLOGY_ANNOTATION) != spec:
            await self.nodes.patch_metadata(node, annotations={TOPOLOGY_ANNOTATION: spec})
        back = await self.nodes.get(node)
        if back.annotations.get(TOPOLOGY_ANNOTATION) != spec:
            return HookResult(StepOutcome.PENDING, f"the {TOPOLOGY_ANNOTATION} annotation "
                                                   f"({spec}) is not visible on {node} yet")
        return spec, []

    async def _from_topograph(self, topograph: TopographAPI, incident: str,
                              node: str) -> HookResult | tuple[str, list[str]]:
        uid = self.requests.get(incident)
        if uid is None:
            try:
                uid = await topograph.generate()
            except PermanentError as e:
                return HookResult(StepOutcome.FAILED, str(e))
            self.requests[incident] = uid
        status: RequestStatus | None = None
        unavailable = ""
        if uid:
            try:
                status = await topograph.status(uid)
            except TransientError as e:
                unavailable = f" (its status is unavailable: {e})"
        state = status.state if status is not None else None
        if state is RequestState.RUNNING:
            return HookResult(StepOutcome.PENDING,
                              f"waiting for topograph request {uid} (topograph merges requests "
                              "for its requestAggregationDelay, then generates) before "
                              f"reading {TOPOLOGY_ANNOTATION} on {node}")
        if state is RequestState.FAILED:
            assert status is not None
            self.requests.pop(incident, None)  # send it again on the next poll
            return HookResult(StepOutcome.PENDING,
                              f"topograph request {uid} failed: {status.detail}; it will be "
                              "sent again")
        spec = (await self.nodes.get(node)).annotations.get(TOPOLOGY_ANNOTATION, "")
        if spec:
            return spec, [f"written by topograph (request {uid or '?'})"]
        why = f"waiting for topograph to write {TOPOLOGY_ANNOTATION} on {node}"
        if state is RequestState.DONE:
            why += (f": request {uid} completed without annotating it; check that the "
                    "request's slinky engine has useDynamicNodes: true and that the node "
                    "hosts a Ready slurmd pod its podSelector and nodeSelector select")
        elif state is RequestState.UNKNOWN:
            self.requests.pop(incident, None)  # send it again on the next poll
            why += f": topograph does not know request {uid} (restarted?); it will be sent again"
        else:
            why += f" (request {uid or 'without an id'}{unavailable})"
        return HookResult(StepOutcome.PENDING, why)

    # -- verification ----------------------------------------------------------------------

    async def _verify(self, node: str, slurm_node: str, spec: str,
                      notes: Sequence[str]) -> HookResult:
        notes = list(notes)
        checks: list[str] = []
        data: dict[str, str] = {}
        name = slurm_node
        declared = Declared()
        pushes: bool | None = None  # whether the operator pushes topology_str (None: no Slinky)
        st: SlurmNodeState | None = None  # Slurm's view of the node, once read
        read = False
        pods = await self.pods.pods() if self.pods is not None else []
        if not pods:
            notes.append("no Slinky slurmd pods (no NodeSet): placement and the operator's "
                         "copy of the annotation not checked")
        else:
            if slurm_node:
                pod = next((p for p in pods if slurm_name(p) == slurm_node), None)
                missing = f"no slurmd pod for Slurm node {slurm_node} yet"
            else:
                pod = next((p for p in pods
                            if (p.get("spec") or {}).get("nodeName") == node), None)
                missing = f"no slurmd pod on {node} yet"
            if pod is None:
                return HookResult(StepOutcome.PENDING, missing)
            name = slurm_name(pod)
            host = str((pod.get("spec") or {}).get("nodeName") or "")
            if host != node:
                where = f"runs on {host}" if host else "is not scheduled yet"
                return HookResult(StepOutcome.PENDING,
                                  f"placement: the slurmd pod {_pod_ref(pod)} of Slurm node "
                                  f"{name} {where}, not on {node}")
            checks.append("placement")
            declared = declared_by_pod(pod)
            mirrored = pod_state(pod)
            if mirrored.invalid_registration:
                return self._invalid(name, node, [
                    f"Slurm refused its registration (INVALID_REG on pod {_pod_ref(pod)}: "
                    f"{mirrored.reason or 'no reason given'})"])
            # Slurm's own view before waiting for the operator's copy: a registration Slurm
            # refused fails now (the pod mirrors Slurm only on the operator's re-list)
            got = await self._registration(name, node, declared)
            if isinstance(got, HookResult):
                return got
            st, read = got, True
            copies = await self.copies_topology() if self.copies_topology is not None else None
            pushes = copies is not False
            if copies is False:
                notes.append(NO_COPY_NOTE)
                data["operatorCopiesTopology"] = "false"
            else:
                copied = (_meta(pod).get("annotations") or {}).get(TOPOLOGY_ANNOTATION, "")
                if copied != spec:
                    unknown = (" (the operator's version is unknown: if it is <v1.1 it never "
                               "copies; let healer read the NodeSet CRD)"
                               if copies is None and self.copies_topology is not None else "")
                    return HookResult(
                        StepOutcome.PENDING,
                        f"the Slinky operator has not propagated {TOPOLOGY_ANNOTATION}="
                        f"{spec or '(none)'} from {node} to pod {_pod_ref(pod)} yet (it has "
                        f"{copied or 'none'}){unknown}")
                checks.append("pod")
                data["operatorCopiesTopology"] = "true"
        if not read:
            got = await self._registration(name, node, declared)
            if isinstance(got, HookResult):
                return got
            st = got
        if st is not None:
            checks.append("registration")
            if not spec:
                pass
            elif not st.topology and st.reports_topology and pushes:
                return HookResult(StepOutcome.PENDING,
                                  f"Slurm has no topology for {name} yet, the annotation on "
                                  f"{node} says {spec}: waiting for the operator to push it")
            elif not st.topology:
                notes.append(f"Slurm has no topology string for {name} (slurm-operator < v1.1"
                             " or no Slinky: nothing pushes it): not checked"
                             if st.reports_topology else
                             f"Slurm does not report the topology of {name} (Slurm < 25.05): "
                             "not checked")
            elif not same_topology(st.topology, spec):
                return HookResult(StepOutcome.PENDING,
                                  f"Slurm reports topology {st.topology} for {name}, the "
                                  f"annotation on {node} says {spec}: waiting for the operator "
                                  "to push it")
            else:
                checks.append("slurm")
        return HookResult(StepOutcome.DONE, "; ".join(notes),
                          {"topology": spec, "source": self.source, "slurmNode": name,
                           "checks": ",".join(checks), **data})

    async def _registration(self, name: str, node: str,
                            declared: Declared) -> SlurmNodeState | HookResult | None:
        """Slurm's view of ``name`` when it registered validly as ``declared``; a PENDING or
        FAILED result when it did not (yet); None without a Slurm driver or a name."""
        if self.slurm is None or not name:
            return None
        try:
            st = await self.slurm.state(name)
        except NotFoundError:
            return HookResult(StepOutcome.PENDING, f"Slurm does not know node {name} yet")
        problems = registration_problems(st, declared)
        if problems:
            return self._invalid(name, node, problems)
        return st

    @staticmethod
    def _invalid(name: str, node: str, problems: Sequence[str]) -> HookResult:
        return HookResult(StepOutcome.FAILED,
                          f"the replacement Slurm node {name} on {node} did not register "
                          f"validly: {'; '.join(problems)}; healer does not undrain it")
