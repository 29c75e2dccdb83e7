"""The HTTP endpoints of the controller and the agent (aiohttp).

``/healthz``  the event loop is alive and every registered source has a fresh heartbeat
``/readyz``   caches synced and policies loaded (a follower is ready, just not leading)
``/metrics``  Prometheus exposition of this process's registry
``/debug/state``  redacted JSON of workers, open remediations and guardrail use
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

REDACT = ("token", "password", "secret", "authorization", "cert", "key")


@dataclass
class Health:
    """Heartbeats (name → last beat, max age) and readiness conditions (name → bool)."""

    clock: Callable[[], float] = time.monotonic
    beats: dict[str, tuple[float, float]] = field(default_factory=dict)
    ready: dict[str, bool] = field(default_factory=dict)

    def beat(self, name: str, max_age: float) -> None:
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

    async def loop_heartbeat(self, every: float = 1.0) -> None:
        while True:
            self.beat("event-loop", every * 10)
            await asyncio.sleep(every)


def redact(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: ("<redacted>" if any(r in str(k).lower() for r in REDACT) else redact(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    return obj


AckHandler = Callable[[bytes, str], Awaitable[tuple[int, str]]]


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
        body = await request.read()
        status, text = await ack(body, request.headers.get("X-Healer-Signature", ""))
        return web.Response(status=status, text=text)

    app = web.Application()
    if ack is not None:
        app.router.add_post("/v1/hooks/ack", hook_ack)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/debug/state", debug)
    return app


async def serve(app: web.Application, host: str, port: int,
                ssl_context: ssl.SSLContext | None = None) -> web.AppRunner:
    """Serve ``app`` on ``host:port`` (0: any free port; ``runner.addresses`` says which)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    return runner
