"""No redirect is followed with a signed body or a credential (issue 22 item 6): the
checkpoint and repair webhooks, slurmrestd (its JWT header) and topograph (a request that may
hold provider credentials), each answered by every redirect status pointing at another host
on loopback. The request is not re-sent there, and the error (the step's result) says why."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from healer.adapters.hooks import WebhookHook
from healer.adapters.slurm import SlurmrestdDriver, StaticToken
from healer.adapters.topograph import TopographClient
from healer.core.model import NodeView
from healer.errors import PermanentError
from healer.obs.http import serve
from healer.ports import HookKind, HookSpec
from healer_dev.testing import FakeNodes

REDIRECTS = (301, 302, 303, 307, 308)


class Keys:
    async def key(self, ref: str) -> bytes:
        return b"k"


@dataclass
class Servers:
    redirector: str = ""
    target: str = ""
    seen_by_target: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    status: int = 307


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    s = Servers()

    async def target(request: web.Request) -> web.Response:
        s.seen_by_target.append((request.path, dict(request.headers), await request.read()))
        return web.Response(text="{}", content_type="application/json")

    async def redirect(request: web.Request) -> web.Response:
        return _redirect(s.status, s.target + request.path_qs)

    t_app = web.Application()
    t_app.router.add_route("*", "/{tail:.*}", target)
    t_runner = await serve(t_app, "127.0.0.2", 0)  # another host
    r_app = web.Application()
    r_app.router.add_route("*", "/{tail:.*}", redirect)
    r_runner = await serve(r_app, "127.0.0.1", 0)
    s.target = f"http://127.0.0.2:{t_runner.addresses[0][1]}"
    s.redirector = f"http://127.0.0.1:{r_runner.addresses[0][1]}"
    try:
        yield s
    finally:
        await r_runner.cleanup()
        await t_runner.cleanup()


def _redirect(status: int, location: str) -> web.Response:
    return web.Response(status=status, headers={"Location": location})


@pytest.mark.parametrize("status", REDIRECTS)
async def test_a_webhook_never_follows_a_redirect_with_its_signed_body(
        servers: Servers, status: int) -> None:
    servers.status = status
    hook = WebhookHook(FakeNodes([NodeView("n1")]), Keys(), attempts=2)  # type: ignore[arg-type]
    spec = HookSpec(HookKind.WEBHOOK, "USR1", servers.redirector + "/hook", "ns/hmac")
    with pytest.raises(PermanentError) as e:
        await hook.checkpoint("inc-1", "n1", "n1", spec)
    assert f"HTTP {status} redirect to {servers.target}/hook not followed" in str(e.value)
    assert "never re-sends a signed or authenticated request" in str(e.value)
    with pytest.raises(PermanentError, match="not followed"):
        await hook.hand_off("inc-1", "n1", spec)
    assert servers.seen_by_target == []


@pytest.mark.parametrize("status", REDIRECTS)
async def test_slurmrestd_never_sends_its_token_through_a_redirect(
        servers: Servers, status: int) -> None:
    servers.status = status
    async with SlurmrestdDriver(servers.redirector, StaticToken("secret-jwt")) as d:
        with pytest.raises(PermanentError, match=f"HTTP {status} redirect to .* not followed"):
            await d.state("gpu-1")
    assert servers.seen_by_target == []


@pytest.mark.parametrize("status", REDIRECTS)
async def test_topograph_requests_never_follow_a_redirect(servers: Servers, status: int) -> None:
    servers.status = status
    tc = TopographClient(servers.redirector, {"provider": {"name": "aws", "creds": {"k": "v"}}},
                         backoff=0.01, attempts=2)
    with pytest.raises(PermanentError, match=f"HTTP {status} redirect to .* not followed"):
        await tc.generate()
    assert servers.seen_by_target == []
