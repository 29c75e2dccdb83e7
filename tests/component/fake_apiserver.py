"""A tiny in-memory Kubernetes API server (aiohttp) for the adapters' tests: Nodes (get, list
with equality/existence label selectors, JSON merge patch guarded by resourceVersion → 409),
slurmd Pods (list, eviction: 429 while ``pdb_blocks``, else the pod goes away), NodeSets and
CRDs (get; a CRD name in ``forbidden`` answers 403). Driven by the real kubernetes_asyncio
client, so the adapters' own request code runs."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client

from healer.obs.http import serve


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict):
            cur = target.get(k)
            target[k] = merge(cur if isinstance(cur, dict) else {}, v)
        else:
            target[k] = copy.deepcopy(v)
    return target


def matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k) != v.lstrip("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                              "message": message, "reason": reason, "code": code}, status=code)


@dataclass
class FakeKube:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # name → pod (one namespace)
    nodesets: dict[str, dict[str, Any]] = field(default_factory=dict)
    crds: dict[str, dict[str, Any]] = field(default_factory=dict)
    forbidden: set[str] = field(default_factory=set)
    pdb_blocks: bool = False
    evictions: list[str] = field(default_factory=list)
    patches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    rv: int = 100

    # -- building the world ------------------------------------------------------------------

    def add_node(self, name: str, *, labels: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None,
                 taints: list[dict[str, str]] | None = None) -> None:
        self.rv += 1
        self.nodes[name] = {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "labels": dict(labels or {}), "annotations": dict(annotations or {}),
            "resourceVersion": str(self.rv)}, "spec": {"taints": list(taints or [])},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}

    def add_pod(self, name: str, node: str, *, nodeset: str = "gpu",
                conditions: dict[str, str] | None = None) -> None:
        """A slurmd pod; ``conditions``: SlurmNodeState<X> → message."""
        conds = [{"type": "Ready", "status": "True"}] + [
            {"type": f"SlurmNodeState{k}", "status": "True", "message": v}
            for k, v in (conditions or {"Idle": ""}).items()]
        self.pods[name] = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": "slurm", "uid": f"uid-{name}",
            "labels": {"app.kubernetes.io/name": "slurmd",
                       "app.kubernetes.io/instance": nodeset,
                       "nodeset.slinky.slurm.net/pod-hostname": name}},
            "spec": {"nodeName": node, "hostname": name,
                     "containers": [{"name": "slurmd", "image": "slurmd"}]},
            "status": {"conditions": [dict(c, lastTransitionTime=None) for c in conds]}}

    def node(self, name: str) -> dict[str, Any]:
        return self.nodes[name]

    def taints(self, name: str) -> list[str]:
        return [t["key"] for t in self.nodes[name]["spec"].get("taints") or []]

    # -- the API ---------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        r = app.router
        r.add_get("/api/v1/nodes", self._list_nodes)
        r.add_get("/api/v1/nodes/{name}", self._get_node)
        r.add_patch("/api/v1/nodes/{name}", self._patch_node)
        r.add_get("/api/v1/namespaces/{ns}/pods", self._list_pods)
        r.add_post("/api/v1/namespaces/{ns}/pods/{name}/eviction", self._evict)
        r.add_get("/apis/slinky.slurm.net/v1beta1/namespaces/{ns}/nodesets/{name}",
                  self._get_nodeset)
        r.add_get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
                  self._get_crd)
        return app

    async def _list_nodes(self, req: web.Request) -> web.Response:
        sel = req.query.get("labelSelector", "")
        items = [n for n in self.nodes.values() if matches(n["metadata"]["labels"], sel)]
        return web.json_response({"kind": "NodeList", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": str(self.rv)},
                                  "items": items})

    async def _get_node(self, req: web.Request) -> web.Response:
        n = self.nodes.get(req.match_info["name"])
        if n is None:
            return _status(404, "NotFound", f"nodes {req.match_info['name']!r} not found")
        return web.json_response(n)

    async def _patch_node(self, req: web.Request) -> web.Response:
        name = req.match_info["name"]
        n = self.nodes.get(name)
        if n is None:
            return _status(404, "NotFound", f"nodes {name!r} not found")
        body = json.loads(await req.read())
        want = (body.get("metadata") or {}).pop("resourceVersion", None)
        if want is not None and want != n["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", f"node {name} was modified")
        self.patches.append((name, copy.deepcopy(body)))
        merge(n, body)
        self.rv += 1
        n["metadata"]["resourceVersion"] = str(self.rv)
        n["metadata"].setdefault("labels", {})
        n["metadata"].setdefault("annotations", {})
        return web.json_response(n)

    async def _list_pods(self, req: web.Request) -> web.Response:
        sel = req.query.get("labelSelector", "")
        items = [p for p in self.pods.values() if matches(p["metadata"]["labels"], sel)]
        return web.json_response({"kind": "PodList", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": str(self.rv)},
                                  "items": items})

    async def _evict(self, req: web.Request) -> web.Response:
        name = req.match_info["name"]
        if name not in self.pods:
            return _status(404, "NotFound", f"pods {name!r} not found")
        if self.pdb_blocks:
            return _status(429, "TooManyRequests", "Cannot evict pod: disruption budget")
        self.evictions.append(name)
        del self.pods[name]
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"},
                                 status=201)

    async def _get_nodeset(self, req: web.Request) -> web.Response:
        ns = self.nodesets.get(req.match_info["name"])
        if ns is None:
            return _status(404, "NotFound", f"nodesets {req.match_info['name']!r} not found")
        return web.json_response(ns)

    async def _get_crd(self, req: web.Request) -> web.Response:
        name = req.match_info["name"]
        if name in self.forbidden:
            return _status(403, "Forbidden", f"customresourcedefinitions {name!r} is forbidden")
        crd = self.crds.get(name)
        if crd is None:
            return _status(404, "NotFound", f"customresourcedefinitions {name!r} not found")
        return web.json_response(crd)


def nodeset(name: str = "gpu", *, mode: str | None = "StatefulSet",
            strategy: dict[str, Any] | None = None,
            selector: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "updateStrategy": strategy if strategy is not None else
        {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        "template": {"spec": {"nodeSelector": selector if selector is not None else
                              {"slinky.slurm.net/nodeset": name}}}}
    if mode is not None:
        spec["scalingMode"] = mode
    return {"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
            "metadata": {"name": name, "namespace": "slurm"}, "spec": spec}


def nodeset_crd(*, v1_1: bool) -> dict[str, Any]:
    props: dict[str, Any] = {"replicas": {"type": "integer"},
                             "updateStrategy": {"type": "object"}}
    if v1_1:
        props["scalingMode"] = {"type": "string"}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "nodesets.slinky.slurm.net"},
            "spec": {"group": "slinky.slurm.net", "scope": "Namespaced",
                     "names": {"plural": "nodesets", "kind": "NodeSet"}, "versions": [
                {"name": "v1beta1", "served": True, "storage": True, "schema": {
                    "openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": props}}}}}]}}


@asynccontextmanager
async def running(kube: FakeKube) -> AsyncIterator[client.ApiClient]:
    """Serve ``kube`` on loopback; yield a real API client for it."""
    runner = await serve(kube.app(), "127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    api = client.ApiClient(client.Configuration(host=f"http://{host}:{port}"))
    try:
        yield api
    finally:
        await api.close()
        await runner.cleanup()
