"""Webhook hooks and /v1/hooks/ack in the real daemon process (issue 12): the checkpoint and the
repair webhook each arrive signed with their own Secret's key; an ack is refused (4xx, nothing
written) when it names another node, is signed with the other hook's key or not at all, is
replayed, malformed or oversized; the valid checkpoint ack moves the flow on and the valid
repair result finishes it; no traceback in the daemon's log."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from healer.adapters.hooks import sign, verify
from healer.core.vocabulary import CHECKPOINT_ACK
from healer.obs.http import serve
from tests.builders import policy_steps, policy_yaml
from tests.integration.daemon.conftest import Fleet
from tests.integration.waiting import wait_for

CKPT_KEY, REPAIR_KEY = "ckpt-" + secrets.token_hex(8), "repair-" + secrets.token_hex(8)



def hooks_policy(tid: str, url: str) -> str:
    """Checkpoint (for failed too) and repair through the test's webhook receiver at ``url``."""
    return policy_yaml(tid, name=f"hooks-{tid}", steps=policy_steps(
        checkpoint={"enabled": True, "severities": ["failed"], "hook": "webhook",
                    "url": f"{url}/checkpoint", "allowInsecureHttp": True,
                    "secretRef": f"healer-system/ckpt-{tid}", "deadline": "5m",
                    "onTimeout": "escalate"},
        repair={"hook": "webhook", "url": f"{url}/repair", "allowInsecureHttp": True,
                "secretRef": f"healer-system/repair-{tid}"}))


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[str, list[tuple[str, dict[str, str], bytes]]]]:
    """A webhook receiver on loopback that answers every call `pending`."""
    seen: list[tuple[str, dict[str, str], bytes]] = []

    async def hook(request: web.Request) -> web.Response:
        seen.append((request.path, dict(request.headers), await request.read()))
        return web.json_response({"status": "pending"})

    app = web.Application()
    app.router.add_post("/checkpoint", hook)
    app.router.add_post("/repair", hook)
    runner = await serve(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()


def _ack(incident: str, node: str, kind: str, **extra: Any) -> bytes:
    return json.dumps({"incident": incident, "node": node, "kind": kind,
                       "timestamp": time.time(), "nonce": secrets.token_hex(16),
                       **extra}).encode()


@pytest.mark.timeout(180)
async def test_signed_webhooks_and_acks_in_the_running_daemon(
        fleet: Fleet, receiver: tuple[str, list[tuple[str, dict[str, str], bytes]]]) -> None:
    url, seen = receiver
    core = client.CoreV1Api(fleet.api)
    for name, key in ((f"ckpt-{fleet.tid}", CKPT_KEY), (f"repair-{fleet.tid}", REPAIR_KEY)):
        await core.create_namespaced_secret("healer-system", {  # type: ignore[arg-type]
            "metadata": {"name": name}, "data": {"hmac": base64.b64encode(key.encode()).decode()}})
    try:
        (fleet.policies / "policy.yaml").write_text(hooks_policy(fleet.tid, url))
        d = fleet.start("--real-checkpoint-hooks")
        await fleet.ready(d)
        bad, other = fleet.gpus[0], fleet.gpus[1]
        fleet.xid(bad)

        async def posted(path: str) -> bool:
            return any(p == path for p, _, _ in seen)

        await wait_for(lambda: posted("/checkpoint"), timeout=60,
                       description="the checkpoint webhook called")
        _, headers, body = next(s for s in seen if s[0] == "/checkpoint")
        assert verify(CKPT_KEY.encode(), body, headers["X-Healer-Signature"])
        incident = json.loads(body)["incident"]
        assert await fleet.phase(bad) == "Checkpointing"

        ack_url = f"http://127.0.0.1:{d.port}/v1/hooks/ack"
        async with aiohttp.ClientSession() as s:
            async def post(raw: bytes, sig: str, ctype: str = "application/json") -> int:
                async with s.post(ack_url, data=raw, headers={
                        "Content-Type": ctype, "X-Healer-Signature": sig}) as r:
                    return r.status

            wrong_node = _ack(incident, other, "checkpoint")
            assert await post(wrong_node, sign(CKPT_KEY.encode(), wrong_node)) == 409
            good = _ack(incident, bad, "checkpoint")
            assert await post(good, "") == 403
            assert await post(good, sign(REPAIR_KEY.encode(), good)) == 403
            assert await post(good, sign(CKPT_KEY.encode(), good), "text/plain") == 415
            assert await post(b"{" * 100_000, "x") == 413
            assert await post(b"{not json", "x") == 400
            unknown = _ack("no-such-incident", bad, "checkpoint")
            assert await post(unknown, sign(CKPT_KEY.encode(), unknown)) == 404
            for n in (bad, other):
                node = await core.read_node(n)
                assert CHECKPOINT_ACK not in (node.metadata.annotations or {}), n
            assert await post(good, sign(CKPT_KEY.encode(), good)) == 200
            assert await post(good, sign(CKPT_KEY.encode(), good)) == 409  # replayed
            node = await core.read_node(bad)
            assert node.metadata.annotations[CHECKPOINT_ACK] == incident
            assert CHECKPOINT_ACK not in (
                (await core.read_node(other)).metadata.annotations or {})

            # the flow goes on to the repair hand-off: that webhook has its own key
            await wait_for(lambda: posted("/repair"), timeout=90,
                           description="the repair webhook called")
            _, headers, body = next(x for x in seen if x[0] == "/repair")
            assert verify(REPAIR_KEY.encode(), body, headers["X-Healer-Signature"])
            assert not verify(CKPT_KEY.encode(), body, headers["X-Healer-Signature"])
            result = _ack(incident, bad, "repair", result="passed")
            assert await post(result, sign(CKPT_KEY.encode(), result)) == 403
            assert await post(result, sign(REPAIR_KEY.encode(), result)) == 200

        async def done() -> bool:
            return await fleet.phase(bad) == "Done"

        await wait_for(done, timeout=60, description="the remediation Done after the result")
        log = d.tail(2000)
        assert "Traceback" not in log, log
        assert CKPT_KEY not in log
        assert REPAIR_KEY not in log
        assert d.terminate() == 0
    finally:
        for name in (f"ckpt-{fleet.tid}", f"repair-{fleet.tid}"):
            await asyncio.shield(core.delete_namespaced_secret(name, "healer-system"))


async def test_slow_and_oversized_clients_do_not_hold_the_daemons_ack_endpoint(
        fleet: Fleet, receiver: tuple[str, list[tuple[str, dict[str, str], bytes]]]) -> None:
    """Issue 22 item 7, in the real daemon: headers that never finish are cut off (the header
    timeout), an oversized header is a 4xx logged without its text or a traceback, and the
    daemon stays healthy."""
    url, _ = receiver
    marker = "slow-client-" + secrets.token_hex(4)
    (fleet.policies / "policy.yaml").write_text(hooks_policy(fleet.tid, url))
    d = fleet.start()
    await fleet.ready(d)
    reader, writer = await asyncio.open_connection("127.0.0.1", d.port)
    writer.write(b"POST /v1/hooks/ack HTTP/1.1\r\nHost: healer\r\nX-Slow: ")

    async def trickle() -> None:
        while True:
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.5)

    t = asyncio.create_task(trickle())
    try:
        assert await asyncio.wait_for(reader.read(-1), 90) == b""  # closed by the daemon
    finally:
        t.cancel()
        writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", d.port)
    writer.write(f"POST /v1/hooks/ack HTTP/1.1\r\nHost: healer\r\nX-Big: {marker}"
                 f"{'A' * 20_000}\r\n\r\n".encode())
    try:
        answer = await asyncio.wait_for(reader.read(-1), 60)
    finally:
        writer.close()
    assert 400 <= int(answer.split(b" ", 2)[1]) < 500, answer[:100]
    async with aiohttp.ClientSession() as s, \
            s.get(f"http://127.0.0.1:{d.port}/healthz") as r:
        assert r.status == 200
    log = d.tail(4000)
    assert "bad HTTP request refused" in log
    assert marker not in log
    assert "Traceback" not in log
    assert d.terminate() == 0
