"""The local control plane is real: TLS, RBAC, CRDs, controllers, scheduler, kwok, restarts."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import secrets
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from healer.errors import ConfigError
from healer_dev.devstack import binaries
from healer_dev.devstack.children import process_alive, process_stat
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import fake_node
from tests.integration.conftest import api_client_for
from tests.integration.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


def _gone(pid: int, start_time: int | None = None) -> bool:
    """The process exited (a zombie waiting for PID 1 to reap it counts as gone).

    With ``start_time`` a new process that reused the pid does not count as ours.
    """
    return not process_alive(pid, start_time)


def _strict_context(stack: KubeStack) -> ssl.SSLContext:
    """What Python >= 3.13 does by default: VERIFY_X509_STRICT on top of the usual checks."""
    ctx = ssl.create_default_context(cafile=str(stack.ca_file))
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    return ctx


async def _create_fake_node(api: client.ApiClient, **labels: str) -> str:
    name = f"kwok-{secrets.token_hex(3)}"
    await client.CoreV1Api(api).create_node(fake_node(name, labels=labels))
    return name


async def _node_ready(api: client.ApiClient, name: str) -> bool:
    node = await client.CoreV1Api(api).read_node(name)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


# ---------------------------------------------------------------------------- the API server


async def test_readyz_ok_and_version(kube_stack: KubeStack, kube_api: client.ApiClient) -> None:
    status, body = kube_stack.request("GET", "/readyz")
    assert (status, body) == (200, "ok")
    status, body = kube_stack.request("GET", "/readyz?verbose")
    assert status == 200
    assert "[+]etcd ok" in body
    version = await client.VersionApi(kube_api).get_code()
    assert version.git_version == binaries.KUBE_VERSION


def test_serving_chain_passes_strict_x509_verification(kube_stack: KubeStack) -> None:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", int(kube_stack.server.rsplit(":", 1)[1]), context=_strict_context(kube_stack)
    )
    try:
        conn.request("GET", "/livez")  # anonymous: system:public-info-viewer allows it
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, b"ok")
    finally:
        conn.close()


async def test_rbac_denies_a_user_until_a_rolebinding_allows_it(
    kube_stack: KubeStack, kube_api: client.ApiClient, namespace: str
) -> None:
    alice = await api_client_for(kube_stack.user_kubeconfig("alice", ["team-a"]))
    try:
        review = await client.AuthenticationV1Api(alice).create_self_subject_review(
            client.V1SelfSubjectReview()
        )
        assert review.status.user_info.username == "alice"
        assert "team-a" in review.status.user_info.groups

        with pytest.raises(ApiException) as denied:
            await client.CoreV1Api(alice).list_namespaced_config_map(namespace)
        assert denied.value.status == 403

        rbac = client.RbacAuthorizationV1Api(kube_api)
        await rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "cm-reader"},
                "rules": [
                    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}
                ],
            },
        )
        await rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "alice-reads-cms"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "cm-reader",
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}
                ],
            },
        )

        async def allowed() -> bool:
            await client.CoreV1Api(alice).list_namespaced_config_map(namespace)
            return True

        await wait_for(allowed, timeout=20, description="alice may list ConfigMaps",
                       ignore=(ApiException,))
        # ...and only what the Role grants
        with pytest.raises(ApiException) as still_denied:
            await client.CoreV1Api(alice).list_namespaced_secret(namespace)
        assert still_denied.value.status == 403
    finally:
        await alice.close()


async def test_a_crd_is_created_and_served(kube_api: client.ApiClient, namespace: str) -> None:
    ext = client.ApiextensionsV1Api(kube_api)
    group, plural = "devstack.healer.io", f"widgets{secrets.token_hex(2)}"
    crd = f"{plural}.{group}"
    await ext.create_custom_resource_definition(
        {
            "metadata": {"name": crd},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": plural, "singular": plural[:-1], "kind": "Widget"},
                "versions": [
                    {
                        "name": "v1alpha1",
                        "served": True,
                        "storage": True,
                        "subresources": {"status": {}},
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "properties": {
                                    "spec": {
                                        "type": "object",
                                        "properties": {"size": {"type": "integer"}},
                                    },
                                    "status": {
                                        "type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True,
                                    },
                                },
                            }
                        },
                    }
                ],
            },
        }
    )
    try:

        async def established() -> bool:
            obj = await ext.read_custom_resource_definition(crd)
            conds = obj.status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conds)

        await wait_for(established, timeout=30, description=f"CRD {crd} Established")
        custom = client.CustomObjectsApi(kube_api)

        async def create() -> dict[str, Any]:
            created: dict[str, Any] = await custom.create_namespaced_custom_object(
                group,
                "v1alpha1",
                namespace,
                plural,
                {
                    "apiVersion": f"{group}/v1alpha1",
                    "kind": "Widget",
                    "metadata": {"name": "w1"},
                    "spec": {"size": 3},
                },
            )
            return created

        # Established can precede the discovery/handler being ready by a moment.
        await wait_for(create, timeout=20, description="create a Widget",
                       ignore=(ApiException,))
        got = await custom.get_namespaced_custom_object(group, "v1alpha1", namespace, plural, "w1")
        assert got["spec"] == {"size": 3}
        with pytest.raises(ApiException) as invalid:
            await custom.create_namespaced_custom_object(
                group,
                "v1alpha1",
                namespace,
                plural,
                {
                    "apiVersion": f"{group}/v1alpha1",
                    "kind": "Widget",
                    "metadata": {"name": "w2"},
                    "spec": {"size": "three"},
                },
            )
        assert invalid.value.status == 422  # the schema is enforced
    finally:
        await ext.delete_custom_resource_definition(crd)


# ---------------------------------------------------------------------------- kwok, controllers


async def test_a_kwok_fake_node_turns_ready_and_keeps_a_lease(kube_api: client.ApiClient) -> None:
    name = await _create_fake_node(kube_api)
    try:
        await wait_for(lambda: _node_ready(kube_api, name), timeout=30,
                       description=f"Node {name} Ready")
        coord = client.CoordinationV1Api(kube_api)

        async def lease() -> bool:
            try:
                await coord.read_namespaced_lease(name, "kube-node-lease")
            except ApiException as e:
                if e.status == 404:
                    return False
                raise
            return True

        await wait_for(lease, timeout=30, description=f"Lease kube-node-lease/{name}")
        node = await client.CoreV1Api(kube_api).read_node(name)
        assert node.status.allocatable["cpu"] == "32"
    finally:
        await client.CoreV1Api(kube_api).delete_node(name)


async def test_a_deployment_pod_is_scheduled_on_a_kwok_node_and_runs(
    kube_api: client.ApiClient, namespace: str
) -> None:
    pool = f"pool-{secrets.token_hex(2)}"
    node = await _create_fake_node(kube_api, **{"healer.io/pool": pool})
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    try:
        await wait_for(lambda: _node_ready(kube_api, node), timeout=30,
                       description=f"Node {node} Ready")
        await apps.create_namespaced_deployment(
            namespace,
            {
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {
                            "nodeSelector": {"healer.io/pool": pool},
                            "containers": [{"name": "web", "image": "registry.k8s.io/pause"}],
                        },
                    },
                },
            },
        )

        async def running_pod() -> Any:
            pods = await core.list_namespaced_pod(namespace, label_selector="app=web")
            for p in pods.items:
                if p.spec.node_name == node and p.status.phase == "Running":
                    return p
            return None

        pod = await wait_for(running_pod, timeout=60, description="the web Pod Running")
        # ServiceAccount admission is on (the controller manager made the SA): a token volume
        assert pod.spec.service_account_name == "default"
        assert any(v.name.startswith("kube-api-access-") for v in pod.spec.volumes)

        async def available() -> bool:
            d = await apps.read_namespaced_deployment("web", namespace)
            return (d.status.available_replicas or 0) == 1

        await wait_for(available, timeout=60, description="Deployment web available")

        # garbage collection: the ReplicaSet and its Pod go with the Deployment
        await apps.delete_namespaced_deployment("web", namespace, propagation_policy="Background")

        async def collected() -> bool:
            rs = await apps.list_namespaced_replica_set(namespace)
            pods = await core.list_namespaced_pod(namespace)
            return not rs.items and not pods.items

        await wait_for(collected, timeout=60, description="ReplicaSet and Pod collected")
    finally:
        await core.delete_node(node)


async def test_a_job_pod_completes_and_the_job_succeeds(
    kube_api: client.ApiClient, namespace: str
) -> None:
    node = await _create_fake_node(kube_api)
    batch = client.BatchV1Api(kube_api)
    try:
        await wait_for(lambda: _node_ready(kube_api, node), timeout=30,
                       description=f"Node {node} Ready")
        await batch.create_namespaced_job(
            namespace,
            {
                "metadata": {"name": "once"},
                "spec": {
                    "backoffLimit": 0,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "nodeName": node,
                            "containers": [{"name": "c", "image": "registry.k8s.io/pause"}],
                        }
                    },
                },
            },
        )

        async def complete() -> bool:
            job = await batch.read_namespaced_job("once", namespace)
            return any(c.type == "Complete" and c.status == "True"
                       for c in job.status.conditions or [])

        await wait_for(complete, timeout=60, description="Job once Complete")
    finally:
        await client.CoreV1Api(kube_api).delete_node(node)


async def test_a_deleted_namespace_goes_away(kube_api: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_api)
    name = f"t-gone-{secrets.token_hex(3)}"
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    await core.create_namespaced_config_map(
        name, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c"), data={"k": "v"})
    )
    await core.delete_namespace(name)

    async def gone() -> bool:
        try:
            await core.read_namespace(name)
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        return False

    await wait_for(gone, timeout=60, description=f"Namespace {name} deleted")


# ---------------------------------------------------------------------------- restarts, stop


async def test_restart_apiserver_and_clients_reconnect(
    kube_stack: KubeStack, kube_api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    seen: asyncio.Queue[str] = asyncio.Queue()
    errors: list[str] = []

    async def watch_config_maps() -> None:
        """A watch that resumes from its last resourceVersion when the connection drops."""
        rv: str | None = None
        while True:
            w = watch.Watch()
            try:
                kwargs: dict[str, Any] = {"resource_version": rv} if rv else {}
                async for ev in w.stream(core.list_namespaced_config_map, namespace, **kwargs):
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        await seen.put(ev["object"].metadata.name)
                    rv = w.resource_version or rv
            except ApiException as e:
                errors.append(f"HTTP {e.status} {e.reason}")
                # 410 Gone: the restarted apiserver's watch cache starts at etcd's current
                # revision, so an older resourceVersion is "too old": re-list (an empty rv).
                rv = None if e.status == 410 else (w.resource_version or rv)
            except (TimeoutError, aiohttp.ClientError) as e:
                errors.append(repr(e)[:200])
                rv = w.resource_version or rv
            finally:
                await w.close()
            await asyncio.sleep(0.2)  # back-off between reconnect attempts

    async def next_seen(name: str) -> None:
        while await seen.get() != name:
            pass

    async def cm(name: str) -> None:
        body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name))
        await core.create_namespaced_config_map(namespace, body)

    task = asyncio.create_task(watch_config_maps())
    try:
        await cm("before")
        await asyncio.wait_for(next_seen("before"), 20)
        before = dict(kube_stack.pids)

        took = await asyncio.to_thread(kube_stack.restart_apiserver)

        after = kube_stack.pids
        assert after["etcd"] == before["etcd"]  # same etcd: every object survives
        assert after["kube-apiserver"] != before["kube-apiserver"]
        assert _gone(before["kube-apiserver"])
        # the controllers were restarted too (else client-go's backoff leaves them blind)
        assert after["kube-controller-manager"] != before["kube-controller-manager"]
        assert took < 60
        # the same ApiClient works again (new connections to the same port)...
        await wait_for(lambda: core.read_namespace(namespace), timeout=30,
                       description="read the namespace after the restart",
                       ignore=(aiohttp.ClientError, ApiException))
        # ...and the watch resumes and sees what happens after the restart
        await cm("after")
        try:
            await asyncio.wait_for(next_seen("after"), 30)
        except TimeoutError:
            raise AssertionError(f"the watch did not resume; its errors: {errors}") from None
        # the controllers reconnected too: a new namespace gets its ServiceAccount
        other = f"{namespace[:50]}-r"
        await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))

        async def sa() -> bool:
            sas = await core.list_namespaced_service_account(other)
            return any(s.metadata.name == "default" for s in sas.items)

        await wait_for(sa, timeout=30, description="ServiceAccount default after the restart")
        await core.delete_namespace(other)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_stop_leaves_no_processes(tmp_path: Path) -> None:
    stack = KubeStack(tmp_path / "kube", controllers=False, kwok=False)
    stack.start()
    pids = stack.pids
    assert set(pids) == {"etcd", "kube-apiserver"}
    stats = {n: process_stat(p) for n, p in pids.items()}
    assert all(st is not None and st[0] not in "ZX" for st in stats.values()), stats
    starts = {n: st[1] for n, st in stats.items() if st is not None}
    # no controllers: ServiceAccount admission is off, so a Pod is admitted without an SA
    status, body = stack.request(
        "POST",
        "/api/v1/namespaces/default/pods",
        {
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause"}]},
        },
    )
    assert status == 201, body
    stack.stop()
    assert stack.pids == {}
    leftover = {n: p for n, p in pids.items() if not _gone(p, starts[n])}
    assert not leftover, f"still running after stop(): {leftover}"


def test_devstack_cli_up_env_status_down(tmp_path: Path) -> None:
    d = tmp_path / "ds"
    env = {**os.environ, "PYTHONWARNINGS": "error"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "healer_dev.devstack.cli", *args, "--dir", str(d)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=90, check=False,
        )

    pids: dict[str, tuple[int, int | None]] = {}
    try:  # `down` whatever happens from here on: a failed `up` may have started some
        up = cli("up")
        assert up.returncode == 0, up.stderr
        assert f"export KUBECONFIG={d / 'admin.kubeconfig'}" in up.stdout
        state = json.loads((d / "state.json").read_text())
        pids = {n: (p["pid"], p["start_time"]) for n, p in state["processes"].items()}
        assert set(pids) == {
            "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"
        }
        assert all(not _gone(*p) for p in pids.values())  # they outlived `up`

        status = cli("status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert "/readyz: HTTP 200 ok" in status.stdout

        shell = cli("env")
        assert shell.returncode == 0
        kubectl = subprocess.run(
            ["bash", "-c", shell.stdout + "\nkubectl get namespace default -o name"],
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert kubectl.stdout.strip() == "namespace/default", kubectl.stderr
    finally:
        down = cli("down")
    assert down.returncode == 0, down.stderr
    leftover = {n: p for n, p in pids.items() if not _gone(*p)}
    assert not leftover, f"still running after `devstack down`: {leftover}"
    assert cli("status").returncode == 1


def test_a_failed_build_is_a_config_error_with_the_scripts_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "go").write_text('#!/bin/sh\necho "go: simulated: proxy unreachable" >&2\nexit 1\n')
    (fake / "go").chmod(0o755)
    monkeypatch.setenv("HEALER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    assert binaries.missing() == ["etcd", "kube", "kwok"]
    with pytest.raises(ConfigError, match="simulated: proxy unreachable") as failed:
        binaries.ensure()
    assert "build-k8s.sh" in str(failed.value)
    with pytest.raises(ConfigError, match=r"run hack/build-k8s\.sh"):
        binaries.ensure(build_missing=False)


def test_a_port_taken_after_it_was_picked_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import healer_dev.devstack.kube as kube

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        real = kube.free_port
        picks = iter([taken])  # etcd's client port is the first pick: lose that race once
        monkeypatch.setattr(kube, "free_port", lambda: next(picks, None) or real())
        stack = KubeStack(tmp_path / "kube", controllers=False, kwok=False)
        try:
            stack.start()
            assert stack.ports["etcd"] != taken
            assert "address already in use" in stack.logs("etcd").read_text()
            assert stack.request("GET", "/readyz") == (200, "ok")
        finally:
            stack.stop()
