"""Fuzz: hostile HTTP on both sides (issue 22 items 6 and 7), generated.

* As a server (healer's ``/v1/hooks/ack`` and friends, :func:`healer.obs.http.serve`, real
  aiohttp on loopback in a thread of its own): generated request heads — request lines,
  header counts and sizes, bytes no header may hold, a marker in every value — each get a
  4xx (or a proper answer when they happen to be a valid request), never a 5xx; no log line
  carries the marker or a traceback; the server answers ``/healthz`` after every one.
* As a client (the checkpoint and repair webhooks): a receiver answering any 3xx with any
  ``Location`` is never followed: the target on another loopback host sees nothing, and the
  error names the status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from healer.adapters.hooks import WebhookHook
from healer.core.model import NodeView
from healer.errors import HealerError, PermanentError
from healer.obs.http import Health, make_app, serve
from healer.ports import HookKind, HookSpec
from healer_dev.testing import FakeNodes

FUZZ = settings(max_examples=150, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])
MARKER = "hostile-7f3a"


class _Loop:
    """An event loop in a thread: the servers live there, the tests talk plain sockets."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture(scope="module")
def loop() -> Iterator[_Loop]:
    lp = _Loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def server(loop: _Loop) -> Iterator[int]:
    async def ack(body: bytes, signature: str, content_type: str) -> tuple[int, str]:
        return 403, "bad or missing signature"

    async def start() -> web.AppRunner:
        health = Health()
        health.set_ready("x", True)
        return await serve(make_app(health, CollectorRegistry(), ack=ack, body_timeout=2),
                           "127.0.0.1", 0, header_timeout=2, max_connections=16)

    runner = loop.run(start())
    yield runner.addresses[0][1]
    loop.run(runner.cleanup())


def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        with contextlib.suppress(OSError):  # it may close on a head it refuses, unread
            s.sendall(data)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


header_name = st.one_of(st.sampled_from(["X-A", "Content-Type", "Content-Length",
                                         "Transfer-Encoding", "Host", "X-Healer-Signature"]),
                        st.text("abcXYZ-_ :\x00\x7f()", min_size=1, max_size=12))
header_value = st.builds(lambda pre, size, post: f"{pre}{MARKER}{'A' * size}{post}",
                         st.text("ab \t\x01\x1b", max_size=4), st.integers(0, 20_000),
                         st.text("ab\x00\r", max_size=3))


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(["POST", "GET", "PUT", "BREW", "P\x00ST", ""]))
    path = draw(st.sampled_from(["/v1/hooks/ack", "/healthz", "/nope", "*", f"/{MARKER}"]))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/9.9", ""]))
    headers = draw(st.lists(st.tuples(header_name, header_value), max_size=4))
    many = draw(st.sampled_from([0, 0, 200]))
    lines = [f"{method} {path} {version}", "Host: x", *(f"{k}: {v}" for k, v in headers),
             *(f"X-{i}: {MARKER}" for i in range(many)), "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1", "replace")


@FUZZ
@given(head=heads())
def test_any_request_head_gets_an_answer_and_leaves_no_text_in_the_log(
        server: int, head: bytes, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logs:
        answer = _exchange(server, head)
    if answer:
        status = int(answer.split(b" ", 2)[1])
        assert status < 500 or status == 503, answer[:200]  # 503: the connection cap
    assert MARKER not in caplog.text
    assert "Traceback" not in caplog.text
    assert not any(MARKER in str(e) for e in logs)
    health = _exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert health.startswith(b"HTTP/1.1 200"), health[:200]


# -- as a client: redirects ---------------------------------------------------------------------


class Keys:
    async def key(self, ref: str) -> bytes:
        return b"k"


@pytest.fixture(scope="module")
def redirector(loop: _Loop) -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"status": 307, "location": "", "seen": []}

    async def target(request: web.Request) -> web.Response:
        state["seen"].append(await request.read())
        return web.json_response({})

    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=state["status"], headers={"Location": state["location"]})

    async def start() -> tuple[web.AppRunner, web.AppRunner]:
        t, r = web.Application(), web.Application()
        t.router.add_route("*", "/{tail:.*}", target)
        r.router.add_route("*", "/{tail:.*}", redirect)
        return await serve(t, "127.0.0.2", 0), await serve(r, "127.0.0.1", 0)

    t_runner, r_runner = loop.run(start())
    state["target"] = f"http://127.0.0.2:{t_runner.addresses[0][1]}"
    state["url"] = f"http://127.0.0.1:{r_runner.addresses[0][1]}/hook"
    yield state
    loop.run(r_runner.cleanup())
    loop.run(t_runner.cleanup())


@FUZZ
@given(status=st.integers(300, 399), path=st.text("abc/?=&%.", max_size=20),
       absolute=st.booleans(), kind=st.sampled_from(["checkpoint", "repair"]))
def test_a_signed_webhook_follows_no_redirect(loop: _Loop, redirector: dict[str, Any],
                                              status: int, path: str, absolute: bool,
                                              kind: str) -> None:
    redirector["status"] = status
    redirector["location"] = (redirector["target"] if absolute else "") + "/" + path
    redirector["seen"].clear()
    hook = WebhookHook(FakeNodes([NodeView("n1")]), Keys(), attempts=1)  # type: ignore[arg-type]
    spec = HookSpec(HookKind.WEBHOOK, "USR1", redirector["url"], "ns/hmac")

    async def call() -> BaseException | None:
        try:
            if kind == "checkpoint":
                await hook.checkpoint("inc-1", "n1", "n1", spec)
            else:
                await hook.hand_off("inc-1", "n1", spec)
        except HealerError as e:
            return e
        return None

    err = loop.run(call())
    assert isinstance(err, PermanentError), err
    assert f"HTTP {status} redirect" in str(err)
    assert redirector["seen"] == []
