"""deploy/ against the real API server: the manifests apply (server-side dry run), and the
daemon runs a whole remediation as the healer ServiceAccount (a token minted through the
TokenRequest API) while what it must not do is refused."""

from __future__ import annotations

import asyncio
import base64
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client

from healer.devstack.kube import KubeStack
from tests.integration.conftest import api_client_for
from tests.integration.daemon.conftest import Fleet
from tests.integration.daemon.test_daemon import _exactly_once, _finish
from tests.integration.daemon_process import ROOT


def kubectl(stack: KubeStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(stack.binaries.kubectl), "--kubeconfig", str(stack.kubeconfig),
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_manifests_apply_with_server_side_dry_run(kube_stack: KubeStack) -> None:
    ns = kubectl(kube_stack, "apply", "--server-side", "-f", "deploy/namespace.yaml")
    assert ns.returncode == 0, ns.stderr
    r = kubectl(kube_stack, "apply", "-k", "deploy/", "--server-side", "--dry-run=server")
    assert r.returncode == 0, r.stderr
    for kind in ("customresourcedefinition.apiextensions.k8s.io/noderemediations.healer.io",
                 "serviceaccount/healer", "clusterrole.rbac.authorization.k8s.io/healer",
                 "deployment.apps/healer", "poddisruptionbudget.policy/healer",
                 "configmap/healer-policies", "service/healer-metrics"):
        assert kind in r.stdout, r.stdout


async def _token_kubeconfig(stack: KubeStack, api: client.ApiClient, path: Path) -> Path:
    core = client.CoreV1Api(api)
    req = await core.create_namespaced_service_account_token(
        "healer", "healer-system", {"spec": {"expirationSeconds": 3600}})  # type: ignore[arg-type]
    token = req.status.token
    admin = yaml.safe_load(stack.kubeconfig.read_text())
    cluster = admin["clusters"][0]
    cfg = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "local", "cluster": cluster["cluster"]}],
           "users": [{"name": "healer", "user": {"token": token}}],
           "contexts": [{"name": "healer", "context": {"cluster": "local", "user": "healer"}}],
           "current-context": "healer"}
    await asyncio.to_thread(path.write_text, yaml.safe_dump(cfg))
    return path


@pytest.mark.timeout(240)
async def test_daemon_runs_with_least_privilege_and_nothing_more(
        kube_stack: KubeStack, kube_api: client.ApiClient, fleet: Fleet, namespace: str) -> None:
    for f in ("deploy/namespace.yaml", "deploy/crds/noderemediations.healer.io.yaml",
              "deploy/rbac.yaml"):
        r = kubectl(kube_stack, "apply", "--server-side", "-f", f)
        assert r.returncode == 0, r.stderr
    fleet.kubeconfig = await _token_kubeconfig(kube_stack, kube_api, fleet.dir / "sa.kubeconfig")
    sa = await api_client_for(fleet.kubeconfig)
    try:
        # who am I: the exact ServiceAccount
        review = await client.AuthenticationV1Api(sa).create_self_subject_review({})  # type: ignore[arg-type]
        assert review.status.user_info.username == "system:serviceaccount:healer-system:healer"
        # everything healer needs is allowed: run a whole remediation, with leader election
        d = fleet.start(leader=True)
        await fleet.ready(d)
        bad = fleet.gpus[3]
        fleet.xid(bad)
        await _finish(fleet, bad, deadline=120)
        _exactly_once(fleet, bad)
        log = d.tail(400)
        assert "HTTP 403" not in log, log
        assert "Forbidden" not in log, log
        # a sample of what it must not do is refused
        core, apps = client.CoreV1Api(sa), client.AppsV1Api(sa)
        with pytest.raises(client.exceptions.ApiException) as e1:
            await core.list_namespaced_secret("kube-system")
        with pytest.raises(client.exceptions.ApiException) as e2:
            await core.read_namespaced_secret("anything", "healer-system")
        with pytest.raises(client.exceptions.ApiException) as e3:
            await core.delete_node(fleet.gpus[0])
        dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
               "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"containers": [{"name": "w", "image": "x"}]}}}}
        await client.AppsV1Api(kube_api).create_namespaced_deployment(namespace, dep)  # type: ignore[arg-type]
        with pytest.raises(client.exceptions.ApiException) as e4:
            await apps.patch_namespaced_deployment("web", namespace,
                                                   {"spec": {"replicas": 1}})
        assert {e1.value.status, e2.value.status, e3.value.status, e4.value.status} == {403}
    finally:
        await sa.close()


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()
