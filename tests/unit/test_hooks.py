"""Webhook hooks and the signed acknowledgement endpoint, against a real local HTTP server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from healer.adapters.hooks import (
    CHECKPOINT_ACK,
    REPAIR_INCIDENT,
    AckReceiver,
    RepairRouter,
    WebhookHook,
    sign,
    verify,
)
from healer.core.model import NodeView
from healer.errors import PermanentError, TransientError
from healer.obs.http import serve
from healer.ports import HookSpec, StepOutcome
from healer.testing import FakeNodes

KEY = b"s3cret"


class StaticSecrets:
    async def key(self, ref: str) -> bytes:
        assert ref == "healer-system/hook-hmac"
        return KEY


@dataclass
class Receiver:
    answers: list[tuple[int, str]] = field(default_factory=list)
    seen: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()

    async def hook(request: web.Request) -> web.Response:
        body = await request.read()
        r.seen.append((dict(request.headers), body))
        status, text = r.answers.pop(0) if r.answers else (200, "")
        return web.Response(status=status, text=text)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = await serve(app, "127.0.0.1", 0)
    port = runner.addresses[0][1]
    r.url = f"http://127.0.0.1:{port}/hook"
    yield r
    await runner.cleanup()


def spec(url: str) -> HookSpec:
    return HookSpec("webhook", "USR1", url, "healer-system/hook-hmac")


def test_signature_round_trip() -> None:
    assert verify(KEY, b"x", sign(KEY, b"x"))
    assert not verify(KEY, b"y", sign(KEY, b"x"))
    assert not verify(KEY, b"x", "")


async def test_checkpoint_acked_by_2xx(receiver: Receiver) -> None:
    nodes = FakeNodes([NodeView("n1")])
    hook = WebhookHook(nodes, StaticSecrets(), attempts=2)  # type: ignore[arg-type]
    out = await hook.checkpoint("inc-1", "n1", "n1", spec(receiver.url))
    assert out.outcome is StepOutcome.DONE
    headers, body = receiver.seen[0]
    assert verify(KEY, body, headers["X-Healer-Signature"])
    assert headers["Idempotency-Key"] == "inc-1/checkpoint"
    assert json.loads(body)["incident"] == "inc-1"
    assert nodes.node("n1").annotations[CHECKPOINT_ACK] == "inc-1"


async def test_checkpoint_pending_then_acked_by_signed_callback(receiver: Receiver) -> None:
    nodes = FakeNodes([NodeView("n1")])
    hook = WebhookHook(nodes, StaticSecrets(), attempts=2)  # type: ignore[arg-type]
    receiver.answers.append((202, json.dumps({"status": "pending"})))
    assert (await hook.checkpoint("inc-2", "n1", "n1", spec(receiver.url))).outcome is \
        StepOutcome.PENDING
    assert (await hook.checkpoint("inc-2", "n1", "n1", spec(receiver.url))).outcome is \
        StepOutcome.PENDING
    assert len(receiver.seen) == 1  # posted once, then polled

    async def secret_for(incident: str) -> str:
        return "healer-system/hook-hmac"

    ack = AckReceiver(nodes, StaticSecrets(), secret_for)  # type: ignore[arg-type]
    body = json.dumps({"incident": "inc-2", "node": "n1", "kind": "checkpoint"}).encode()
    assert (await ack.handle(body, "sha256=forged"))[0] == 403
    assert (await ack.handle(body, sign(KEY, body)))[0] == 200
    assert (await hook.checkpoint("inc-2", "n1", "n1", spec(receiver.url))).outcome is \
        StepOutcome.DONE


async def test_webhook_retries_5xx_and_fails_4xx(receiver: Receiver) -> None:
    nodes = FakeNodes([NodeView("n1")])
    hook = WebhookHook(nodes, StaticSecrets(), attempts=3)  # type: ignore[arg-type]
    receiver.answers += [(503, ""), (500, ""), (200, "")]
    assert (await hook.checkpoint("inc-3", "n1", "n1", spec(receiver.url))).outcome is \
        StepOutcome.DONE
    assert len(receiver.seen) == 3
    receiver.answers += [(503, "")] * 3
    with pytest.raises(TransientError):
        await hook.checkpoint("inc-4", "n1", "n1", spec(receiver.url))
    receiver.answers.append((400, "bad request"))
    with pytest.raises(PermanentError, match="HTTP 400"):
        await hook.checkpoint("inc-5", "n1", "n1", spec(receiver.url))


async def test_repair_webhook_and_signed_result(receiver: Receiver) -> None:
    nodes = FakeNodes([NodeView("n1")])
    hook = WebhookHook(nodes, StaticSecrets(), attempts=1)  # type: ignore[arg-type]
    router = RepairRouter(nodes, {"webhook": hook})
    out = await router.hand_off("inc-9", "n1", spec(receiver.url))
    assert out.outcome is StepOutcome.DONE
    n = nodes.node("n1")
    assert n.labels["healer.io/repair"] == "pending"
    assert n.annotations[REPAIR_INCIDENT] == "inc-9"

    async def secret_for(incident: str) -> str:
        return "healer-system/hook-hmac"

    ack = AckReceiver(nodes, StaticSecrets(), secret_for)  # type: ignore[arg-type]
    wrong = json.dumps({"incident": "other", "node": "n1", "kind": "repair",
                        "result": "passed"}).encode()
    assert (await ack.handle(wrong, sign(KEY, wrong)))[0] == 409
    body = json.dumps({"incident": "inc-9", "node": "n1", "kind": "repair",
                       "result": "passed"}).encode()
    assert (await ack.handle(body, sign(KEY, body)))[0] == 200
    assert nodes.node("n1").annotations["healer.io/repair-result"] == "passed"
    assert (await ack.handle(b"not json", ""))[0] == 400
