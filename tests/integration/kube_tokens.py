"""ServiceAccount identities for the least-privilege tests, minted through the TokenRequest API.

``pod_bound_kubeconfig`` gives a token bound to a Pod on a given Node, as the kubelet mounts for
a DaemonSet pod: the API server then carries the Node's name in the request's user info
(``authentication.kubernetes.io/node-name``), which the agent's ValidatingAdmissionPolicy checks.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client

from healer_dev.devstack.kube import KubeStack

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


async def token_kubeconfig(stack: KubeStack, token: str, path: Path) -> Path:
    admin = yaml.safe_load(stack.kubeconfig.read_text())
    cfg = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "local", "cluster": admin["clusters"][0]["cluster"]}],
           "users": [{"name": "sa", "user": {"token": token}}],
           "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa"}}],
           "current-context": "sa"}
    await asyncio.to_thread(path.write_text, yaml.safe_dump(cfg))
    return path


async def sa_token(api: client.ApiClient, namespace: str, sa: str,
                   bound_pod: dict[str, Any] | None = None) -> str:
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if bound_pod is not None:
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod",
                                  "name": bound_pod["metadata"]["name"],
                                  "uid": bound_pod["metadata"]["uid"]}
    req = await client.CoreV1Api(api).create_namespaced_service_account_token(
        sa, namespace, {"spec": spec})  # type: ignore[arg-type]
    return str(req.status.token)


async def pod_on(api: client.ApiClient, namespace: str, sa: str, node: str) -> dict[str, Any]:
    """A Pod of ``sa`` bound to ``node`` (restricted Pod Security; mounts no token itself),
    owned by the Node, so the garbage collector deletes it with the Node."""
    n = await client.CoreV1Api(api).read_node(node)
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"sa-{secrets.token_hex(4)}",
                         "labels": {"healer.io/test": "1"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                                              "uid": n.metadata.uid}]},
            "spec": {"nodeName": node, "serviceAccountName": sa,
                     "automountServiceAccountToken": False,
                     "tolerations": [{"operator": "Exists"}],
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{"name": "c", "image": "healer-test:none",
                                     "securityContext": {
                                         "allowPrivilegeEscalation": False,
                                         "capabilities": {"drop": ["ALL"]}}}]}}
    pod = await client.CoreV1Api(api).create_namespaced_pod(namespace, body)  # type: ignore[arg-type]
    out: dict[str, Any] = api.sanitize_for_serialization(pod)
    return out


async def pod_bound_kubeconfig(stack: KubeStack, api: client.ApiClient, namespace: str,
                               sa: str, node: str, path: Path) -> tuple[Path, str]:
    """(kubeconfig with a token of ``sa`` bound to a new Pod on ``node``, that Pod's name)."""
    pod = await pod_on(api, namespace, sa, node)
    token = await sa_token(api, namespace, sa, pod)
    return await token_kubeconfig(stack, token, path), str(pod["metadata"]["name"])
