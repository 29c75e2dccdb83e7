"""NVIDIA topograph's API server: ask it to generate the cluster topology again.

The documented API (topograph ``docs/api.md``; the server listens on port 49021 by default):

* ``POST {url}/v1/generate`` with a JSON body ``{"provider": {name, creds, params},
  "engine": {name, params}, "nodes": [...]}`` (every section optional) answers
  ``202 Accepted`` with a request id as plain text, or an error status for an invalid request.
  Requests that arrive within topograph's ``requestAggregationDelay`` are merged into one, so
  sending the same request again is harmless.
* ``GET {url}/v1/topology?uid=ID``: ``200`` the request completed, ``202`` still in progress
  (older releases: ``102``), ``404`` unknown id (e.g. topograph restarted), anything else: the
  request failed, with topograph's message.

healer sends the body the operator provides (a JSON file, mounted from a Secret when it holds
provider credentials) unchanged: it never invents a provider or credentials. For healer's
topology step the engine must be ``slinky`` with ``useDynamicNodes: true``: topograph then
writes ``topology.slinky.slurm.net/spec`` on the Nodes and the Slinky operator pushes it to
Slurm (``gpu-slurm-facts.md`` sections 4.9 and 6). :func:`load_request` refuses a body that
explicitly asks for anything else, since healer would wait for an annotation that never comes.

Errors: connection failures, timeouts, HTTP 429 and 5xx → :class:`~healer.errors.TransientError`
(retried: :data:`healer.adapters.retry.WEBHOOK`, ``attempts`` tries in all, waits from
``backoff``); any other 4xx → :class:`~healer.errors.PermanentError` carrying topograph's
answer. The request body is never put into an error message or a log (it may hold credentials).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from healer.adapters.calls import timed
from healer.adapters.redirects import refused_redirect
from healer.adapters.retry import WEBHOOK
from healer.errors import ConfigError, PermanentError, TransientError

__all__ = [
    "DEFAULT_PORT",
    "RequestState",
    "RequestStatus",
    "TopographClient",
    "check_request",
    "load_request",
]

T = TypeVar("T")

DEFAULT_PORT = 49021
#: topograph's engine that annotates Nodes for Slinky (an engine of topograph's, not a Slurm
#: driver of healer's: :mod:`healer.core.slurm_drivers` names those)
SLINKY_ENGINE = "slinky"
#: How much of an error answer goes into a message.
MAX_BODY = 500


def load_request(path: str | Path) -> dict[str, Any]:
    """The ``/v1/generate`` body from the operator's JSON file (ConfigError if it is missing,
    not a JSON object, or explicitly asks for an engine that writes no Node annotation)."""
    p = Path(path)
    try:
        raw = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read the topograph request {p}: {e.strerror or e}") from e
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"the topograph request {p} is not JSON: {e}") from e
    if not isinstance(body, dict):
        raise ConfigError(f"the topograph request {p} must be a JSON object "
                          "({provider, engine, nodes})")
    check_request(body, str(p))
    return body


def check_request(body: Mapping[str, Any], where: str = "the topograph request") -> None:
    """Refuse a body whose engine cannot write ``topology.slinky.slurm.net/spec``. Sections
    left out are fine (topograph's own configuration supplies them)."""
    engine = body.get("engine")
    if engine is None:
        return
    if not isinstance(engine, Mapping):
        raise ConfigError(f"{where}: engine must be an object {{name, params}}")
    name = engine.get("name")
    if name not in (None, SLINKY_ENGINE):
        raise ConfigError(f"{where}: engine {name!r} does not annotate Nodes; healer needs the "
                          "slinky engine with useDynamicNodes: true")
    params = engine.get("params")
    if params is not None and not isinstance(params, Mapping):
        raise ConfigError(f"{where}: engine.params must be an object")
    if isinstance(params, Mapping) and params.get("useDynamicNodes") is False:
        raise ConfigError(f"{where}: engine.params.useDynamicNodes is false, so topograph "
                          "would not write topology.slinky.slurm.net/spec on the Nodes")


class RequestState(enum.Enum):
    DONE = "done"  # 200: topograph finished the request
    RUNNING = "running"  # 202 / 102: waiting for the aggregation delay or still generating
    UNKNOWN = "unknown"  # 404: no such request (topograph restarted, or the id expired)
    FAILED = "failed"  # any other answer: the request failed inside topograph


@dataclass(frozen=True, slots=True)
class RequestStatus:
    state: RequestState
    detail: str = ""


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_BODY else text[:MAX_BODY] + "..."


class TopographClient:
    """``POST {url}/v1/generate`` with ``request_body``; ``GET {url}/v1/topology?uid=``.

    ``session``: an aiohttp session to share (None: one per call, closed after it; calls are
    rare: one per incident plus status reads while the step waits).
    """

    def __init__(self, url: str, request_body: Mapping[str, Any], *,
                 session: aiohttp.ClientSession | None = None, timeout: float = 10.0,
                 attempts: int = 3, backoff: float = 0.5) -> None:
        if not url:
            raise ConfigError("topograph mode needs the topograph API URL (--topograph-url)")
        self.url = url.rstrip("/")
        self.body = json.dumps(dict(request_body), sort_keys=True).encode()
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self._session = session

    def __repr__(self) -> str:  # never the body: it may hold provider credentials
        return f"TopographClient({self.url!r})"

    async def generate(self) -> str:
        """Ask for a new topology; the request id topograph answers with."""
        where = f"topograph at {self.url}: POST /v1/generate"

        async def once(session: aiohttp.ClientSession) -> str:
            status, text = await self._send(session, "POST", "/v1/generate", where)
            if status >= 500 or status == 429:
                raise TransientError(f"{where}: HTTP {status}: {_clip(text)}")
            if status >= 400:
                raise PermanentError(f"{where} refused the request: HTTP {status}: "
                                     f"{_clip(text) or '(empty body)'}")
            if status not in (200, 201, 202):
                raise PermanentError(f"{where}: unexpected HTTP {status}: {_clip(text)}")
            return text.strip()

        return await self._retrying("POST generate", once)

    async def status(self, uid: str) -> RequestStatus:
        """Where request ``uid`` stands (``GET /v1/topology?uid=``)."""
        where = f"topograph at {self.url}: GET /v1/topology"

        async def once(session: aiohttp.ClientSession) -> RequestStatus:
            status, text = await self._send(session, "GET", "/v1/topology", where,
                                            params={"uid": uid})
            if status == 200:
                return RequestStatus(RequestState.DONE)
            if status in (102, 202):
                return RequestStatus(RequestState.RUNNING, _clip(text))
            if status == 404:
                return RequestStatus(RequestState.UNKNOWN, _clip(text))
            if status == 429 or status in (502, 503, 504):
                raise TransientError(f"{where}: HTTP {status}: {_clip(text)}")
            return RequestStatus(RequestState.FAILED, f"HTTP {status}: {_clip(text)}")

        return await self._retrying("GET topology", once)

    async def _retrying(self, op: str,
                        fn: Callable[[aiohttp.ClientSession], Awaitable[T]]) -> T:
        session = self._session or aiohttp.ClientSession()

        async def once() -> T:
            with timed("topograph", op):
                return await fn(session)

        policy = WEBHOOK.but(attempts=self.attempts, first=self.backoff, jitter=self.backoff)
        try:
            return await policy.run(op, once)
        finally:
            if self._session is None:
                await session.close()

    async def _send(self, session: aiohttp.ClientSession, method: str, path: str, where: str,
                    params: Mapping[str, str] | None = None) -> tuple[int, str]:
        headers = {"Accept": "text/plain, application/json"}
        data: bytes | None = None
        if method == "POST":
            headers["Content-Type"] = "application/json"
            data = self.body
        try:
            async with session.request(method, self.url + path, data=data, params=params,
                                       headers=headers, allow_redirects=False,
                                       timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
                if 300 <= r.status < 400:  # the request may hold provider credentials
                    raise PermanentError(refused_redirect(f"topograph {where}",
                                                          self.url + path, r.status, r.headers))
                return r.status, await r.text()
        except aiohttp.ClientConnectorError as e:
            raise TransientError(f"{where}: topograph is unreachable: {e}") from e
        except (aiohttp.ClientError, TimeoutError) as e:
            raise TransientError(f"{where}: {type(e).__name__}: {e}") from e
