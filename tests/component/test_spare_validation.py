"""Spare validation on fakes with a manual clock: the real KubeSparePool claim, SpareValidator
and RepairRouter over an in-memory Node store (merge patches guarded by resourceVersion, as the
API server does) and scripted check Jobs."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from healer.adapters.hooks import RepairRouter
from healer.adapters.kube.node_cache import NodeCache
from healer.adapters.kube.nodes import node_view
from healer.adapters.kube.spares import KubeSparePool
from healer.adapters.spare_validation import CheckReport, SpareValidator
from healer.core.model import NodeView
from healer.core.nodesets import NodeSetRules, NodeSets
from healer.core.phases import Phase
from healer.core.rules import FleetRules, LabelSelector, PolicySet
from healer.core.spare_validation import (
    SpareCheck,
    SpareValidation,
    ValidationResult,
    ValidationRun,
    bandwidth_table,
)
from healer.core.topology import DOMAIN_LABEL
from healer.core.vocabulary import (
    CLAIMED_BY,
    REPAIR_INCIDENT,
    REPAIR_LABEL,
    REPAIR_RESULT,
    SPARE_FAILED_LABEL,
    SPARE_VALIDATION,
    SPARE_VALIDATION_RUN,
    StepName,
)
from healer.errors import ConflictError, TransientError
from healer.obs.http import Health
from healer.ports import NodeEvent, PendingClaim
from healer.runtime.spare_validation import spare_nodes, validate_spares
from healer_dev.testing import FakeEvents, ManualClock, fake_ports
from tests.component.test_controller import fleet, make

HOUR = 3600.0
DATA = Path(__file__).parents[1] / "unit" / "data" / "spare_checks"
DCGM_FAIL = (DATA / "dcgm_diag_r2_fail.json").read_text()
ALL_REDUCE = (DATA / "all_reduce_perf_h100x8.txt").read_text()
SPARE = LabelSelector({"healer.io/role": "spare"})
POLICY = SpareValidation(enabled=True, max_age=12 * HOUR, interval=6 * HOUR, on_claim=True,
                         checks=(SpareCheck.DCGM_DIAG, SpareCheck.NCCL_LOOPBACK),
                         bus_bandwidth_gbps=bandwidth_table({"NVIDIA H100 80GB HBM3": 400.0,
                                                             "default": 100.0}),
                         max_parallel=2)


class RawNodes:
    """Nodes as the API server keeps them: JSON objects, merge patches, resourceVersions."""

    def __init__(self) -> None:
        self.raw: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.lists = 0
        self.cache = NodeCache()  # no watch runs here: never synced, every read goes to "API"

    def add(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str] = {}
            ) -> None:
        self.version += 1
        self.raw[name] = {"metadata": {"name": name, "labels": dict(labels),
                                       "annotations": dict(annotations),
                                       "resourceVersion": str(self.version)},
                          "spec": {"taints": [{"key": "healer.io/spare", "value": "true",
                                               "effect": "NoSchedule"}]},
                          "status": {"conditions": [{"type": "Ready", "status": "True"}]}}

    async def get_raw(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.raw[name])

    async def get(self, name: str) -> NodeView:
        return node_view(self.raw[name])

    async def view(self, name: str) -> NodeView:
        return await self.get(name)

    async def list_raw(self, selector: str = "") -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        want = dict(p.split("=", 1) for p in selector.split(",") if "=" in p)
        return [copy.deepcopy(r) for r in self.raw.values()
                if all(r["metadata"]["labels"].get(k) == v for k, v in want.items())], ""

    async def list(self, selector: str = "") -> list[NodeView]:
        return [node_view(r) for r in (await self.list_raw(selector))[0]]

    def watch(self) -> AsyncIterator[NodeEvent]:
        raise NotImplementedError

    async def cordon(self, name: str, incident: str, reason: str) -> bool:
        raise NotImplementedError

    async def uncordon(self, name: str, incident: str) -> bool:
        return False

    async def _patch(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        raw = self.raw[name]
        meta = body.get("metadata") or {}
        if meta.get("resourceVersion") not in (None, raw["metadata"]["resourceVersion"]):
            raise ConflictError(f"node {name} changed")
        for part in ("labels", "annotations"):
            for k, v in (meta.get(part) or {}).items():
                if v is None:
                    raw["metadata"][part].pop(k, None)
                else:
                    raw["metadata"][part][k] = v
        if "spec" in body:
            raw["spec"].update(body["spec"])
        self.version += 1
        raw["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(raw)

    async def patch_metadata(self, name: str, *, labels: Mapping[str, str | None] | None = None,
                             annotations: Mapping[str, str | None] | None = None,
                             resource_version: str | None = None) -> NodeView:
        return node_view(await self._patch(name, {"metadata": {
            "labels": dict(labels or {}), "annotations": dict(annotations or {}),
            "resourceVersion": resource_version}}))


class ScriptedJobs:
    """Check Jobs whose end the test decides; each Job is created once (by its name)."""

    def __init__(self, nodes: RawNodes) -> None:
        self.nodes = nodes
        self.created: list[tuple[str, str, str]] = []
        self.outcome: dict[str, CheckReport] = {}  # node → report for every check (default)
        self.finished: set[tuple[str, str, str]] = set()

    async def run(self, node: str, run: str, check: str, *, model: str,
                  deadline: float) -> CheckReport | None:
        job = (node, run, check)
        if job not in self.created:
            # intent first: the run is on the Node before its first Job exists
            ann = self.nodes.raw[node]["metadata"]["annotations"]
            named = ValidationRun.from_annotation(ann.get(SPARE_VALIDATION_RUN))
            assert named is not None
            assert named.run == run
            self.created.append(job)
            return None
        if job not in self.finished:
            return None
        default = CheckReport(0, f"healer-check {check} exit=0\n{ALL_REDUCE}")
        return self.outcome.get(f"{node}/{check}", default)

    def finish_all(self) -> None:
        self.finished.update(self.created)

    def running(self) -> set[str]:
        return {job[0] for job in self.created if job not in self.finished}


def world(clock: ManualClock, policy: SpareValidation = POLICY
          ) -> tuple[RawNodes, ScriptedJobs, FakeEvents, KubeSparePool, SpareValidator]:
    nodes = RawNodes()
    nodes.add("bad", {DOMAIN_LABEL: "d1"})
    jobs = ScriptedJobs(nodes)
    events = FakeEvents()
    pool, validator = wire(nodes, jobs, events, clock, policy)
    return nodes, jobs, events, pool, validator


def wire(nodes: RawNodes, jobs: ScriptedJobs, events: FakeEvents, clock: ManualClock,
         policy: SpareValidation = POLICY) -> tuple[KubeSparePool, SpareValidator]:
    validator = SpareValidator(nodes, events, RepairRouter(nodes, {}), jobs,
                               settings=lambda: policy, clock=clock)
    pool = KubeSparePool(nodes, SPARE)  # type: ignore[arg-type]
    pool.validation = validator
    return pool, validator


def spare(nodes: RawNodes, name: str, domain: str, result: ValidationResult | None = None,
          model: str = "NVIDIA-H100-80GB-HBM3") -> None:
    ann = {SPARE_VALIDATION: result.to_annotation()} if result else {}
    nodes.add(name, {"healer.io/role": "spare", DOMAIN_LABEL: domain,
                     "nvidia.com/gpu.product": model}, ann)


async def test_claim_passes_over_a_failed_spare_and_takes_the_validated_one() -> None:
    clock = ManualClock()
    nodes, jobs, _events, pool, _ = world(clock)
    checks = ("dcgm-diag", "nccl-loopback")
    spare(nodes, "near-failed", "d1", ValidationResult(False, clock.now() - HOUR, checks, "x"))
    spare(nodes, "near-stale", "d1", ValidationResult(True, clock.now() - 13 * HOUR, checks))
    spare(nodes, "far-ok", "d2", ValidationResult(True, clock.now() - HOUR, checks))
    assert await pool.claim("bad", "inc-1") == "far-ok"
    assert nodes.raw["far-ok"]["metadata"]["annotations"][CLAIMED_BY] == "inc-1"
    assert jobs.created == []  # a validated spare was there: nothing ran
    assert await pool.depth() == {"d1": 1}  # the failed spare is not in the pool


async def test_claim_validates_first_a_failing_spare_goes_to_repair_the_next_is_claimed(
        ) -> None:
    clock = ManualClock()
    nodes, jobs, events, pool, _ = world(clock)
    spare(nodes, "near", "d1")
    spare(nodes, "far", "d2")
    jobs.outcome["near/dcgm-diag"] = CheckReport(226, "healer-check dcgm-diag exit=226\n",
                                                 dcgm_json=DCGM_FAIL)
    first = await pool.claim("bad", "inc-1")
    assert isinstance(first, PendingClaim)
    assert "validating warm spare near (dcgm-diag, nccl-loopback)" in first.detail
    assert [j[0] for j in jobs.created] == ["near"]  # one candidate at a time
    assert isinstance(await pool.claim("bad", "inc-1"), PendingClaim)
    assert len(jobs.created) == 1  # polling again never made a second Job
    jobs.finish_all()
    await clock.advance(60)
    second = await pool.claim("bad", "inc-1")  # near fails: out of the pool; far is started
    assert isinstance(second, PendingClaim)
    assert "far" in second.detail
    near = nodes.raw["near"]["metadata"]
    assert near["labels"][SPARE_FAILED_LABEL] == "true"
    assert near["labels"]["healer.io/role"] == "spare"  # someone else's label is kept
    assert near["labels"][REPAIR_LABEL] == "pending"
    near_result = ValidationResult.from_annotation(near["annotations"][SPARE_VALIDATION])
    assert near_result is not None
    assert not near_result.passed
    assert SPARE_VALIDATION_RUN not in near["annotations"]
    (node, reason, kind, note), = events.events.values()
    assert (node, reason, kind) == ("near", "SpareFailedValidation", "Warning")
    assert "failed dcgm-diag" in note
    assert "GPU Memory (GPU 3): Detected a DBE error" in note
    # far: dcgm-diag passes, then nccl-loopback (a second Job of the same run), then claimed
    jobs.finish_all()
    assert isinstance(await pool.claim("bad", "inc-1"), PendingClaim)
    assert [(n, c) for n, _, c in jobs.created] == [
        ("near", "dcgm-diag"), ("far", "dcgm-diag"), ("far", "nccl-loopback")]
    jobs.finish_all()
    assert await pool.claim("bad", "inc-1") == "far"
    result = ValidationResult.from_annotation(
        nodes.raw["far"]["metadata"]["annotations"][SPARE_VALIDATION])
    assert result is not None
    assert result.passed
    assert "422.931 GB/s, at least the 400 GB/s threshold" in result.detail


async def test_a_restarted_leader_reuses_the_running_job() -> None:
    clock = ManualClock()
    nodes, jobs, _events, pool, _ = world(clock)
    spare(nodes, "only", "d1")
    assert isinstance(await pool.claim("bad", "inc-1"), PendingClaim)
    pool2, _ = wire(nodes, jobs, FakeEvents(), clock)  # a new leader: nothing in memory
    assert isinstance(await pool2.claim("bad", "inc-1"), PendingClaim)
    assert len(jobs.created) == 1
    jobs.finish_all()
    assert isinstance(await pool2.claim("bad", "inc-1"), PendingClaim)  # nccl-loopback
    jobs.finish_all()
    assert await pool2.claim("bad", "inc-1") == "only"
    assert len(jobs.created) == 2


async def test_without_on_claim_only_validated_spares_are_taken() -> None:
    clock = ManualClock()
    policy = dataclasses.replace(POLICY, on_claim=False)
    nodes, jobs, _, pool, _ = world(clock, policy)
    spare(nodes, "never-validated", "d1")
    assert await pool.claim("bad", "inc-1") is None
    assert jobs.created == []


async def test_a_below_threshold_bandwidth_fails_the_spare_with_the_figure() -> None:
    clock = ManualClock()
    nodes, jobs, events, _, validator = world(clock)
    spare(nodes, "slow", "d1")
    slow = ALL_REDUCE.replace("422.931", "371.2")
    jobs.outcome["slow/nccl-loopback"] = CheckReport(0, f"healer-check nccl-loopback exit=0\n"
                                                        f"{slow}")
    await validator.start("slow")
    jobs.finish_all()
    assert await validator.advance("slow") is None  # dcgm passed; nccl-loopback started
    jobs.finish_all()
    result = await validator.advance("slow")
    assert result is not None
    assert not result.passed
    (_, reason, _, note), = events.events.values()
    assert reason == "SpareFailedValidation"
    assert "nccl-loopback (371.2 GB/s)" in note
    assert "below the 400 GB/s threshold" in note


async def test_a_check_that_could_not_run_sends_nothing_to_repair_and_is_tried_again(
        ) -> None:
    clock = ManualClock()
    nodes, jobs, events, pool, validator = world(clock)
    spare(nodes, "near", "d1")
    spare(nodes, "far", "d2")
    # near's Job ends with no report (e.g. admission refused its pod; the Job hit its deadline)
    jobs.outcome["near/dcgm-diag"] = CheckReport(None, "", "spare dcgm-diag Job x failed: "
                                                           "Job was active longer than deadline")
    assert isinstance(await pool.claim("bad", "inc-1"), PendingClaim)
    jobs.finish_all()
    second = await pool.claim("bad", "inc-1")  # near could not run: the claim moves on
    assert isinstance(second, PendingClaim)
    assert "far" in second.detail
    near = nodes.raw["near"]["metadata"]
    assert SPARE_FAILED_LABEL not in near["labels"]
    assert REPAIR_LABEL not in near["labels"]  # no hardware verdict: nothing to repair
    result = ValidationResult.from_annotation(near["annotations"][SPARE_VALIDATION])
    assert result is not None
    assert not result.passed
    assert not result.ran
    assert events.reasons("near") == ["SpareValidationNotRun"]
    (_, _, kind, note), = events.events.values()
    assert kind == "Warning"
    assert "dcgm-diag could not run on warm spare near" in note
    assert "longer than deadline" in note
    assert await pool.depth() == {"d2": 1}  # out of the pool meanwhile
    await clock.advance(6 * HOUR)
    del jobs.outcome["near/dcgm-diag"]
    plan = await validator.periodic_round(await nodes.list("healer.io/role=spare"))
    assert "near" in plan.start  # tried again after the interval


async def test_the_periodic_round_is_bounded_and_validates_every_spare_in_turn() -> None:
    clock = ManualClock()
    nodes, jobs, _, _, validator = world(clock)
    for i in range(10):
        spare(nodes, f"s{i}", "d1")
    most = 0
    for _ in range(40):
        await validator.periodic_round(await nodes.list("healer.io/role=spare"))
        most = max(most, len(jobs.running()))
        jobs.finish_all()
        await clock.advance(30)
    assert most == 2  # maxParallel
    results = [ValidationResult.from_annotation(
        nodes.raw[f"s{i}"]["metadata"]["annotations"].get(SPARE_VALIDATION)) for i in range(10)]
    assert all(r is not None and r.passed for r in results)
    before = len(jobs.created)
    await validator.periodic_round(await nodes.list("healer.io/role=spare"))
    assert len(jobs.created) == before  # nothing due before the interval
    await clock.advance(6 * HOUR)
    await validator.periodic_round(await nodes.list("healer.io/role=spare"))
    assert len(jobs.created) == before + 2  # due again, two at a time


async def test_a_claimed_spare_is_not_validated_and_a_repaired_one_returns() -> None:
    clock = ManualClock()
    nodes, _jobs, events, _, validator = world(clock)
    spare(nodes, "claimed", "d1")
    nodes.raw["claimed"]["metadata"]["annotations"][CLAIMED_BY] = "inc-9"
    spare(nodes, "repaired", "d1")
    nodes.raw["repaired"]["metadata"]["labels"].update({SPARE_FAILED_LABEL: "true",
                                                        REPAIR_LABEL: "pending"})
    nodes.raw["repaired"]["metadata"]["annotations"].update({
        REPAIR_INCIDENT: "spare-repaired-20260105t080000z", REPAIR_RESULT: "passed",
        SPARE_VALIDATION: ValidationResult(False, clock.now() - HOUR, ("dcgm-diag",)
                                           ).to_annotation()})
    plan = await validator.periodic_round(await nodes.list("healer.io/role=spare"))
    assert plan.start == ()
    meta = nodes.raw["repaired"]["metadata"]
    assert SPARE_FAILED_LABEL not in meta["labels"]
    assert REPAIR_LABEL not in meta["labels"]
    assert SPARE_VALIDATION not in meta["annotations"]
    assert "SpareRepaired" in events.reasons("repaired")
    plan = await validator.periodic_round(await nodes.list("healer.io/role=spare"))
    assert plan.start == ("repaired",)  # back in the pool, validated before any claim


@pytest.mark.parametrize("enabled", [False])
async def test_validation_off_claims_as_before(enabled: bool) -> None:
    clock = ManualClock()
    nodes, jobs, _, pool, validator = world(clock, SpareValidation(enabled=enabled))
    spare(nodes, "s", "d1")
    assert await pool.claim("bad", "inc-1") == "s"
    assert (await validator.periodic_round(await nodes.list())).start == ()
    assert jobs.created == []


class ValidatingFirst:
    """The fake spare pool, except that its first ``pending`` claims wait for a validation."""

    def __init__(self, spares: Any, pending: int) -> None:
        self.spares = spares
        self.pending = pending

    async def claim(self, node: str, incident: str, *, same_domain: bool = False,
                    labels: Any = None) -> str | PendingClaim | None:
        if self.pending > 0:
            self.pending -= 1
            return PendingClaim("validating warm spare spare-a (dcgm-diag) before claiming it")
        out: str | None = await self.spares.claim(node, incident, same_domain=same_domain)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.spares, name)


async def test_the_remediation_waits_in_its_claim_step_while_the_spare_is_validated() -> None:
    fakes = fake_ports(fleet())
    pool = fakes["spares"] = ValidatingFirst(fakes["spares"], pending=1000)
    h = await make(fakes=fakes)
    try:
        await h.xid("gpu-1")
        await h.run(20)
        assert h.phase("gpu-1") is Phase.CORDONED
        rec = next(r for r, _ in h.store.objects.values() if r.node == "gpu-1")
        claim = rec.step(StepName.CLAIM_SPARE)
        assert claim is not None
        assert not claim.done
        assert claim.error == "validating warm spare spare-a (dcgm-diag) before claiming it"
        assert pool.pending < 1000 - 1  # polled again while it waits
        pool.pending = 0  # the validation passed
        await h.run(60)
        rec = next(r for r, _ in h.store.objects.values() if r.node == "gpu-1")
        assert rec.spare == "spare-a"
        assert h.phase("gpu-1") is Phase.REPAIR  # swapped; the bad node went to repair
    finally:
        await h.close()


async def test_the_loop_validates_only_while_acting_and_survives_a_failing_round() -> None:
    clock = ManualClock()
    nodes, jobs, _, _, validator = world(clock)
    spare(nodes, "s0", "d1")
    health = Health(clock=clock.now)
    acting = {"now": False}
    lists = {"n": 0}

    async def spares() -> list[NodeView]:
        lists["n"] += 1
        if lists["n"] == 2:
            raise TransientError("list nodes: HTTP 503")
        return await nodes.list("healer.io/role=spare")

    task = asyncio.create_task(validate_spares(health, validator, spares, lambda: acting["now"],
                                               clock, every=30.0))
    try:
        await clock.advance(120)
        assert lists["n"] == 0  # observe / dryRun / follower: no round, no Job
        assert jobs.created == []
        acting["now"] = True
        await clock.advance(30)
        assert lists["n"] == 1
        assert [j[0] for j in jobs.created] == ["s0"]
        with capture_logs() as logs:
            await clock.advance(30)  # the failing round is logged, the loop goes on
            await clock.advance(30)
        assert lists["n"] == 3
        assert not task.done()
        assert [(e["event"], e.get("error")) for e in logs
                if "round failed" in e["event"] or "recovered" in e["event"]] == [
            ("spare validation round failed", "list nodes: HTTP 503"),
            ("spare validation recovered", None)]
        ok, beats = health.healthy()
        assert ok
        assert "spare-validation" in beats
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_loop_reads_the_fleets_and_every_nodesets_spares_once_each() -> None:
    nodes = RawNodes()
    nodes.add("fleet-spare", {"healer.io/role": "spare"})
    nodes.add("east-spare", {"pool": "east"})
    nodes.add("both", {"healer.io/role": "spare", "pool": "east"})
    nodes.add("worker", {"pool": "west"})
    east = NodeSetRules("east", LabelSelector({"nodeset": "east"}), "c1",
                        spare_selector=LabelSelector({"pool": "east"}))
    same = NodeSetRules("same", LabelSelector({"nodeset": "same"}), "c1",
                        spare_selector=LabelSelector({"pool": "east"}))
    default = NodeSetRules("default", LabelSelector({"nodeset": "d"}), "c1")  # the fleet's
    ps = PolicySet((), FleetRules(spare_selector=SPARE),
                   nodesets=NodeSets((east, same, default)))
    found = await spare_nodes(nodes, ps)
    assert [v.name for v in found] == ["both", "east-spare", "fleet-spare"]
    assert nodes.lists == 2  # one read per distinct selector
