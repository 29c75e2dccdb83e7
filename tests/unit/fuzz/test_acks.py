"""Fuzz: hostile requests to ``/v1/hooks/ack`` never crash, hang or write.

A hand-written corpus of the hostile inputs issue 12 names (bad and missing signatures, the
other hook's key, replays, stale and future timestamps, the wrong node, an unknown incident,
huge, deep and malformed bodies, wrong content types, odd unicode) plus hypothesis (random
bytes; random JSON objects near the valid shape, signed with the right key or not), against
:class:`AckReceiver` on a :class:`FakeNodes` that counts writes. Every bad request is a 4xx with
no write; every accepted one is valid by the contract and writes exactly once. Each request runs
under an internal budget (``asyncio.timeout``), so a hang fails with the example, not the
suite's timeout. A last test sends the worst ones through the real aiohttp server.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import math
import string
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from healer.adapters.acks import MAX_BODY, WINDOW, AckReceiver, AckTarget
from healer.adapters.hooks import sign
from healer.core.model import NodeView
from healer.core.vocabulary import CHECKPOINT_ACK, REPAIR_INCIDENT
from healer.obs.http import Health, make_app, serve
from healer_dev.testing import FakeNodes, ManualClock

CP_KEY, RP_KEY = b"checkpoint-key", b"repair-key"
KEYS = {"ns/cp-hmac": CP_KEY, "ns/rp-hmac": RP_KEY}
TARGETS = {"inc-cp": AckTarget("n1", {"checkpoint": "ns/cp-hmac"}),
           "inc-rp": AckTarget("n2", {"repair": "ns/rp-hmac"}),
           "inc-both": AckTarget("n1", {"checkpoint": "ns/cp-hmac", "repair": "ns/rp-hmac"})}
NOW = 1_767_600_000.0
BUDGET = 5.0  # seconds one request may take before it counts as a hang
FUZZ = settings(max_examples=300, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


class Keys:
    async def key(self, ref: str) -> bytes:
        return KEYS[ref]


def world() -> tuple[FakeNodes, AckReceiver]:
    nodes = FakeNodes([NodeView("n1"), NodeView("n2", annotations={REPAIR_INCIDENT: "inc-rp"}),
                       NodeView("n3")])
    return nodes, AckReceiver(nodes, Keys(), TARGETS.get, clock=ManualClock(NOW))


def body(**fields: Any) -> bytes:
    msg: dict[str, Any] = {"incident": "inc-cp", "node": "n1", "kind": "checkpoint",
                           "timestamp": NOW, "nonce": "0123456789abcdef"}
    msg.update(fields)
    return json.dumps({k: v for k, v in msg.items() if v is not ...}).encode()


async def send(ack: AckReceiver, raw: bytes, sig: str | None = None,
               ctype: str = "application/json", key: bytes = CP_KEY) -> int:
    async with asyncio.timeout(BUDGET):
        status, text = await ack.handle(raw, sign(key, raw) if sig is None else sig, ctype)
    assert isinstance(text, str)
    assert text
    return status


def writes(nodes: FakeNodes) -> int:
    return nodes.count("patch_metadata")


def hostile() -> Iterator[tuple[str, bytes, str | None, str, bytes]]:
    """(name, body, signature or None for a valid one, content type, key) — all must be 4xx."""
    j = "application/json"
    yield "empty", b"", None, j, CP_KEY
    yield "null", b"null", None, j, CP_KEY
    yield "list", b"[]", None, j, CP_KEY
    yield "string", b'"ack"', None, j, CP_KEY
    yield "huge number", b"1e999999", None, j, CP_KEY
    yield "deep nesting", b"[" * 100_000 + b"]" * 100_000, None, j, CP_KEY
    yield "deep object", b'{"a":' * 50_000 + b"1" + b"}" * 50_000, None, j, CP_KEY
    yield "over the cap", body(pad="x" * (MAX_BODY + 1)), None, j, CP_KEY
    yield "a megabyte", b" " * 1_000_000 + body(), None, j, CP_KEY
    yield "invalid utf-8", b'{"incident": "\xff\xfe"}', None, j, CP_KEY
    yield "utf-16", body().decode().encode("utf-16"), None, j, CP_KEY
    yield "truncated", body()[:-3], None, j, CP_KEY
    yield "no signature", body(), "", j, CP_KEY
    yield "forged signature", body(), "sha256=" + "0" * 64, j, CP_KEY
    yield "signature of another body", body(), sign(CP_KEY, body(node="n2")), j, CP_KEY
    yield "uppercase signature", body(), sign(CP_KEY, body()).upper(), j, CP_KEY
    yield "md5 signature", body(), "md5=" + hmac.new(CP_KEY, body(), hashlib.md5).hexdigest(), \
        j, CP_KEY
    yield "the repair hook's key", body(), None, j, RP_KEY
    yield "repair ack with the checkpoint key", body(incident="inc-rp", node="n2", kind="repair",
                                                     result="passed"), None, j, CP_KEY
    yield "kind the policy has no hook for", body(incident="inc-rp", node="n2"), None, j, RP_KEY
    yield "stale", body(timestamp=NOW - WINDOW - 1), None, j, CP_KEY
    yield "future", body(timestamp=NOW + WINDOW + 1), None, j, CP_KEY
    yield "timestamp in ms", body(timestamp=NOW * 1000), None, j, CP_KEY
    yield "timestamp string", body(timestamp=str(NOW)), None, j, CP_KEY
    yield "timestamp bool", body(timestamp=True), None, j, CP_KEY
    yield "timestamp NaN", body().replace(str(NOW).encode(), b"NaN"), None, j, CP_KEY
    yield "timestamp Infinity", body().replace(str(NOW).encode(), b"-Infinity"), None, j, CP_KEY
    yield "timestamp 10**400", body().replace(str(NOW).encode(), b"1" + b"0" * 400), None, j, \
        CP_KEY
    yield "timestamp 5000 digits", body().replace(str(NOW).encode(), b"9" * 5000), None, j, \
        CP_KEY
    yield "no timestamp", body(timestamp=...), None, j, CP_KEY
    yield "no nonce", body(nonce=...), None, j, CP_KEY
    yield "short nonce", body(nonce="abc"), None, j, CP_KEY
    yield "long nonce", body(nonce="n" * 129), None, j, CP_KEY
    yield "nonce list", body(nonce=["0123456789abcdef"]), None, j, CP_KEY
    yield "nonce with control chars", body(nonce="0123456789abcde\n"), None, j, CP_KEY
    yield "wrong node", body(node="n2"), None, j, CP_KEY
    yield "node that does not exist", body(node="nope"), None, j, CP_KEY
    yield "unknown incident", body(incident="inc-x"), None, j, CP_KEY
    yield "incident with NUL", body(incident="inc-cp\x00"), None, j, CP_KEY
    yield "incident RTL override", body(incident="inc-\u202ecp"), None, j, CP_KEY
    yield "homoglyph node", body(node="n\u0031\u0338"), None, j, CP_KEY
    yield "node lone surrogate", body().replace(b'"n1"', b'"\\ud800"'), None, j, CP_KEY
    yield "incident number", body(incident=7), None, j, CP_KEY
    yield "incident object", body(incident={"$ne": ""}), None, j, CP_KEY
    yield "kind list", body(kind=["checkpoint"]), None, j, CP_KEY
    yield "kind unknown", body(kind="cancel"), None, j, CP_KEY
    yield "repair result missing", body(incident="inc-rp", node="n2", kind="repair"), None, j, \
        RP_KEY
    yield "repair result odd", body(incident="inc-rp", node="n2", kind="repair",
                                    result="PASSED"), None, j, RP_KEY
    yield "repair on a node not in repair", body(incident="inc-both", kind="repair",
                                                 result="passed"), None, j, RP_KEY
    yield "duplicate key, last wins", (body()[:-1] + b', "node": "n2"}'), None, j, CP_KEY
    yield "text/plain", body(), None, "text/plain", CP_KEY
    yield "form", body(), None, "application/x-www-form-urlencoded", CP_KEY
    yield "no content type", body(), None, "", CP_KEY
    yield "json-ish content type", body(), None, "application/jsonp", CP_KEY


CORPUS = list(hostile())


@pytest.mark.parametrize(("name", "raw", "sig", "ctype", "key"), CORPUS, ids=[c[0] for c in CORPUS])
async def test_hostile_ack_is_a_4xx_and_writes_nothing(name: str, raw: bytes, sig: str | None,
                                                      ctype: str, key: bytes) -> None:
    nodes, ack = world()
    status = await send(ack, raw, sig, ctype, key)
    assert 400 <= status < 500, (name, status)
    assert writes(nodes) == 0, name


async def test_valid_acks_write_exactly_once_and_replays_nothing() -> None:
    nodes, ack = world()
    cp = body()
    assert await send(ack, cp) == 200
    rp = body(incident="inc-rp", node="n2", kind="repair", result="failed",
              nonce="fedcba9876543210")
    assert await send(ack, rp, key=RP_KEY) == 200
    assert writes(nodes) == 2
    assert nodes.node("n1").annotations[CHECKPOINT_ACK] == "inc-cp"
    assert nodes.node("n2").annotations["healer.io/repair-result"] == "failed"
    # the same requests again, and with a reordered body: replays, whatever the bytes
    for raw, key in ((cp, CP_KEY), (rp, RP_KEY), (b" " + cp, CP_KEY)):
        assert await send(ack, raw, key=key) == 409
    # the same nonce for another incident is a replay too
    assert await send(ack, body(incident="inc-both")) == 409
    assert writes(nodes) == 2


def _check(nodes: FakeNodes, status: int, before: int) -> None:
    assert status in (200, 400, 403, 404, 409, 413, 415, 429), status
    assert writes(nodes) - before == (1 if status == 200 else 0)


@FUZZ
@given(raw=st.binary(max_size=512), sig=st.text(max_size=80),
       ctype=st.sampled_from(["application/json", "application/json; charset=utf-8", "",
                              "text/plain"]))
def test_random_bytes_never_crash_or_write(raw: bytes, sig: str, ctype: str) -> None:
    nodes, ack = world()
    status = asyncio.run(send(ack, raw, sig, ctype))
    _check(nodes, status, 0)
    assert status != 200


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                    st.text(max_size=40))
FIELDS = {
    "incident": st.one_of(st.sampled_from([*TARGETS, "inc-x", ""]), scalars),
    "node": st.one_of(st.sampled_from(["n1", "n2", "n3", "nope"]), scalars),
    "kind": st.one_of(st.sampled_from(["checkpoint", "repair", "Checkpoint"]), scalars),
    "result": st.one_of(st.sampled_from(["passed", "failed", "no-fault", "ok"]), scalars),
    "timestamp": st.one_of(st.floats(NOW - 2 * WINDOW, NOW + 2 * WINDOW), scalars),
    "nonce": st.one_of(st.text(min_size=14, max_size=20), scalars),
}
BASES = [("inc-cp", "n1", "checkpoint", CP_KEY), ("inc-rp", "n2", "repair", RP_KEY),
         ("inc-both", "n1", "checkpoint", CP_KEY)]


@st.composite
def near_valid(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    """A valid ack for a known incident, then up to two fields dropped or made hostile, and
    sometimes the wrong key; nonces come from a small pool too, so batches replay."""
    incident, node, kind, key = draw(st.sampled_from(BASES))
    msg: dict[str, Any] = {
        "incident": incident, "node": node, "kind": kind,
        "timestamp": draw(st.floats(NOW - 2 * WINDOW, NOW + 2 * WINDOW)),
        "nonce": draw(st.one_of(st.sampled_from(["a" * 16, "b" * 16]),
                                st.text(string.ascii_letters + string.digits, min_size=16,
                                        max_size=24)))}
    if kind == "repair":
        msg["result"] = draw(st.sampled_from(["passed", "failed", "no-fault", "ok"]))
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=2, unique=True)):
        if draw(st.booleans()):
            msg.pop(name, None)
        else:
            msg[name] = draw(FIELDS[name])
    return msg, draw(st.sampled_from([key, key, key, CP_KEY, RP_KEY, b"other"]))


messages = st.one_of(st.tuples(st.fixed_dictionaries({}, optional=FIELDS),
                               st.sampled_from([CP_KEY, RP_KEY, b"other"])), near_valid())


def _valid(msg: dict[str, Any], key: bytes, seen: set[str]) -> bool:
    """The contract, written independently of the receiver."""
    tgt = TARGETS.get(msg.get("incident")) if isinstance(msg.get("incident"), str) else None
    kind, ts, nonce = msg.get("kind"), msg.get("timestamp"), msg.get("nonce")
    if tgt is None or kind not in tgt.secret_refs or KEYS[tgt.secret_refs[kind]] != key:
        return False
    if msg.get("node") != tgt.node or not isinstance(nonce, str) or not 16 <= len(nonce) <= 128:
        return False
    if not nonce.isprintable() or nonce in seen:
        return False
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) \
            or abs(ts - NOW) > WINDOW:
        return False
    return kind != "repair" or (msg.get("result") in ("passed", "failed", "no-fault")
                                and msg.get("incident") == "inc-rp")


@FUZZ
@given(batch=st.lists(messages, min_size=1, max_size=4))
def test_random_acks_are_accepted_exactly_when_valid(
        batch: list[tuple[dict[str, Any], bytes]]) -> None:
    nodes, ack = world()
    seen: set[str] = set()

    async def run() -> None:
        for msg, key in batch:
            raw = json.dumps(msg).encode()
            before = writes(nodes)
            status = await send(ack, raw, key=key)
            _check(nodes, status, before)
            assert (status == 200) == _valid(msg, key, seen), (msg, status)
            if status == 200:
                seen.add(msg["nonce"])

    asyncio.run(run())


async def test_hostile_requests_through_the_real_server(
        caplog: pytest.LogCaptureFixture) -> None:
    nodes, ack = world()
    runner = await serve(make_app(Health(), CollectorRegistry(), None, ack.handle),
                         "127.0.0.1", 0)
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"

    async def chunks() -> Any:
        for _ in range(64):
            yield b" " * 4096

    try:
        async with aiohttp.ClientSession() as s:
            cases: list[tuple[str, dict[str, Any], int]] = [
                ("huge declared body", {"data": b" " * (4 * MAX_BODY)}, 413),
                ("chunked body over the cap", {"data": chunks()}, 413),
                ("wrong content type", {"data": body(), "headers": {"Content-Type":
                                                                    "text/plain"}}, 415),
                ("unsigned", {"data": body(), "headers": {"Content-Type":
                                                          "application/json"}}, 403),
            ]
            for name, kw, want in cases:
                async with asyncio.timeout(BUDGET), s.post(url + "/v1/hooks/ack", **kw) as r:
                    assert r.status == want, name
            async with s.get(url + "/v1/hooks/ack") as r:
                assert r.status == 405
            async with s.get(url + "/debug/state") as r:
                assert r.status == 404  # off unless --debug-state
            raw = body()
            async with s.post(url + "/v1/hooks/ack", data=raw, headers={
                    "Content-Type": "application/json",
                    "X-Healer-Signature": sign(CP_KEY, raw)}) as r:
                assert r.status == 200
    finally:
        await runner.cleanup()
    assert writes(nodes) == 1
    assert "Traceback" not in caplog.text
