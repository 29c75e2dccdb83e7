"""Building the API client (every kubeconfig problem a one-line ConfigError) and translating
kubernetes_asyncio errors into healer's own."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import orjson
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from healer.adapters.calls import timed
from healer.adapters.kube.lite import status_error
from healer.adapters.retry import KUBERNETES
from healer.errors import (
    ConfigError,
    ConflictError,
    HealerError,
    PermanentError,
    TransientError,
)

T = TypeVar("T")


#: A kubeconfig larger than this is refused (real ones are a few KiB).
KUBECONFIG_MAX_BYTES = 4 << 20
#: Loading a kubeconfig (which may run an exec credential plugin) may take this long.
KUBECONFIG_TIMEOUT = 60.0


async def make_api_client(kubeconfig: str | None = None, context: str | None = None,
                          token: str | None = None) -> client.ApiClient:
    """An ApiClient from a kubeconfig, the in-cluster service account, or a bearer token.

    Raises :class:`ConfigError` with one line naming the file and what is wrong with it:
    missing, not a regular file, unreadable, too large, not YAML, not a kubeconfig, no such
    context; or, without a kubeconfig, not running in a cluster."""
    cfg = client.Configuration()
    if kubeconfig:
        _check_kubeconfig_file(kubeconfig)
        try:
            await asyncio.wait_for(  # a bound on a library call, in real time
                config.load_kube_config(config_file=kubeconfig, context=context,
                                        client_configuration=cfg, persist_config=False),
                KUBECONFIG_TIMEOUT)
        except TimeoutError:
            raise ConfigError(f"kubeconfig {kubeconfig}: loading it took longer than "
                              f"{KUBECONFIG_TIMEOUT:g} s (an exec credential plugin?)") from None
        except Exception as e:  # the library raises anything from KeyError to RecursionError
            raise ConfigError(f"kubeconfig {kubeconfig}: {_kubeconfig_reason(e)}") from None
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except Exception as e:
            raise ConfigError("no --kubeconfig given and not running in a cluster with a "
                              f"ServiceAccount ({_one_line(e)}); pass --kubeconfig FILE or "
                              "set $KUBECONFIG") from None
    if not cfg.host or not str(cfg.host).startswith(("https://", "http://")):
        raise ConfigError(f"kubeconfig {kubeconfig}: the cluster's server is not an http(s) "
                          f"URL: {str(cfg.host)[:200]!r}")
    if token is not None:
        cfg.api_key = {"BearerToken": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        cfg.cert_file = None
        cfg.key_file = None
    api = client.ApiClient(cfg)
    _no_env_lookups(api)
    return api


#: Environment variables that configure an HTTP proxy (aiohttp's ``trust_env`` reads them).
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy")


def _no_env_lookups(api: client.ApiClient) -> None:
    """kubernetes_asyncio's session trusts the environment, so aiohttp looks up proxy
    variables and reads ``~/.netrc`` (a file read in a thread) on *every* request: a tenth of
    the daemon's CPU in a burst of writes. Without a proxy configured there is nothing to find;
    the session then stops looking (with one, it is left as it was)."""
    if any(os.environ.get(k) for k in PROXY_ENV):
        return
    session = api.rest_client.pool_manager
    if hasattr(session, "_trust_env"):
        session._trust_env = False


def _check_kubeconfig_file(path: str) -> None:
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"kubeconfig {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"kubeconfig {path}: not a regular file")
    if st.st_size > KUBECONFIG_MAX_BYTES:
        raise ConfigError(f"kubeconfig {path}: {st.st_size} bytes, over the "
                          f"{KUBECONFIG_MAX_BYTES >> 20} MiB a kubeconfig may have")
    try:
        with open(path, "rb") as f:
            raw = f.read(KUBECONFIG_MAX_BYTES + 1)
        doc = yaml.safe_load(raw.decode("utf-8"))
    except OSError as e:
        raise ConfigError(f"kubeconfig {path}: cannot read: {e.strerror or e}") from None
    except Exception as e:  # YAML errors, not UTF-8, RecursionError
        raise ConfigError(f"kubeconfig {path}: {_kubeconfig_reason(e)}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"kubeconfig {path}: not a kubeconfig (expected a mapping with "
                          f"clusters, contexts and users, got {type(doc).__name__})")
    for key, inner in (("clusters", "cluster"), ("contexts", "context"), ("users", "user")):
        items = doc.get(key)
        if items is None:
            continue
        if not isinstance(items, list) or not all(
                isinstance(i, dict) and isinstance(i.get("name"), str)
                and isinstance(i.get(inner) or {}, dict) for i in items):
            raise ConfigError(f"kubeconfig {path}: {key}: expected a list of {{name: ..., "
                              f"{inner}: {{...}}}}")


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]


def _kubeconfig_reason(e: BaseException) -> str:
    if isinstance(e, yaml.YAMLError):
        return f"not valid YAML ({_one_line(e)})"
    if isinstance(e, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(e, config.ConfigException):
        return _one_line(e)
    if isinstance(e, RecursionError):
        return "nested too deeply (recursive YAML aliases?)"
    return f"not a usable kubeconfig ({type(e).__name__}: {_one_line(e)})"


def translate(e: BaseException, what: str) -> HealerError:
    """Map a library error to healer's tree (see healer/errors.py)."""
    if isinstance(e, HealerError):
        return e
    if isinstance(e, ApiException):
        status = e.status or 0
        headers: Any = e.headers or {}
        return status_error(status, f"{what}: HTTP {status} {_reason(e)}".rstrip(),
                            headers.get("Retry-After") if "Retry-After" in headers else None)
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
    """Run one API call; translate errors; retry transient ones (the
    :data:`~healer.adapters.retry.KUBERNETES` policy with ``attempts``).

    A 409 conflict is retried only with ``retry_conflicts`` (then ``fn`` must re-read the
    object, so the retry works on fresh data); otherwise it surfaces as ConflictError.
    """

    def retryable(e: BaseException) -> bool:
        return retry_conflicts or not isinstance(e, ConflictError)

    async def once() -> T:
        with timed("kubernetes", what.split(" ", 1)[0]):
            try:
                return await fn()
            except HealerError:
                raise
            except Exception as e:
                raise translate(e, what) from e

    return await KUBERNETES.but(attempts=attempts).run(what, once, retry_if=retryable)


