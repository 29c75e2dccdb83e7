"""The HTTP server against clients that are slow or greedy on purpose (issue 22 item 7), on a
real aiohttp server on loopback and raw sockets: headers that never finish, a body that never
arrives, more connections than the cap, an oversized header, none of which may hold the
server, take it down, or put the client's text (or a traceback) in the log."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import structlog
from prometheus_client import CollectorRegistry

from healer.obs.http import Health, make_app, serve
from tests.integration.waiting import wait_for

MARKER = "attacker-text-7f3a"


@dataclass
class Server:
    port: int
    acks: list[bytes]


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    acks: list[bytes] = []

    async def ack(body: bytes, signature: str, content_type: str) -> tuple[int, str]:
        acks.append(body)
        return 200, "ok"

    health = Health()
    health.set_ready("x", True)
    app = make_app(health, CollectorRegistry(), ack=ack, body_timeout=1.0)
    runner = await serve(app, "127.0.0.1", 0, header_timeout=1.0, max_connections=8)
    try:
        yield Server(runner.addresses[0][1], acks)
    finally:
        await runner.cleanup()


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    return await reader.read(-1)


async def _healthy(port: int) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return (await reader.read(-1)).startswith(b"HTTP/1.1 200")
    finally:
        writer.close()


async def test_headers_that_never_finish_are_cut_off(server: Server) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /v1/hooks/ack HTTP/1.1\r\nHost: x\r\n")

    async def trickle() -> None:  # one header byte at a time, never the blank line
        for _ in range(600):
            writer.write(b"X")
            await writer.drain()
            await asyncio.sleep(0.1)

    t = asyncio.create_task(trickle())
    try:
        got = await asyncio.wait_for(_closed(reader), 30)  # a deadline, not a timing
    finally:
        t.cancel()
        writer.close()
    assert got == b""  # closed without a request ever reaching a handler
    assert server.acks == []
    assert await _healthy(server.port)


async def test_a_body_that_never_arrives_is_a_408(server: Server) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /v1/hooks/ack HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: 100\r\n\r\n{\"incident\"")
    try:
        got = await asyncio.wait_for(_closed(reader), 30)
    finally:
        writer.close()
    assert got.startswith(b"HTTP/1.1 408"), got[:100]
    assert server.acks == []


async def test_connections_over_the_cap_are_refused_and_the_server_recovers(
        server: Server) -> None:
    held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(8)]

    async def refused() -> bool:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            return (await asyncio.wait_for(reader.read(-1), 10)).startswith(b"HTTP/1.1 503")
        finally:
            writer.close()

    await wait_for(refused, timeout=20, description="a connection over the cap refused")
    for _, w in held:
        w.close()
    await wait_for(lambda: _healthy(server.port), timeout=20, ignore=(OSError,),
                   description="served again once the held connections closed")


@pytest.mark.parametrize("head", [
    f"X-Big: {MARKER}{'A' * 20000}\r\n",
    "".join(f"X-{i}: {MARKER}\r\n" for i in range(300)),
    f"Bad Header With Spaces {MARKER}\r\n",
    f"X-Nul: {MARKER}\x00\r\n",
])
async def test_an_oversized_or_malformed_header_is_a_4xx_logged_without_its_text(
        server: Server, head: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logs:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /v1/hooks/ack HTTP/1.1\r\nHost: x\r\n" + head.encode("latin-1")
                     + b"\r\n")
        try:
            got = await asyncio.wait_for(_closed(reader), 30)
        finally:
            writer.close()
    status = int(got.split(b" ", 2)[1])
    assert 400 <= status < 500, got[:200]
    assert MARKER not in caplog.text
    assert "Traceback" not in caplog.text
    assert not any(MARKER in str(e) for e in logs), logs
    assert any(e.get("event") == "bad HTTP request refused" for e in logs), logs
    assert server.acks == []
    assert await _healthy(server.port)


async def test_a_body_in_several_segments_is_read_whole(server: Server) -> None:
    body = b'{"incident": "inc-1", "node": "n1", "kind": "checkpoint"}'
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /v1/hooks/ack HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    for i in range(0, len(body), 7):  # a slow but honest client: paced, not stalled
        writer.write(body[i:i + 7])
        await writer.drain()
        await asyncio.sleep(0.05)
    try:
        got = await asyncio.wait_for(_closed(reader), 30)
    finally:
        writer.close()
    assert got.startswith(b"HTTP/1.1 200"), got[:100]
    assert server.acks == [body]
