"""GPU identity is the agent's word alone, on the real kube-apiserver (issue 22 item 5): the
field manager that wrote a condition's message comes from the server's own managedFields. The
agent's writer (:class:`healer.agent.publish.ConditionWriter`) publishes a block; someone else
rewriting the message with another block takes its ownership and the block is no identity;
the agent writing again takes it back. Someone else's condition type never counts."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from healer.adapters.kube.nodes import KubeNodes
from healer.agent.publish import Condition, ConditionWriter
from healer.core.gpu_identity import GpuIdentity, parse_entries, with_block
from healer.core.model import GpuRef
from healer.core.signals import condition_signals, identity_condition
from healer.core.vocabulary import AGENT_FIELD_MANAGER, GPU_CONDITION
from healer_dev.devstack.kwok import fake_node
from tests.integration.agent_client import lite_like

A = GpuRef(2, "GPU-aaaa-1111", "1650000000002")
FORGED = GpuRef(2, "GPU-aaaa-1111", "1650999999999")


@pytest.fixture
async def node(kube_api: client.ApiClient) -> AsyncIterator[str]:
    name = f"writers-{secrets.token_hex(3)}"
    core = client.CoreV1Api(kube_api)
    await core.create_node(fake_node(name))  # type: ignore[arg-type]
    try:
        yield name
    finally:
        with contextlib.suppress(client.exceptions.ApiException):
            await core.delete_node(name)


def _condition(message: str, t: float) -> Condition:
    return Condition(status="False", reason="XidFatal", message=message, heartbeat=t,
                     transition=t)


async def _patch_as(api: client.ApiClient, node: str, manager: str, ctype: str,
                    message: str) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cond = {"type": ctype, "status": "False", "reason": "Forged", "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": now}
    await client.CoreV1Api(api).patch_node_status(
        node, {"status": {"conditions": [cond]}},  # type: ignore[call-arg]
        _content_type="application/strategic-merge-patch+json", field_manager=manager)


async def _identity(kn: KubeNodes, node: str) -> tuple[str, tuple[GpuIdentity, ...]]:
    view = await kn.get(node)
    agent = identity_condition(view)
    gpus = next((s.get("gpus") for s in condition_signals(view, time.time())
                 if s.key == GPU_CONDITION), "")
    writer = next(c.writer for c in view.conditions if c.type == GPU_CONDITION)
    return writer, (parse_entries(gpus) if agent is not None and gpus else ())


async def test_only_the_agents_own_message_carries_identity(
        kube_api: client.ApiClient, node: str) -> None:
    kn = KubeNodes(kube_api)
    lite = lite_like(kube_api)  # the agent's own client, as the agent writes
    try:
        await _agent_and_intruder(kube_api, kn, ConditionWriter(lite, node), node)
    finally:
        await lite.close()


async def _agent_and_intruder(kube_api: client.ApiClient, kn: KubeNodes,
                              writer: ConditionWriter, node: str) -> None:
    t = float(int(time.time()))
    await writer.write(_condition(with_block("XID 79 on GPU 2", [GpuIdentity(A, True)]), t))
    assert await _identity(kn, node) == (AGENT_FIELD_MANAGER, (GpuIdentity(A, True),))

    forged = with_block("XID 79 on GPU 2", [GpuIdentity(FORGED, True)])
    await _patch_as(kube_api, node, "intruder", GPU_CONDITION, forged)
    assert await _identity(kn, node) == ("intruder", ())  # its block identifies nothing

    await writer.write(_condition(with_block("XID 79 on GPU 2 again",
                                             [GpuIdentity(A, True)]), t + 1))
    assert await _identity(kn, node) == (AGENT_FIELD_MANAGER, (GpuIdentity(A, True),))

    # a block in another condition type, even written under the agent's manager name
    await _patch_as(kube_api, node, AGENT_FIELD_MANAGER, "NPDGpuFault", forged)
    view = await kn.get(node)
    assert {s.key for s in condition_signals(view, time.time()) if s.get("gpus")} == \
        {GPU_CONDITION}
