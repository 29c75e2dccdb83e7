"""Checkpoint and repair hooks against a real Slurm and a real kube-apiserver."""

from __future__ import annotations

import asyncio
import secrets

import pytest
import yaml
from kubernetes_asyncio import client

from healer.adapters.checkpoint import SlurmSignalCheckpoint
from healer.adapters.hooks import JobHook, RepairRouter
from healer.adapters.kube.jobs import JobValidator
from healer.adapters.kube.nodes import KubeNodes
from healer.adapters.slurm.scontrol import ScontrolDriver
from healer.core.model import NodeView
from healer.core.vocabulary import CHECKPOINT_SIGNALLED, REPAIR_INCIDENT, REPAIR_RESULT
from healer.ports import HookKind, HookResult, HookSpec, StepOutcome
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import fake_node
from healer_dev.devstack.slurm import LocalSlurm
from healer_dev.testing import FakeNodes
from tests.integration.slurm_fixtures import HOLD_SCRIPT, release
from tests.integration.waiting import wait_for


async def test_slurm_signal_checkpoint_signals_once_and_acks_when_jobs_end(
        slurm: LocalSlurm) -> None:
    driver = ScontrolDriver(env=slurm.env())
    job = await asyncio.to_thread(slurm.submit, HOLD_SCRIPT, "gpu-1")
    await asyncio.to_thread(slurm.wait_job, job, ("RUNNING",), 30)
    nodes = FakeNodes([NodeView("k8s-gpu-1")])
    hook = SlurmSignalCheckpoint(driver, nodes)
    spec = HookSpec(HookKind.SLURM_SIGNAL, "USR1")
    first = await hook.checkpoint("inc-1", "k8s-gpu-1", "gpu-1", spec)
    assert first.outcome is StepOutcome.PENDING
    trap = slurm.jobdir / f"usr1-{job}"
    await wait_for(trap.exists, timeout=20, description="the job's USR1 trap ran")
    assert nodes.node("k8s-gpu-1").annotations[CHECKPOINT_SIGNALLED] == f"inc-1:{job}"
    # a restarted healer (a new hook object) reads what was signalled: no second USR1
    again = SlurmSignalCheckpoint(driver, nodes)
    assert (await again.checkpoint("inc-1", "k8s-gpu-1", "gpu-1", spec)).outcome is \
        StepOutcome.PENDING
    release(slurm, job)

    async def acked() -> bool:
        out = await again.checkpoint("inc-1", "k8s-gpu-1", "gpu-1", spec)
        return out.outcome is StepOutcome.DONE

    await wait_for(acked, timeout=30, description="checkpoint acknowledged")
    assert len(trap.read_text().splitlines()) == 1  # signalled exactly once


JOB_TEMPLATE = {
    "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "placeholder"},
    "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {}}, "spec": {
        "restartPolicy": "Never", "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "hook", "image": "busybox", "command": ["true"]}]}}}}


async def _template(kube_api: client.ApiClient, ns: str, name: str, fail: bool) -> str:
    body = dict(JOB_TEMPLATE)
    tmpl = yaml.safe_load(yaml.safe_dump(body))
    if fail:
        tmpl["spec"]["template"]["metadata"]["labels"]["healer-test-outcome"] = "fail"
    await client.CoreV1Api(kube_api).create_namespaced_config_map(ns, {  # type: ignore[arg-type]
        "metadata": {"name": name}, "data": {"job.yaml": yaml.safe_dump(tmpl)}})
    return f"{ns}/{name}"


@pytest.mark.timeout(180)
async def test_job_hooks_checkpoint_and_repair(kube_stack: KubeStack, kube_api: client.ApiClient,
                                               namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    node = f"hooknode-{secrets.token_hex(3)}"
    await core.create_node(fake_node(node))  # type: ignore[arg-type]
    try:
        nodes = KubeNodes(kube_api)
        hook = JobHook(kube_api, nodes, namespace=namespace)
        ok = await _template(kube_api, namespace, "ok", fail=False)
        bad = await _template(kube_api, namespace, "bad", fail=True)

        async def finished(fn: object) -> bool:
            out = await fn()  # type: ignore[operator]
            return out.outcome is not StepOutcome.PENDING

        cp = HookSpec(HookKind.JOB, "USR1", job_template=ok)
        await wait_for(lambda: finished(lambda: hook.checkpoint("inc-c", node, "gpu-9", cp)),
                       timeout=90, description="checkpoint Job finished")
        assert (await hook.checkpoint("inc-c", node, "gpu-9", cp)).outcome is StepOutcome.DONE
        jobs = await client.BatchV1Api(kube_api).list_namespaced_job(namespace)
        env = {e.name: e.value for e in jobs.items[0].spec.template.spec.containers[0].env}
        assert env["HEALER_INCIDENT"] == "inc-c"
        assert env["HEALER_SLURM_NODE"] == "gpu-9"

        router = RepairRouter(nodes, {HookKind.JOB: hook})
        for spec, incident, want in ((HookSpec(HookKind.JOB, job_template=bad), "inc-r1", "failed"),
                                     (HookSpec(HookKind.JOB, job_template=ok), "inc-r2", "passed")):
            await wait_for(lambda s=spec, i=incident: finished(
                lambda: router.hand_off(i, node, s)), timeout=90,
                description=f"repair Job of {incident}")
            n = await nodes.get(node)
            assert n.annotations[REPAIR_INCIDENT] == incident
            assert n.annotations[REPAIR_RESULT] == want
            assert n.labels["healer.io/repair"] == "pending"
    finally:
        await core.delete_node(node)


@pytest.mark.timeout(180)
async def test_validation_job_runs_pinned_to_its_node_and_reports_success_or_failure(
        kube_stack: KubeStack, kube_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    node = f"valnode-{secrets.token_hex(3)}"
    await core.create_node(fake_node(node))  # type: ignore[arg-type]
    try:
        validator = JobValidator(kube_api, namespace=namespace, deadline=2)

        async def result(target: str, incident: str) -> HookResult | None:
            out = await validator.validate(incident, target, "dcgm:latest",
                                           ["dcgmi", "diag", "-r", "2"], "replacement")
            return None if out.outcome is StepOutcome.PENDING else out

        first = await validator.validate("inc-v", node, "dcgm:latest", ["dcgmi"], "replacement")
        assert first.outcome is StepOutcome.PENDING
        assert node in first.detail
        ok = await wait_for(lambda: result(node, "inc-v"), timeout=90,
                            description="validation Job on a live node finished")
        assert ok.outcome is StepOutcome.DONE, ok
        jobs = (await client.BatchV1Api(kube_api).list_namespaced_job(namespace)).items
        assert len(jobs) == 1  # asking again never made a second Job
        pod = jobs[0].spec.template.spec
        assert pod.node_name == node
        assert {t.key for t in pod.tolerations} >= {"healer.io/spare", "healer.io/remediation"}
        # a node where the Job's pod can never run: the Job's deadline fails it, with the reason
        bad = await wait_for(lambda: result(f"{node}-gone", "inc-w"), timeout=90,
                             description="validation Job on a missing node failed")
        assert bad.outcome is StepOutcome.FAILED
        assert "deadline" in bad.detail.lower(), bad.detail
    finally:
        await core.delete_node(node)
