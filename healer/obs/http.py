"""The HTTP endpoints of the controller and the agent (aiohttp).

``/healthz``  the event loop is alive and every registered source has a fresh heartbeat
``/readyz``   caches synced and policies loaded (a follower is ready, just not leading)
``/metrics``  Prometheus exposition of this process's registry
``/debug/state``  redacted JSON of workers, open remediations and guardrail use; served only
              when the process was started with ``--debug-state`` (404 otherwise)
``/v1/hooks/ack`` (controller) signed webhook acks (:mod:`healer.adapters.acks`); bodies are
              capped at :data:`MAX_ACK_BODY` bytes and every bad request is a 4xx

The server binds to one address (``--http-host``; the chart passes the pod IP).
"""

from __future__ import annotations

import contextlib
import json
import math
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from healer.adapters.clock import SYSTEM_CLOCK
from healer.obs.redact import redact

MAX_ACK_BODY = 16 * 1024


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

    def beat(self, name: str, max_age: float) -> None:
        if not math.isfinite(max_age) or max_age <= 0:
            raise ValueError(f"heartbeat {name}: max age must be a positive finite number of "
                             f"seconds, not {max_age!r}")
        self.beats[name] = (self.clock(), max_age)

    def set_ready(self, name: str, ok: bool) -> None:
        self.ready[name] = ok

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


def make_app(health: Health, registry: CollectorRegistry,
             debug_state: Callable[[], dict[str, Any]] | None = None,
             ack: AckHandler | None = None) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        ok, detail = health.healthy()
        return web.json_response({"ok": ok, "heartbeats": detail}, status=200 if ok else 503)

    async def readyz(_: web.Request) -> web.Response:
        ok, detail = health.is_ready()
        return web.json_response({"ok": ok, "conditions": detail}, status=200 if ok else 503)

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
            body = await request.content.read(MAX_ACK_BODY + 1)
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


async def serve(app: web.Application, host: str, port: int,
                ssl_context: ssl.SSLContext | None = None) -> web.AppRunner:
    """Serve ``app`` on ``host:port`` (0: any free port; ``runner.addresses`` says which).

    Bound to one address (the pod's IP in a pod), plus the same port on 127.0.0.1 when ``host``
    is another specific address: only the pod itself reaches its loopback, and that is where
    ``kubectl port-forward`` connects."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    if port and host not in LOOPBACK_OR_ANY:
        with contextlib.suppress(OSError):  # best effort: the port may be taken on loopback
            await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context).start()
    return runner
