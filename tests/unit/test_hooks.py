"""Webhook hooks and the signed acknowledgement endpoint, against a real local HTTP server.

Every webhook is signed with its own hook's key; an ack is signed, timestamped, single-use and
bound to its incident's node (the hostile variants are in tests/unit/fuzz/test_acks.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from healer.adapters.acks import AckReceiver, AckTarget
from healer.adapters.hooks import (
    RepairRouter,
    Secrets,
    WebhookHook,
    sign,
    verify,
)
from healer.core.model import NodeView
from healer.core.vocabulary import CHECKPOINT_ACK, REPAIR_INCIDENT
from healer.errors import PermanentError, TransientError
from healer.obs.http import serve
from healer.ports import HookKind, HookSpec, StepOutcome
from healer_dev.testing import FakeNodes, ManualClock

KEY = b"s3cret"
REPAIR_KEY = b"repair-s3cret"
KEYS = {"healer-system/hook-hmac": KEY, "healer-system/repair-hmac": REPAIR_KEY}


class StaticSecrets:
    async def key(self, ref: str) -> bytes:
        return KEYS[ref]


def ack_body(incident: str, node: str, kind: str, *, nonce: str = "n" * 16,
             ts: float | None = None, **extra: object) -> bytes:
    return json.dumps({"incident": incident, "node": node, "kind": kind, "nonce": nonce,
                       "timestamp": time.time() if ts is None else ts, **extra}).encode()


def receiver_for(nodes: FakeNodes, targets: Mapping[str, AckTarget]) -> AckReceiver:
    return AckReceiver(nodes, StaticSecrets(), targets.get)


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
    return HookSpec(HookKind.WEBHOOK, "USR1", url, "healer-system/hook-hmac")


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

    ack = receiver_for(nodes, {"inc-2": AckTarget("n1", {"checkpoint":
                                                         "healer-system/hook-hmac"})})
    body = ack_body("inc-2", "n1", "checkpoint")
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
    router = RepairRouter(nodes, {HookKind.WEBHOOK: hook})
    out = await router.hand_off("inc-9", "n1", spec(receiver.url))
    assert out.outcome is StepOutcome.DONE
    n = nodes.node("n1")
    assert n.labels["healer.io/repair"] == "pending"
    assert n.annotations[REPAIR_INCIDENT] == "inc-9"

    ack = receiver_for(nodes, {
        "inc-9": AckTarget("n1", {"repair": "healer-system/hook-hmac"}),
        "other": AckTarget("n1", {"repair": "healer-system/hook-hmac"})})
    wrong = ack_body("other", "n1", "repair", result="passed")
    assert (await ack.handle(wrong, sign(KEY, wrong)))[0] == 409
    body = ack_body("inc-9", "n1", "repair", result="passed", nonce="m" * 16)
    assert (await ack.handle(body, sign(KEY, body)))[0] == 200
    assert nodes.node("n1").annotations["healer.io/repair-result"] == "passed"
    assert (await ack.handle(b"not json", ""))[0] == 400


async def test_repair_webhook_is_signed_with_its_own_key(receiver: Receiver) -> None:
    nodes = FakeNodes([NodeView("n1")])
    hook = WebhookHook(nodes, StaticSecrets(), attempts=1)  # type: ignore[arg-type]
    await RepairRouter(nodes, {HookKind.WEBHOOK: hook}).hand_off(
        "inc-r", "n1", HookSpec(HookKind.WEBHOOK, url=receiver.url,
                                secret_ref="healer-system/repair-hmac"))
    headers, body = receiver.seen[0]
    assert headers["X-Healer-Event"] == "repair"
    assert verify(REPAIR_KEY, body, headers["X-Healer-Signature"])
    assert not verify(KEY, body, headers["X-Healer-Signature"])


async def test_a_webhook_without_secret_ref_is_never_sent(receiver: Receiver) -> None:
    nodes = FakeNodes([NodeView("n1")])
    hook = WebhookHook(nodes, Secrets(None), attempts=1)
    with pytest.raises(PermanentError, match="secretRef"):
        await hook.checkpoint("inc-u", "n1", "n1", HookSpec(HookKind.WEBHOOK, url=receiver.url))
    with pytest.raises(PermanentError, match="secretRef"):
        await hook.hand_off("inc-u", "n1", HookSpec(HookKind.WEBHOOK, url=receiver.url))
    assert receiver.seen == []


async def test_a_repair_ack_is_verified_with_the_repair_hooks_key() -> None:
    nodes = FakeNodes([NodeView("n1", annotations={REPAIR_INCIDENT: "inc-r"})])
    ack = receiver_for(nodes, {"inc-r": AckTarget("n1", {"repair": "healer-system/repair-hmac"})})
    body = ack_body("inc-r", "n1", "repair", result="failed")
    assert (await ack.handle(body, sign(KEY, body)))[0] == 403  # the checkpoint hook's key
    assert nodes.count("patch_metadata") == 0
    assert (await ack.handle(body, sign(REPAIR_KEY, body)))[0] == 200
    assert nodes.node("n1").annotations["healer.io/repair-result"] == "failed"
    found_nothing = ack_body("inc-r", "n1", "repair", result="no-fault", nonce="f" * 16)
    assert (await ack.handle(found_nothing, sign(REPAIR_KEY, found_nothing)))[0] == 200
    assert nodes.node("n1").annotations["healer.io/repair-result"] == "no-fault"
    unknown = ack_body("inc-r", "n1", "repair", result="fine", nonce="g" * 16)
    assert (await ack.handle(unknown, sign(REPAIR_KEY, unknown)))[0] == 400
    # a checkpoint ack for an incident whose policy has no checkpoint webhook: refused
    cp = ack_body("inc-r", "n1", "checkpoint", nonce="c" * 16)
    assert (await ack.handle(cp, sign(REPAIR_KEY, cp)))[0] == 403


async def test_an_ack_is_single_use_timestamped_and_bound_to_its_node() -> None:
    nodes = FakeNodes([NodeView("n1"), NodeView("n2")])
    ack = receiver_for(nodes, {"inc-1": AckTarget("n1", {"checkpoint":
                                                         "healer-system/hook-hmac"})})
    other_node = ack_body("inc-1", "n2", "checkpoint", nonce="a" * 16)
    assert (await ack.handle(other_node, sign(KEY, other_node)))[0] == 409
    stale = ack_body("inc-1", "n1", "checkpoint", nonce="b" * 16, ts=time.time() - 301)
    future = ack_body("inc-1", "n1", "checkpoint", nonce="c" * 16, ts=time.time() + 301)
    assert (await ack.handle(stale, sign(KEY, stale)))[0] == 403
    assert (await ack.handle(future, sign(KEY, future)))[0] == 403
    unknown = ack_body("inc-x", "n1", "checkpoint", nonce="d" * 16)
    assert (await ack.handle(unknown, sign(KEY, unknown)))[0] == 404
    assert nodes.count("patch_metadata") == 0
    good = ack_body("inc-1", "n1", "checkpoint", nonce="e" * 16)
    assert await ack.handle(good, sign(KEY, good)) == (200, "ok")
    assert (await ack.handle(good, sign(KEY, good)))[0] == 409  # replayed
    assert nodes.count("patch_metadata") == 1
    assert nodes.node("n1").annotations[CHECKPOINT_ACK] == "inc-1"
    assert CHECKPOINT_ACK not in nodes.node("n2").annotations


async def test_the_nonce_cache_is_bounded_and_forgets_expired_nonces() -> None:
    clock = ManualClock(1_000_000.0)
    nodes = FakeNodes([NodeView("n1")])
    ack = AckReceiver(nodes, StaticSecrets(),
                      {"i": AckTarget("n1", {"checkpoint": "healer-system/hook-hmac"})}.get,
                      clock=clock, window=60, max_nonces=3)
    for i in range(3):
        b = ack_body("i", "n1", "checkpoint", nonce=f"{i:016d}", ts=clock.t)
        assert (await ack.handle(b, sign(KEY, b)))[0] == 200
    full = ack_body("i", "n1", "checkpoint", nonce="x" * 16, ts=clock.t)
    assert (await ack.handle(full, sign(KEY, full)))[0] == 429
    clock.t += 61  # every remembered nonce's timestamp is now out of the window
    fresh = ack_body("i", "n1", "checkpoint", nonce="x" * 16, ts=clock.t)
    assert (await ack.handle(fresh, sign(KEY, fresh)))[0] == 200
    assert len(ack.nonces) == 1


async def test_a_failed_write_is_a_503_and_frees_the_nonce() -> None:
    nodes = FakeNodes([NodeView("n1")])
    nodes.inject_error("patch_metadata", TransientError("API down"))
    ack = receiver_for(nodes, {"i": AckTarget("n1", {"checkpoint": "healer-system/hook-hmac"})})
    b = ack_body("i", "n1", "checkpoint")
    assert (await ack.handle(b, sign(KEY, b)))[0] == 503
    assert (await ack.handle(b, sign(KEY, b)))[0] == 200  # the same nonce, retried
