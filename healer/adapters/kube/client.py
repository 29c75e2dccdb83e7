"""Building the API client and translating kubernetes_asyncio errors into healer's own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from healer.adapters.calls import timed
from healer.errors import (
    ConflictError,
    ForbiddenError,
    HealerError,
    NotFoundError,
    PermanentError,
    TransientError,
)

T = TypeVar("T")

#: Field manager and reporting controller for everything healer writes.
FIELD_MANAGER = "healer"
CONTROLLER = "healer.io/healer"


async def make_api_client(kubeconfig: str | None = None, context: str | None = None,
                          token: str | None = None) -> client.ApiClient:
    """An ApiClient from a kubeconfig, the in-cluster service account, or a bearer token."""
    cfg = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, context=context,
                                      client_configuration=cfg, persist_config=False)
    else:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    if token is not None:
        cfg.api_key = {"BearerToken": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        cfg.cert_file = None
        cfg.key_file = None
    return client.ApiClient(cfg)


def translate(e: BaseException, what: str) -> HealerError:
    """Map a library error to healer's tree (see healer/errors.py)."""
    if isinstance(e, HealerError):
        return e
    if isinstance(e, ApiException):
        status = e.status or 0
        reason = _reason(e)
        msg = f"{what}: HTTP {status} {reason}".rstrip()
        if status == 409:
            return ConflictError(msg)
        if status == 404:
            return NotFoundError(msg)
        if status in (401, 403):
            return ForbiddenError(msg)
        if status == 410:
            return TransientError(msg)
        if status == 429 or status >= 500:
            retry_after = None
            headers: Any = e.headers or {}
            if "Retry-After" in headers:
                try:
                    retry_after = float(headers["Retry-After"])
                except ValueError:
                    retry_after = None
            return TransientError(msg, retry_after)
        return PermanentError(msg)
    if isinstance(e, (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, OSError)):
        return TransientError(f"{what}: {type(e).__name__}: {e}")
    return PermanentError(f"{what}: {type(e).__name__}: {e}")


def _reason(e: ApiException) -> str:
    try:
        body = json.loads(e.body) if e.body else {}
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])
    except (ValueError, TypeError):
        pass
    return str(e.reason or "")


async def call(what: str, fn: Callable[[], Awaitable[T]], *, attempts: int = 4,
               retry_conflicts: bool = False) -> T:
    """Run one API call; translate errors; retry transient ones with jittered backoff.

    A 409 conflict is retried only with ``retry_conflicts`` (then ``fn`` must re-read the
    object, so the retry works on fresh data); otherwise it surfaces as ConflictError.
    """

    def retryable(e: BaseException) -> bool:
        return isinstance(e, TransientError) and (
            retry_conflicts or not isinstance(e, ConflictError))

    async for attempt in AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.2),
        retry=retry_if_exception(retryable),
        reraise=True,
    ):
        with attempt, timed("kubernetes", what.split(" ", 1)[0]):
            try:
                return await fn()
            except HealerError:
                raise
            except Exception as e:
                raise translate(e, what) from e
    raise AssertionError("unreachable")  # pragma: no cover


def to_dict(api: client.ApiClient, obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    out = api.sanitize_for_serialization(obj)
    assert isinstance(out, dict)
    return out
