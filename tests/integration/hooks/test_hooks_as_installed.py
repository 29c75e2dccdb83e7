"""The shipped webhook and Job hook examples work as installed (issue 12): with exactly the
chart's RBAC for those policies, healer's ServiceAccount reads each webhook's HMAC Secret and the
Job hook's template ConfigMap, signs the checkpoint and the repair webhook each with its own key
(a receiver on loopback checks them), and is refused every other Secret and ConfigMap."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from kubernetes_asyncio import client

from healer.adapters.hooks import JobHook, Secrets, WebhookHook, verify
from healer.core.model import NodeView
from healer.errors import HealerError
from healer.obs.http import serve
from healer.ports import HookKind, HookSpec, StepOutcome
from healer_dev.devstack import binaries
from healer_dev.devstack.kube import KubeStack
from healer_dev.testing import FakeNodes
from tests.integration.conftest import api_client_for
from tests.integration.daemon_process import ROOT
from tests.integration.kube_tokens import sa_token, token_kubeconfig

CHART = ROOT / "deploy" / "helm" / "healer"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {},
       "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
           {"name": "c", "image": "busybox", "command": ["true"]}]}}}}


def _policies(ns: str) -> dict[str, str]:
    """The shipped examples, pointed at the test's namespace, plus a Job checkpoint hook."""
    ex = ROOT / "policies" / "examples"
    webhook = (ex / "checkpoint-webhook.yaml").read_text().replace("healer-system/", f"{ns}/")
    repair = (ex / "act-with-validation.yaml").read_text().replace("healer-system/", f"{ns}/")
    jobs = {"apiVersion": "healer.io/v1alpha1", "kind": "RemediationPolicy",
            "metadata": {"name": "jobs"},
            "spec": {"mode": "observe", "nodeSelector": {"matchLabels": {"a": "b"}},
                     "rules": [{"name": "x", "severity": "degrading",
                                "xid": {"groups": ["degrading"]}}],
                     "steps": {"checkpoint": {"enabled": True, "hook": "job",
                                              "jobTemplate": f"{ns}/checkpoint-job"}}}}
    return {"hooks.yaml": f"{webhook}\n---\n{repair}\n---\n{yaml.safe_dump(jobs)}"}


def _render(tmp: Path, release: str, ns: str) -> list[dict[str, Any]]:
    values = tmp / "values.yaml"
    values.write_text(yaml.safe_dump({"fullnameOverride": release, "slurm": {"namespace": ns},
                                      "policies": _policies(ns)}))
    env = {"HELM_CONFIG_HOME": str(tmp / "cfg"), "HELM_CACHE_HOME": str(tmp / "cache"),
           "HELM_DATA_HOME": str(tmp / "data"), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([str(binaries.component_dir("helm") / "helm"), "template", release,
                        str(CHART), "--namespace", ns, "-f", str(values)], capture_output=True,
                       text=True, env=env, timeout=90, check=False)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d and d["kind"] in RBAC_KINDS]


def _kubectl(stack: KubeStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(stack.binaries.kubectl), "--kubeconfig", str(stack.kubeconfig),
                           *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    seen: list[tuple[dict[str, str], bytes]] = []

    async def hook(request: web.Request) -> web.Response:
        seen.append((dict(request.headers), await request.read()))
        return web.json_response({"status": "done"})

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = await serve(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/hook", seen
    finally:
        await runner.cleanup()


@pytest.mark.timeout(120)
async def test_webhook_and_job_hooks_work_with_exactly_the_charts_rbac(
        kube_stack: KubeStack, kube_api: client.ApiClient, namespace: str, tmp_path: Path,
        receiver: tuple[str, list[tuple[dict[str, str], bytes]]]) -> None:
    release = f"healer-hk-{secrets.token_hex(3)}"
    core = client.CoreV1Api(kube_api)
    keys = {"checkpoint-hmac": "ckpt-key-1", "repair-hmac": "repair-key-2", "other": "nope"}
    for name, key in keys.items():
        await core.create_namespaced_secret(namespace, {  # type: ignore[arg-type]
            "metadata": {"name": name}, "data": {"hmac": base64.b64encode(key.encode()).decode()}})
    for name in ("checkpoint-job", "other-job"):
        await core.create_namespaced_config_map(namespace, {  # type: ignore[arg-type]
            "metadata": {"name": name}, "data": {"job.yaml": yaml.safe_dump(JOB)}})
    objs = await asyncio.to_thread(_render, tmp_path, release, namespace)
    manifest = tmp_path / "rbac.yaml"
    manifest.write_text(yaml.safe_dump_all(objs))
    r = await asyncio.to_thread(_kubectl, kube_stack, "apply", "--server-side", "-f",
                                str(manifest))
    assert r.returncode == 0, r.stderr
    try:
        cfg = await token_kubeconfig(kube_stack, await sa_token(kube_api, namespace, release),
                                     tmp_path / "sa.kubeconfig")
        sa = await api_client_for(cfg)
        try:
            secrets_ = Secrets(sa)
            url, seen = receiver
            nodes = FakeNodes([NodeView("n1")])
            hook = WebhookHook(nodes, secrets_, attempts=1)
            out = await hook.checkpoint("inc-1", "n1", "gpu-1", HookSpec(
                HookKind.WEBHOOK, url=url, secret_ref=f"{namespace}/checkpoint-hmac"))
            assert out.outcome is StepOutcome.DONE
            await hook.hand_off("inc-1", "n1", HookSpec(
                HookKind.WEBHOOK, url=url, secret_ref=f"{namespace}/repair-hmac"))
            (h1, b1), (h2, b2) = seen
            assert json.loads(b1)["incident"] == json.loads(b2)["incident"] == "inc-1"
            assert verify(b"ckpt-key-1", b1, h1["X-Healer-Signature"])
            assert verify(b"repair-key-2", b2, h2["X-Healer-Signature"])
            assert not verify(b"ckpt-key-1", b2, h2["X-Healer-Signature"])
            # the Job hook's template is readable
            job = await JobHook(sa, nodes, namespace=namespace)._template(
                f"{namespace}/checkpoint-job")
            assert job["kind"] == "Job"
            # nothing else: another Secret, another ConfigMap, a list
            with pytest.raises(HealerError, match="403"):
                await Secrets(sa).key(f"{namespace}/other")
            with pytest.raises(HealerError, match="403"):
                await JobHook(sa, nodes, namespace=namespace)._template(f"{namespace}/other-job")
            with pytest.raises(client.exceptions.ApiException) as e:
                await client.CoreV1Api(sa).list_namespaced_secret(namespace)
            assert e.value.status == 403
        finally:
            await sa.close()
    finally:
        for o in objs:
            if "namespace" not in o["metadata"] or o["metadata"]["namespace"] == "default":
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(
                        _kubectl, kube_stack, "delete", "--ignore-not-found", "--wait=false",
                        "-n", o["metadata"].get("namespace", "default"),
                        f"{o['kind'].lower()}/{o['metadata']['name']}")
