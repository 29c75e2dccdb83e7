"""Spare validation in the daemon process (healer.app.run, the spare-validation loop and the
claim), against the real kube-apiserver: the fleet's spareValidation runs the shipped check
templates on the warm spares (kwok ends each Job's pod with the termination message the pod
annotation ``healer-test-message`` stands in for); the spare in the bad node's own domain
reports a bus bandwidth under its GPU model's threshold, leaves the pool with an Event and goes
to repair, and the remediation takes the other spare, validated."""

from __future__ import annotations

import contextlib

import pytest
from kubernetes_asyncio import client

from healer.core.spare_validation import SpareCheck, ValidationResult
from healer.core.vocabulary import NODE_LABEL, SPARE_FAILED_LABEL, SPARE_VALIDATION
from healer_dev.devstack.kube import KubeStack
from tests.builders import policy_yaml
from tests.integration.daemon.conftest import Fleet
from tests.integration.daemon.test_rbac import _slurm_namespace, _token_kubeconfig, kubectl
from tests.integration.hooks.test_spare_validation_real import (
    dcgm_message,
    nccl_message,
    shipped_config_map,
)
from tests.integration.waiting import wait_for

VALIDATION_SPEC = {"maxAge": "1h", "interval": "10m", "checks": ["dcgm-diag", "nccl-loopback"],
                   "ncclBusBandwidthGBps": {"NVIDIA H100 80GB HBM3": 350, "NVIDIA H200": 300},
                   "deadline": "2m"}


@pytest.mark.timeout(240)
async def test_a_spare_that_fails_validation_leaves_the_pool_and_the_next_one_serves(
        fleet: Fleet) -> None:
    await _scenario(fleet)


@pytest.mark.timeout(300)
async def test_spare_validation_needs_no_more_than_the_shipped_rbac(
        kube_stack: KubeStack, kube_api: client.ApiClient, fleet: Fleet) -> None:
    _slurm_namespace(kube_stack)
    for f in ("deploy/namespace.yaml", "deploy/crds/noderemediations.healer.io.yaml",
              "deploy/rbac.yaml"):
        r = kubectl(kube_stack, "apply", "--server-side", "-f", f)
        assert r.returncode == 0, r.stderr
    r = kubectl(kube_stack, "apply", "-k", "deploy/validation/", "--server-side",
                "--force-conflicts", "--dry-run=server")  # an earlier test may have made them
    assert r.returncode == 0, r.stderr
    assert "configmap/healer-validation-nccl-loopback" in r.stdout, r.stdout
    fleet.kubeconfig = await _token_kubeconfig(kube_stack, kube_api, fleet.dir / "sa.kubeconfig")
    log = await _scenario(fleet)
    assert "HTTP 403" not in log, log
    assert "Forbidden" not in log, log


async def _scenario(fleet: Fleet) -> str:
    """The remediation of an XID 79 node whose nearer spare fails its validation; the daemon's
    log tail."""
    core = client.CoreV1Api(fleet.api)
    near, far = fleet.spares  # domains a and b; the bad node is in a
    for name, model in ((near, "NVIDIA-H100-80GB-HBM3"), (far, "NVIDIA-H200")):
        await core.patch_node(name, {"metadata": {"labels": {"nvidia.com/gpu.product": model}}})
    for check, message in ((SpareCheck.DCGM_DIAG, dcgm_message()),
                           (SpareCheck.NCCL_LOOPBACK, nccl_message(330))):
        cm = shipped_config_map(check, "healer-system", message)
        with contextlib.suppress(client.exceptions.ApiException):
            await core.delete_namespaced_config_map(cm["metadata"]["name"], "healer-system")
        await core.create_namespaced_config_map("healer-system", cm)  # type: ignore[arg-type]
    (fleet.policies / "policy.yaml").write_text(policy_yaml(
        fleet.tid, name=f"fatal-{fleet.tid}", fleet={"spareValidation": VALIDATION_SPEC}))
    d = fleet.start()
    await fleet.ready(d)
    bad = fleet.gpus[1]
    fleet.xid(bad)

    async def swapped() -> str:
        items = await fleet.remediations(bad)
        return str((items[-1].get("status") or {}).get("spare") or "") if items else ""

    spare: str = await wait_for(swapped, timeout=180, description="a spare claimed")
    assert spare == far
    gone = await core.read_node(near)
    assert gone.metadata.labels[SPARE_FAILED_LABEL] == "true"
    assert gone.metadata.labels["healer.io/repair"] == "pending"
    assert gone.metadata.labels["healer.io/role"] == "spare"
    failed = ValidationResult.from_annotation(gone.metadata.annotations[SPARE_VALIDATION])
    assert failed is not None
    assert not failed.passed
    assert "330 GB/s, below the 350 GB/s threshold" in failed.detail
    took = await core.read_node(far)
    passed = ValidationResult.from_annotation(took.metadata.annotations[SPARE_VALIDATION])
    assert passed is not None
    assert passed.passed
    evs = await client.EventsV1Api(fleet.api).list_namespaced_event(
        "default", label_selector=f"{NODE_LABEL}={near}")
    assert [e.reason for e in evs.items] == ["SpareFailedValidation"]
    jobs = (await client.BatchV1Api(fleet.api).list_namespaced_job("healer-system")).items
    ran = sorted(j.spec.template.spec.node_name for j in jobs
                 if j.spec.template.spec.node_name in (near, far))
    assert ran == sorted([far, far, near, near])  # the loop and the claim never ran one twice
    done: bool = await wait_for(lambda: fleet.play_repair(bad), timeout=60,
                                description=f"remediation of {bad} Done")
    assert done
    log = d.tail(400)
    assert d.terminate() == 0
    return log