async def plain_json(fn: Any) -> dict[str, Any]:
    """Call a client method with ``_preload_content=False`` and decode its body with orjson:
    no round trip through the client's model classes (or its slower JSON decoder)."""
    resp = await fn(_preload_content=False)
    try:
        body = await resp.read()
    finally:
        resp.release()
    if not 200 <= resp.status <= 299:
        e = ApiException(status=resp.status, reason=resp.reason)
        e.body = body.decode("utf-8", "replace")
        e.headers = resp.headers
        raise e
    out = orjson.loads(body)
    if not isinstance(out, dict):
        raise ApiException(status=0, reason="the API server answered something not an object")
    return out


def to_dict(api: client.ApiClient, obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    out = api.sanitize_for_serialization(obj)
    assert isinstance(out, dict)
    return out


class ApiEventWriter:
    """EventWriter (:mod:`healer.adapters.kube.events`) over the daemon's ApiClient."""

    def __init__(self, api: client.ApiClient) -> None:
        self.events = client.EventsV1Api(api)

    async def create(self, namespace: str, body: dict[str, Any], what: str) -> None:
        await call(what, lambda: plain_json(lambda **kw: self.events.create_namespaced_event(
            namespace, body, **kw)))  # type: ignore[arg-type]

    async def patch(self, namespace: str, name: str, body: dict[str, Any], what: str) -> None:
        await call(what, lambda: plain_json(lambda **kw: self.events.patch_namespaced_event(  # type: ignore[call-arg]
            name, namespace, body, _content_type="application/merge-patch+json", **kw)))
