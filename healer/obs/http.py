"""The HTTP endpoints of the controller and the agent (aiohttp).

``/healthz``  the event loop is alive and every registered source has a fresh heartbeat
``/readyz``   caches synced and policies loaded (a follower is ready, just not leading); both
              bodies list under ``degraded`` each dependency healer cannot use now and why
              (Slurm's view: a NodeSet's cluster unreadable, its token Secret missing)
``/metrics``  Prometheus exposition of this process's registry
``/debug/state``  redacted JSON of workers, open remediations and guardrail use; served only
              when the process was started with ``--debug-state`` (404 otherwise)
``/v1/hooks/ack`` (controller) signed webhook acks (:mod:`healer.adapters.acks`); bodies are
              capped at :data:`MAX_ACK_BODY` bytes and every bad request is a 4xx

The server binds to one address (``--http-host``; the chart passes the pod IP) and is built for
clients that are slow on purpose: a connection must finish its request headers within
:data:`HEADER_TIMEOUT` of opening (or of its previous response; an idle keep-alive connection
is closed after as long), an ack's body must arrive within :data:`BODY_TIMEOUT` (408), at most
:data:`MAX_CONNECTIONS` connections are open at once (the next one is answered 503 and closed),
a header line over 8190 bytes or more than 128 headers is a 400, and a malformed request is
logged as one line naming the error's type, never with a traceback or the request's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from healer.adapters.clock import SYSTEM_CLOCK
from healer.obs.redact import redact

MAX_ACK_BODY = 16 * 1024
#: Seconds a connection has to send complete request headers (after opening, or after its
#: previous response); an idle keep-alive connection is closed after as long.
HEADER_TIMEOUT = 10.0
#: Seconds an ack's body (at most MAX_ACK_BODY bytes) has to arrive once its headers did.
BODY_TIMEOUT = 10.0
#: Connections open at once; more are answered 503 and closed at once.
MAX_CONNECTIONS = 256

log = structlog.get_logger("healer.http")


@dataclass
class Health:
    """Heartbeats (name → last beat, max age) and readiness conditions (name → bool).

    Every long-running loop of the daemon beats its own heartbeat each time it comes round
    (the event loop itself, each telemetry source's polls, the node watch, reconcile, the
    policy reload, the spare-depth and retention loops); ``/healthz`` fails while any one is
    older than its max age, so a stalled loop is never hidden behind a live event loop."""

    clock: Callable[[], float] = SYSTEM_CLOCK.now  # the daemon's: its loops sleep on it
    beats: dict[str, tuple[float, float]] = field(default_factory=dict)
    ready: dict[str, bool] = field(default_factory=dict)
    #: what the daemon depends on and cannot reach or read (name → why), shown in the bodies
    #: of /healthz and /readyz without failing either: a missing Secret is the operator's to
    #: fix, and restarting or unreadying healer would not fix it (it would stop the acks)
    degraded: dict[str, str] = field(default_factory=dict)

    def beat(self, name: str, max_age: float) -> None:
        if not math.isfinite(max_age) or max_age <= 0:
            raise ValueError(f"heartbeat {name}: max age must be a positive finite number of "
                             f"seconds, not {max_age!r}")
        self.beats[name] = (self.clock(), max_age)

    def set_ready(self, name: str, ok: bool) -> None:
        self.ready[name] = ok

    def set_dependency(self, name: str, why_not: str) -> None:
        """``why_not`` the dependency ``name`` is unusable; "" when it is usable again."""
        if why_not:
            self.degraded[name] = why_not
        else:
            self.degraded.pop(name, None)

    def healthy(self) -> tuple[bool, dict[str, Any]]:
        now = self.clock()
        out = {n: {"age": round(now - t, 3), "maxAge": m, "ok": now - t <= m}
               for n, (t, m) in self.beats.items()}
        return all(v["ok"] for v in out.values()), out

    def is_ready(self) -> tuple[bool, dict[str, bool]]:
        return bool(self.ready) and all(self.ready.values()), dict(self.ready)

    async def loop_heartbeat(self, sleep: Callable[[float], Awaitable[None]],
                             every: float = 1.0) -> None:
        """Beat ``event-loop`` every ``every`` seconds of ``sleep`` (the daemon's clock)."""
        while True:
            self.beat("event-loop", every * 10)
            await sleep(every)


AckHandler = Callable[[bytes, str, str], Awaitable[tuple[int, str]]]


async def _read_body(request: web.Request, cap: int) -> bytes:
    """The whole body, or its first ``cap`` bytes (``read(n)`` returns what has arrived so
    far, which for a body in several segments is only a part)."""
    chunks: list[bytes] = []
    got = 0
    while got < cap:
        chunk = await request.content.read(cap - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def make_app(health: Health, registry: CollectorRegistry,
             debug_state: Callable[[], dict[str, Any]] | None = None,
             ack: AckHandler | None = None, *,
             body_timeout: float = BODY_TIMEOUT) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        ok, detail = health.healthy()
        return web.json_response({"ok": ok, "heartbeats": detail,
                                  "degraded": dict(health.degraded)}, status=200 if ok else 503)

    async def readyz(_: web.Request) -> web.Response:
        ok, detail = health.is_ready()
        return web.json_response({"ok": ok, "conditions": detail,
                                  "degraded": dict(health.degraded)}, status=200 if ok else 503)

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def debug(_: web.Request) -> web.Response:
        state = debug_state() if debug_state is not None else {}
        return web.Response(text=json.dumps(redact(state), indent=2, default=str),
                            content_type="application/json")

    async def hook_ack(request: web.Request) -> web.Response:
        assert ack is not None
        if (request.content_length or 0) > MAX_ACK_BODY:
            return web.Response(status=413, text=f"body over {MAX_ACK_BODY} bytes")
        try:  # read one byte past the cap: a chunked body that says no length is cut there
            async with asyncio.timeout(body_timeout):  # a body sent a byte a minute
                body = await _read_body(request, MAX_ACK_BODY + 1)
        except TimeoutError:
            return web.Response(status=408, text=f"body not received within "
                                                 f"{body_timeout:g} s")
        except (ConnectionError, ValueError, web.HTTPException):
            return web.Response(status=400, text="unreadable body")
        if len(body) > MAX_ACK_BODY:
            return web.Response(status=413, text=f"body over {MAX_ACK_BODY} bytes")
        status, text = await ack(body, request.headers.get("X-Healer-Signature", ""),
                                 request.headers.get("Content-Type", ""))
        return web.Response(status=status, text=text)

    app = web.Application(client_max_size=MAX_ACK_BODY)
    if ack is not None:
        app.router.add_post("/v1/hooks/ack", hook_ack)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    if debug_state is not None:  # off unless the process was started with --debug-state
        app.router.add_get("/debug/state", debug)
    return app


LOOPBACK_OR_ANY = frozenset({"127.0.0.1", "::1", "localhost", "0.0.0.0", "::", ""})


class _QuietLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger: a request it cannot parse (an oversized header, bad bytes) is
    one warning naming the error's type and status, never a traceback that would carry the
    client's text into the log; anything else (a bug of ours) is logged with its traceback."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})

    def log(self, level: int, msg: object, *args: object, exc_info: Any = None,
            **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else None
        if isinstance(exc, HttpProcessingError):  # the client's fault: no text of theirs
            (log.debug if level <= logging.DEBUG else log.warning)(
                "bad HTTP request refused", error=type(exc).__name__,
                status=getattr(exc, "code", 400))
        elif exc is not None:  # a failure of ours: the traceback is what is needed
            log.error("HTTP request failed", error=type(exc).__name__, exc_info=exc)
        else:
            self.logger.log(level, msg, *args, **kwargs)


class _Refuse(asyncio.Protocol):
    """A connection over :data:`MAX_CONNECTIONS`: 503 and closed before reading anything."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
                        b"Content-Length: 0\r\n\r\n")
        transport.close()


class _Capped:
    """The server's protocol factory with a cap on open connections (everything else is the
    aiohttp server it wraps)."""

    def __init__(self, server: web.Server, cap: int) -> None:
        self._server = server
        self._cap = cap
        self.refused = 0

    def __call__(self) -> asyncio.Protocol:
        if len(self._server.connections) >= self._cap:
            self.refused += 1
            return _Refuse()
        return self._server()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class _Runner(web.AppRunner):
    """An AppRunner whose server refuses connections over ``max_connections``."""

    def __init__(self, app: web.Application, max_connections: int, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.max_connections = max_connections

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return cast(web.Server, _Capped(server, self.max_connections))


async def serve(app: web.Application, host: str, port: int,
                ssl_context: ssl.SSLContext | None = None, *,
                header_timeout: float = HEADER_TIMEOUT,
                max_connections: int = MAX_CONNECTIONS) -> web.AppRunner:
    """Serve ``app`` on ``host:port`` (0: any free port; ``runner.addresses`` says which),
    within the module's limits on slow and numerous clients.

    Bound to one address (the pod's IP in a pod), plus the same port on 127.0.0.1 when ``host``
    is another specific address: only the pod itself reaches its loopback, and that is where
    ``kubectl port-forward`` connects."""
    # keepalive_timeout is also how long a new connection may take to send its headers: the
    # server closes a connection still waiting for a complete request then
    runner = _Runner(app, max_connections, access_log=None, keepalive_timeout=header_timeout,
                     max_line_size=8190, max_field_size=8190, max_headers=128,
                     logger=_QuietLogger())
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    if port and host not in LOOPBACK_OR_ANY:
        with contextlib.suppress(OSError):  # best effort: the port may be taken on loopback
            await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context).start()
    return runner
