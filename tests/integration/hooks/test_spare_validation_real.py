"""Spare validation against the real kube-apiserver: the shipped check Job templates
(deploy/validation) are valid (server-side dry run, as healer renders them), and a claim
validates spares with real Jobs — kwok ends each Job's pod with the termination message the
template's pod annotation ``healer-test-message`` stands in for (kwok runs no containers): a
spare whose NCCL bus bandwidth is below its GPU model's threshold leaves the pool with an Event
and goes to repair, and the claim takes the next spare once it passed."""

from __future__ import annotations

import base64
import gzip
import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from healer.adapters.clock import SYSTEM_CLOCK
from healer.adapters.hooks import RepairRouter
from healer.adapters.kube.check_jobs import KubeCheckJobs
from healer.adapters.kube.client import ApiEventWriter
from healer.adapters.kube.events import KubeEvents
from healer.adapters.kube.nodes import KubeNodes
from healer.adapters.kube.spares import KubeSparePool
from healer.adapters.spare_validation import GPU_PRODUCT_LABEL, SpareValidator
from healer.core.rules import LabelSelector
from healer.core.spare_validation import (
    SpareCheck,
    SpareValidation,
    ValidationResult,
    bandwidth_table,
)
from healer.core.topology import DOMAIN_LABEL
from healer.core.vocabulary import (
    CLAIMED_BY,
    NODE_LABEL,
    REPAIR_LABEL,
    SPARE_FAILED_LABEL,
    SPARE_TAINT,
    SPARE_VALIDATION,
)
from healer.ports import PendingClaim
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import fake_node
from tests.integration.waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
TEMPLATES = {c: ROOT / "deploy" / "validation" / f"{c}-job.yaml" for c in SpareCheck}
DATA = ROOT / "tests" / "unit" / "data" / "spare_checks"
ROLE = {"healer.io/role": "spare"}


def shipped_config_map(check: SpareCheck, namespace: str, message: str = "") -> dict[str, Any]:
    """The shipped ConfigMap of ``check``, in ``namespace``; with ``message``, its pod carries the
    annotation kwok turns into the container's termination message."""
    cm: dict[str, Any] = yaml.safe_load(TEMPLATES[check].read_text())
    cm["metadata"]["namespace"] = namespace
    if message:
        job = yaml.safe_load(cm["data"]["job.yaml"])
        job["spec"]["template"]["metadata"].setdefault("annotations", {})[
            "healer-test-message"] = message
        cm["data"]["job.yaml"] = yaml.safe_dump(job)
    return cm


