"""The local stack's dead node, on the real kube-apiserver and kwok: kwok finishes no deletion
of a pod marked as its Node's being dead (:func:`healer_dev.devstack.dead_node.mark_pods`),
however kwok itself sees the Node's Lease, and finishes it once the mark is gone, as a
kubelet that came back would. A pod on a live Node is deleted beside it as the yardstick."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from healer_dev.devstack.dead_node import mark_pods
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import DEAD_NODE_POD, fake_node
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
async def two_nodes(kube_api: client.ApiClient) -> AsyncIterator[tuple[str, str]]:
    tag = secrets.token_hex(3)
    names = (f"live-{tag}", f"dead-{tag}")
    core = client.CoreV1Api(kube_api)
    for n in names:
        await core.create_node(fake_node(n))  # type: ignore[arg-type]
    try:
        yield names
    finally:
        for n in names:
            with contextlib.suppress(client.exceptions.ApiException):
                await core.delete_node(n)


def _pod(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "c", "image": "healer-test/none"}]}}


async def _pod_or_none(core: client.CoreV1Api, name: str,
                       namespace: str) -> client.V1Pod | None:
    try:
        return await core.read_namespaced_pod(name, namespace)
    except client.exceptions.ApiException as e:
        if e.status == 404:
            return None
        raise


async def test_kwok_leaves_a_dead_nodes_pod_being_deleted(
        kube_stack: KubeStack, kube_api: client.ApiClient, namespace: str,
        two_nodes: tuple[str, str]) -> None:
    live, dead = two_nodes
    core = client.CoreV1Api(kube_api)
    for node in (live, dead):
        await core.create_namespaced_pod(namespace, _pod(node, node))  # type: ignore[arg-type]

    async def running() -> bool:
        pods = [await core.read_namespaced_pod(n, namespace) for n in (live, dead)]
        return all(p.status.phase == "Running" for p in pods)

    await wait_for(running, timeout=60, description="both pods Running under kwok")
    await asyncio.to_thread(mark_pods, kube_stack, dead, dead=True)
    marked = await core.read_namespaced_pod(dead, namespace)
    assert marked.metadata.annotations[DEAD_NODE_POD] == "true"
    for node in (live, dead):
        await core.delete_namespaced_pod(node, namespace)

    async def live_gone() -> bool:
        return await _pod_or_none(core, live, namespace) is None

    await wait_for(live_gone, timeout=60, description="kwok finishing the live pod's deletion")
    left = await _pod_or_none(core, dead, namespace)
    assert left is not None, "kwok finished the deletion of a dead node's pod"
    assert left.metadata.deletion_timestamp is not None
    assert left.metadata.deletion_grace_period_seconds == 30  # not a force delete

    await asyncio.to_thread(mark_pods, kube_stack, dead, dead=False)

    async def dead_gone() -> bool:
        return await _pod_or_none(core, dead, namespace) is None

    await wait_for(dead_gone, timeout=60, description="kwok finishing it once the mark is gone")
