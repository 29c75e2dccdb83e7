"""deploy/ against the real API server: the manifests apply (server-side dry run), the
daemon runs a whole remediation as the healer ServiceAccount (a token minted through the
TokenRequest API) while what it must not do is refused, and an agent identity can write the
status of its own Node only (deploy/agent's ValidatingAdmissionPolicy). The Slinky path under
the chart's RBAC is tests/integration/flows/test_least_privilege_slinky.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client

from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import fake_node
from tests.integration.conftest import api_client_for
from tests.integration.daemon.conftest import Fleet
from tests.integration.daemon.test_daemon import _exactly_once, _finish
from tests.integration.daemon_process import ROOT
from tests.integration.kube_tokens import (
    NODE_NAME_EXTRA,
    pod_bound_kubeconfig,
    sa_token,
    token_kubeconfig,
)


def kubectl(stack: KubeStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(stack.binaries.kubectl), "--kubeconfig", str(stack.kubeconfig),
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=60)


def _slurm_namespace(stack: KubeStack) -> None:
    """deploy/rbac.yaml grants pods and evictions in `slurm` (the Slurm cluster's namespace,
    which exists wherever healer is installed): make sure it exists here."""
    r = kubectl(stack, "create", "namespace", "slurm")
    assert r.returncode == 0 or "AlreadyExists" in r.stderr, r.stderr


def test_manifests_apply_with_server_side_dry_run(kube_stack: KubeStack) -> None:
    ns = kubectl(kube_stack, "apply", "--server-side", "-f", "deploy/namespace.yaml")
    assert ns.returncode == 0, ns.stderr
    _slurm_namespace(kube_stack)
    r = kubectl(kube_stack, "apply", "-k", "deploy/", "--server-side", "--dry-run=server")
    assert r.returncode == 0, r.stderr
    for kind in ("customresourcedefinition.apiextensions.k8s.io/noderemediations.healer.io",
                 "serviceaccount/healer", "clusterrole.rbac.authorization.k8s.io/healer",
                 "deployment.apps/healer", "poddisruptionbudget.policy/healer",
                 "configmap/healer-policies", "service/healer-metrics",
                 "networkpolicy.networking.k8s.io/healer",
                 "role.rbac.authorization.k8s.io/healer-slurm"):
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
    _slurm_namespace(kube_stack)
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
        # pods and evictions only in the Slurm namespace; no hook Secret or ConfigMap granted
        with pytest.raises(client.exceptions.ApiException) as e5:
            await core.list_namespaced_pod(namespace)
        with pytest.raises(client.exceptions.ApiException) as e6:
            await core.read_namespaced_config_map("anything", "healer-system")
        await core.list_namespaced_pod("slurm")
        dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
               "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"containers": [{"name": "w", "image": "x"}]}}}}
        await client.AppsV1Api(kube_api).create_namespaced_deployment(namespace, dep)  # type: ignore[arg-type]
        with pytest.raises(client.exceptions.ApiException) as e4:
            await apps.patch_namespaced_deployment("web", namespace,
                                                   {"spec": {"replicas": 1}})
        assert {e.value.status for e in (e1, e2, e3, e4, e5, e6)} == {403}
    finally:
        await sa.close()


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


@pytest.mark.timeout(120)
async def test_an_agent_identity_patches_only_its_own_nodes_status(
        kube_stack: KubeStack, kube_api: client.ApiClient, tmp_path: Path) -> None:
    for f in ("deploy/namespace.yaml", "deploy/agent/rbac.yaml"):
        r = kubectl(kube_stack, "apply", "--server-side", "-f", f)
        assert r.returncode == 0, r.stderr
    core = client.CoreV1Api(kube_api)
    mine, other = (f"agent-rbac-{secrets.token_hex(3)}-{x}" for x in "ab")
    pods: list[str] = []
    for n in (mine, other):
        await core.create_node(fake_node(n, labels={"healer.io/test": "1"}))  # type: ignore[arg-type]
    try:
        cfg, pod = await pod_bound_kubeconfig(kube_stack, kube_api, "healer-system",
                                              "healer-agent", mine, tmp_path / "bound.kubeconfig")
        pods.append(pod)
        unbound = await token_kubeconfig(
            kube_stack, await sa_token(kube_api, "healer-system", "healer-agent"),
            tmp_path / "unbound.kubeconfig")
        condition = {"status": {"conditions": [{
            "type": "GPUHealthy", "status": "False", "reason": "XidFatal", "message": "forged",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
        agent = await api_client_for(cfg)
        stray = await api_client_for(unbound)
        try:
            review = await client.AuthenticationV1Api(agent).create_self_subject_review({})  # type: ignore[arg-type]
            assert review.status.user_info.username == \
                "system:serviceaccount:healer-system:healer-agent"
            assert review.status.user_info.extra[NODE_NAME_EXTRA] == [mine]
            await _wait_until_enforced(client.CoreV1Api(stray), mine, condition)
            # its own Node: allowed
            await client.CoreV1Api(agent).patch_node_status(mine, condition)
            # another Node, or a token bound to no Node: refused, nothing written
            for api, name in ((agent, other), (stray, mine), (stray, other)):
                with pytest.raises(client.exceptions.ApiException) as e:
                    await client.CoreV1Api(api).patch_node_status(name, condition)
                assert e.value.status == 403, e.value
                assert "its own Node only" in str(e.value.body), e.value.body
            got = await core.read_node_status(other)
            assert all(c.type != "GPUHealthy" for c in got.status.conditions or [])
        finally:
            await agent.close()
            await stray.close()
    finally:
        for pod in pods:
            with contextlib.suppress(client.exceptions.ApiException):
                await core.delete_namespaced_pod(pod, "healer-system", grace_period_seconds=0)
        for n in (mine, other):
            with contextlib.suppress(client.exceptions.ApiException):
                await core.delete_node(n)


async def _wait_until_enforced(core: client.CoreV1Api, node: str,
                               body: dict[str, object]) -> None:
    """A newly applied ValidatingAdmissionPolicy takes a moment to load: probe with a dry run
    (admission runs, nothing is written) until it refuses, with a deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        try:
            await core.patch_node_status(node, body, dry_run="All")
        except client.exceptions.ApiException as e:
            if e.status == 403:
                return
            raise
        if loop.time() > deadline:
            raise AssertionError(f"the agent policy was not enforced on {node} within 30 s")
        await asyncio.sleep(0.2)