async def test_shipped_templates_are_valid_as_healer_renders_them(
        kube_stack: KubeStack, kube_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    batch = client.BatchV1Api(kube_api)
    node = f"dry-{secrets.token_hex(3)}"
    await core.create_node(fake_node(node))  # type: ignore[arg-type]
    try:
        for check in SpareCheck:
            cm = shipped_config_map(check, namespace)
            await core.create_namespaced_config_map(
                namespace, cm, dry_run="All")  # type: ignore[arg-type]
            await core.create_namespaced_config_map(namespace, cm)  # type: ignore[arg-type]
        jobs = KubeCheckJobs(kube_api, namespace=namespace)
        for check in SpareCheck:
            job = await jobs._template(check.value)
            job["metadata"] = {"name": f"dry-{check.value}", "namespace": namespace}
            job["spec"]["template"]["spec"]["nodeName"] = node
            created = await batch.create_namespaced_job(
                namespace, job, dry_run="All")  # type: ignore[arg-type]
            pod = created.spec.template.spec
            assert pod.containers[0].termination_message_policy == "File"
            assert pod.containers[0].resources.limits["nvidia.com/gpu"] == "8"
        assert (await batch.list_namespaced_job(namespace)).items == []  # a dry run made none
    finally:
        await core.delete_node(node)


def nccl_message(busbw: float) -> str:
    text = (DATA / "all_reduce_perf_h100x8.txt").read_text().replace("422.931", f"{busbw:g}")
    return f"healer-check nccl-loopback exit=0\n{text[-600:]}"


def dcgm_message() -> str:
    packed = base64.b64encode(gzip.compress((DATA / "dcgm_diag_r2_pass.json").read_bytes()))
    return f"healer-check dcgm-diag exit=0\n{packed.decode()}"


@pytest.mark.timeout(240)
async def test_a_failing_spare_leaves_the_pool_and_the_claim_takes_the_next_validated_one(
        kube_stack: KubeStack, kube_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    tag = secrets.token_hex(3)
    bad, near, far = f"bad-{tag}", f"near-{tag}", f"far-{tag}"
    taint = [{"key": SPARE_TAINT, "value": "true", "effect": "NoSchedule"}]
    spare_labels = {**ROLE, "healer.io/test-pool": tag}
    await core.create_node(fake_node(bad, labels={DOMAIN_LABEL: f"d1-{tag}"}))  # type: ignore[arg-type]
    for name, domain, model in ((near, "d1", "NVIDIA-H100-80GB-HBM3"),
                                (far, "d2", "NVIDIA-H200")):
        await core.create_node(fake_node(name, taints=taint, labels={  # type: ignore[arg-type]
            **spare_labels, DOMAIN_LABEL: f"{domain}-{tag}", GPU_PRODUCT_LABEL: model}))
    # every pod of the nccl template reports 330 GB/s: under H100's 350, over H200's 300
    for check, message in ((SpareCheck.DCGM_DIAG, dcgm_message()),
                           (SpareCheck.NCCL_LOOPBACK, nccl_message(330))):
        await core.create_namespaced_config_map(
            namespace, shipped_config_map(check, namespace, message))  # type: ignore[arg-type]
    policy = SpareValidation(enabled=True, checks=(SpareCheck.DCGM_DIAG,
                                                   SpareCheck.NCCL_LOOPBACK),
                             bus_bandwidth_gbps=bandwidth_table({"NVIDIA H100 80GB HBM3": 350,
                                                                 "NVIDIA H200": 300}),
                             deadline=120)
    nodes = KubeNodes(kube_api)
    events = KubeEvents(ApiEventWriter(kube_api))
    validator = SpareValidator(nodes, events, RepairRouter(nodes, {}),
                               KubeCheckJobs(kube_api, namespace=namespace),
                               settings=lambda: policy, clock=SYSTEM_CLOCK)
    pool = KubeSparePool(nodes, LabelSelector(spare_labels))
    pool.validation = validator
    seen: list[str] = []

    async def claimed() -> str | None:
        out = await pool.claim(bad, f"inc-{tag}")
        if isinstance(out, PendingClaim):
            seen.append(out.detail)
            return None
        return out

    try:
        spare: str | None = await wait_for(claimed, timeout=180,
                                           description="a validated spare claimed")
        assert spare == far
        assert f"validating warm spare {near} (dcgm-diag, nccl-loopback)" in seen[0]
        assert any(f"validating warm spare {far}" in d for d in seen)
        gone = await nodes.get(near)
        assert gone.labels[SPARE_FAILED_LABEL] == "true"
        assert gone.labels["healer.io/role"] == "spare"  # the operator's label stays
        assert gone.labels[REPAIR_LABEL] == "pending"
        assert SPARE_TAINT in {t.key for t in gone.taints}
        failed = ValidationResult.from_annotation(gone.annotations[SPARE_VALIDATION])
        assert failed is not None
        assert not failed.passed
        assert "bus bandwidth 330 GB/s, below the 350 GB/s threshold" in failed.detail
        took = await nodes.get(far)
        assert took.annotations[CLAIMED_BY] == f"inc-{tag}"
        passed = ValidationResult.from_annotation(took.annotations[SPARE_VALIDATION])
        assert passed is not None
        assert passed.passed
        assert "dcgmi diag -r 2 passed" in passed.detail  # the JSON came through, decoded
        evs = await client.EventsV1Api(kube_api).list_namespaced_event(
            "default", label_selector=f"{NODE_LABEL}={near}")
        notes = [e.note for e in evs.items if e.reason == "SpareFailedValidation"]
        assert len(notes) == 1
        assert "failed nccl-loopback (330 GB/s)" in notes[0]
        jobs = (await client.BatchV1Api(kube_api).list_namespaced_job(namespace)).items
        assert sorted(j.spec.template.spec.node_name for j in jobs) == [far, far, near, near]
        assert await pool.depth() == {}  # the failed spare is out, the other claimed
    finally:
        for n in (bad, near, far):
            await core.delete_node(n)
