"""The warm-spare pool on Kubernetes nodes.

A spare is a node matching the fleet's spare selector (default ``healer.io/role=spare``) and
tainted ``healer.io/spare=true:NoSchedule`` so nothing lands on it by accident. Claiming one is
a single merge patch guarded by the node's ``resourceVersion``: it marks the claim
(``healer.io/claimed-by=<incident>``, and the label ``healer.io/claim=<digest of the incident>``
so that "the spare this incident holds" is one label-selected read, never a list of the fleet),
takes the node out of the pool (removes the spare label) and adds the labels a NodeSet needs to
place its slurmd there. The spare taint stays: a claimed spare is still *closed*, because the
Slinky operator adds no affinity and a recreated slurmd pod would land on any open Node its
NodeSet selects (with two swaps in flight, on the other's spare). The workload move opens it
(:class:`healer.adapters.slinky_workload.SlinkyWorkload`) at the moment it evicts; ``release`` and
``return_to_pool`` close it again. Two claimers racing
for one spare: one patch wins, the other gets 409 and picks the next spare. Choosing is
topology-aware (same NVLink domain, then the lowest shared fabric tier, then any; only the
same domain with the policy's ``swap.requireSameDomain``).

With spare validation on (FleetGuardrails ``spareValidation``; :attr:`KubeSparePool.validation`),
a claim takes only a spare whose validation is recent and passed, best-ranked first; with none,
it validates the best-ranked candidate first (one at a time) and answers
:class:`~healer.ports.PendingClaim` until that run ends. A spare that failed its validation
(``SPARE_FAILED_LABEL``) is not in the pool.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from healer.adapters.clock import SYSTEM_CLOCK
from healer.adapters.kube.nodes import KubeNodes, node_view
from healer.adapters.spare_validation import SpareValidator, is_failed_spare
from healer.core.model import NodeView
from healer.core.nodesets import Toleration, untolerated
from healer.core.rules import LabelSelector
from healer.core.spare_validation import Readiness
from healer.core.timefmt import rfc3339
from healer.core.topology import (
    TOPOGRAPH,
    TOPOLOGY_ANNOTATION,
    TopologyKeys,
    rank_spares,
    same_domain_spares,
    slinky_topology_spec,
)
from healer.core.vocabulary import (
    CLAIM_LABEL,
    CLAIMED_AT,
    CLAIMED_BY,
    REPAIR_LABEL,
    REPAIR_RESULT,
    SPARE_TAINT,
    TAINT_EFFECT,
    TAINT_VALUE,
)
from healer.errors import ConflictError, NotFoundError
from healer.ports import Clock, PendingClaim


class KubeSparePool:
    def __init__(self, nodes: KubeNodes, selector: LabelSelector,
                 claim_labels: Mapping[str, str] | None = None,
                 labels_provider: Callable[[], Awaitable[Mapping[str, str]]] | None = None,
                 *, topology_name: str | None = None, keys: TopologyKeys = TOPOGRAPH,
                 tolerations: Sequence[Toleration] | None = None,
                 clock: Clock = SYSTEM_CLOCK, validation: SpareValidator | None = None) -> None:
        self.nodes = nodes
        self.clock = clock  # the claim's time (CLAIMED_AT)
        self.selector = selector
        #: the labels placement reads (the NodeSet's), and the taints its slurmd pods
        #: tolerate: a spare with another taint (healer's own spare taint aside) can never
        #: host one, so it is no candidate (None: not said, no spare is left out for taints)
        self.keys = keys
        self.tolerations = tuple(tolerations) if tolerations is not None else None
        self.claim_labels = dict(claim_labels or {})
        self._provider = labels_provider
        # with a topology name, the claim itself writes the spare's topology annotation (from
        # its fabric labels): the operator may start serving the replacement as soon as its
        # slurmd registers, so the topology must already be right by then
        self.topology_name = topology_name
        #: spare validation (the daemon's one validator, given by the composition root); None:
        #: every free spare is claimable
        self.validation = validation
        # while the node watch runs, the pool and the claims are looked up in its cache
        for key in self.selector.match_labels:
            nodes.cache.index(key)
        nodes.cache.index(CLAIM_LABEL)

    def _cached_candidates(self) -> list[dict[str, Any]] | None:
        """The nodes the selector may match, from the watch's cache (None: not synced)."""
        cache = self.nodes.cache
        if not cache.synced:
            return None
        names: set[str] | None = None
        for key, value in self.selector.match_labels.items():
            found = cache.with_label(key, value)
            if found is None:
                continue
            names = found if names is None else names & found
        out = []
        for name in sorted(names) if names is not None else sorted(v.name for v in cache.views()):
            c = cache.get(name)
            if c is not None:
                raw = c.raw()
                raw["status"] = {"conditions": [
                    {"type": x.type, "status": x.status} for x in c.view.conditions]}
                out.append(raw)
        return out

    async def _free(self, fresh: bool = False) -> list[tuple[NodeView, dict[str, Any]]]:
        """The free spares (from the watch's cache unless ``fresh``: read from the API)."""
        items = None if fresh else self._cached_candidates()
        if items is None:
            items, _ = await self.nodes.list_raw(self.selector.to_query())
        out = []
        for raw in items:
            v = node_view(raw)
            if v.annotations.get(CLAIMED_BY) or v.unschedulable or not v.ready:
                continue
            if is_failed_spare(v):  # failed its validation: out of the pool, in repair
                continue
            if not self.selector.matches(v.labels):
                continue
            if self.tolerations is not None and untolerated(_taints(raw), self.tolerations,
                                                            _OWN_TAINTS):
                continue
            out.append((v, raw))
        return out

    async def choose(self, node: str) -> str | None:
        bad = await self.nodes.view(node)
        ranked = rank_spares(bad, [v for v, _ in await self._free()], self.keys)
        return ranked[0].name if ranked else None

    async def held_by(self, incident: str) -> str | None:
        """The spare ``incident`` holds, if any (one label-selected read, or the watch's
        cache: healer's own claim is in it from the claim's answer on)."""
        digest = claim_digest(incident)
        cache = self.nodes.cache
        names = cache.with_label(CLAIM_LABEL, digest) if cache.synced else None
        if names is not None:
            items = [c.raw() for n in sorted(names) if (c := cache.get(n)) is not None]
        else:
            items, _ = await self.nodes.list_raw(f"{CLAIM_LABEL}={digest}")
        for raw in items:
            if (raw["metadata"].get("annotations") or {}).get(CLAIMED_BY) == incident:
                return str(raw["metadata"]["name"])
        return None

    async def claim(self, node: str, incident: str, *, same_domain: bool = False,
                    labels: Mapping[str, str] | None = None) -> str | PendingClaim | None:
        held = await self.held_by(incident)
        if held is not None:  # idempotent: this incident already holds a spare
            return held
        try:
            bad = await self.nodes.view(node)
        except NotFoundError:
            if labels is None:
                raise
            bad = NodeView(node, dict(labels))  # a dead node the cloud deleted: as it was
        if self._provider is not None:  # e.g. the NodeSet's nodeSelector, read fresh
            self.claim_labels = dict(await self._provider())
        validating: str | None = None
        fresh = False  # after a conflict the cache was behind: read the pool from the API
        for _ in range(5):
            free = await self._free(fresh)
            by_name = {v.name: raw for v, raw in free}
            rank = same_domain_spares if same_domain else rank_spares
            ranked = rank(bad, [v for v, _ in free], self.keys)
            if self.validation is not None and self.validation.enabled:
                ranked, validating = await self._validated(ranked)
                by_name.update({v.name: raw for v, raw in await self._free()
                                if v.name in {c.name for c in ranked}})
            for cand in ranked:
                raw = by_name[cand.name]
                try:
                    await self.nodes._patch(cand.name, self._claim_patch(raw, incident))
                    return cand.name
                except ConflictError:
                    fresh = True
                    continue  # someone took or changed it: try the next one
            if validating is not None:
                break
        if validating is not None:
            checks = ", ".join(self.validation.settings().checks if self.validation else ())
            return PendingClaim(f"validating warm spare {validating} ({checks}) before "
                                "claiming it")
        return None

    async def _validated(self, ranked: list[NodeView]) -> tuple[list[NodeView], str | None]:
        """The candidates a claim may take now (recent, passed validation), in rank order, and
        the spare being validated for it, if any (at most one run started per claim)."""
        assert self.validation is not None
        ok: list[NodeView] = []
        validating: str | None = None
        unvalidated: list[NodeView] = []
        for cand in ranked:
            ready = await self.validation.for_claim(cand, may_start=False)
            if ready is Readiness.CLAIMABLE:
                ok.append(cand)
            elif ready is Readiness.VALIDATING and validating is None:
                validating = cand.name
            elif ready is Readiness.VALIDATE:
                unvalidated.append(cand)
        if not ok and validating is None and unvalidated:  # validate the best one first
            ready = await self.validation.for_claim(unvalidated[0], may_start=True)
            if ready is Readiness.CLAIMABLE:
                ok.append(unvalidated[0])
            elif ready is Readiness.VALIDATING:
                validating = unvalidated[0].name
        return ok, validating

    def _claim_patch(self, raw: dict[str, Any], incident: str) -> dict[str, Any]:
        labels: dict[str, str | None] = dict.fromkeys(self.selector.match_labels)
        labels.update(self.claim_labels)
        labels[CLAIM_LABEL] = claim_digest(incident)
        # the spare taint stays (closed until the move opens it); make sure it is there
        taints = [t for t in (raw.get("spec") or {}).get("taints") or []
                  if t.get("key") != SPARE_TAINT]
        taints.append({"key": SPARE_TAINT, "value": TAINT_VALUE, "effect": TAINT_EFFECT})
        annotations = {CLAIMED_BY: incident, CLAIMED_AT: rfc3339(self.clock.now())}
        if self.topology_name is not None:
            spec = slinky_topology_spec(node_view(raw), self.topology_name, self.keys)
            if spec:
                annotations[TOPOLOGY_ANNOTATION] = spec
        return {"metadata": {"resourceVersion": raw["metadata"]["resourceVersion"],
                             "labels": labels, "annotations": annotations},
                "spec": {"taints": taints}}

    async def release(self, spare: str, incident: str) -> None:
        raw = await self.nodes.get_raw(spare)
        ann = raw["metadata"].get("annotations") or {}
        if ann.get(CLAIMED_BY) != incident:
            return
        await self.nodes._patch(spare, self._pool_patch(raw))

    def _pool_patch(self, raw: dict[str, Any]) -> dict[str, Any]:
        taints = [t for t in (raw.get("spec") or {}).get("taints") or []
                  if t.get("key") != SPARE_TAINT]
        taints.append({"key": SPARE_TAINT, "value": TAINT_VALUE, "effect": TAINT_EFFECT})
        labels: dict[str, str | None] = dict(self.selector.match_labels)
        labels.update(dict.fromkeys(self.claim_labels))
        labels[REPAIR_LABEL] = None
        labels[CLAIM_LABEL] = None
        return {"metadata": {"resourceVersion": raw["metadata"]["resourceVersion"],
                             "labels": labels,
                             "annotations": {CLAIMED_BY: None, CLAIMED_AT: None,
                                             REPAIR_RESULT: None}},
                "spec": {"taints": taints}}

    async def return_to_pool(self, node: str, incident: str) -> None:
        """A repaired, validated node joins the pool: healer's cordon comes off (the spare
        taint keeps work away), the spare label goes on."""
        await self.nodes.uncordon(node, incident)
        raw = await self.nodes.get_raw(node)
        await self.nodes._patch(node, self._pool_patch(raw))

    async def depth(self) -> Mapping[str, int]:
        out: dict[str, int] = {}
        for v, _ in await self._free():
            dom = v.labels.get(self.keys.domain, "none")
            out[dom] = out.get(dom, 0) + 1
        return out


#: the taints healer itself puts on a spare (it takes them off to open it)
_OWN_TAINTS = frozenset({SPARE_TAINT})


def _taints(raw: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    return [(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
            for t in (raw.get("spec") or {}).get("taints") or []]


def claim_digest(incident: str) -> str:
    """A label value naming ``incident`` (incident ids may exceed a label value's 63 bytes)."""
    return hashlib.sha256(incident.encode()).hexdigest()[:40]

