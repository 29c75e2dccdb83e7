"""A small Kubernetes API client for the node agent: JSON over one aiohttp session.

The agent makes three kinds of call (read its Node, patch its Node's status, write Events).
kubernetes_asyncio's client imports every API group and model class of Kubernetes: about 60 MiB
of resident memory on every GPU node for three URLs (docs/scaling.md, "the agent"). This module
is the agent's whole client instead: the configuration (a kubeconfig's current or named context:
its server, CA, client certificate and key or bearer token, as data or files; or the in-cluster
service account, whose token file is re-read as the kubelet rotates it), and one
:meth:`LiteClient.request`, whose errors are healer's own (:func:`status_error`, the same
mapping the daemon's client uses). Exec credential plugins are not supported (an agent runs on
its service account). The one retry policy (:data:`healer.adapters.retry.KUBERNETES`) retries
what is transient, honouring a 429's ``Retry-After``.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import yaml

from healer.adapters.calls import timed
from healer.adapters.retry import KUBERNETES
from healer.errors import (
    ConfigError,
    ConflictError,
    ForbiddenError,
    HealerError,
    NotFoundError,
    PermanentError,
    TransientError,
)

#: Where a pod finds its service account (the in-cluster configuration).
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
#: A kubeconfig larger than this is refused (real ones are a few KiB).
KUBECONFIG_MAX_BYTES = 4 << 20


def status_error(status: int, message: str, retry_after: str | None = None) -> HealerError:
    """healer's error for an HTTP status from the API server (healer/errors.py)."""
    if status == 409:
        return ConflictError(message)
    if status == 404:
        return NotFoundError(message)
    if status in (401, 403):
        return ForbiddenError(message)
    if status == 410:
        return TransientError(message)
    if status == 429 or status >= 500:
        delay = None
        if retry_after is not None:
            try:
                delay = float(retry_after)
            except ValueError:
                delay = None
        return TransientError(message, delay)
    return PermanentError(message)


@dataclass(frozen=True, slots=True)
class LiteConfig:
    server: str
    ca_data: bytes | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    token: str | None = None
    token_file: str | None = None
    insecure: bool = False


def _data(entry: Mapping[str, Any], key: str, base: str) -> bytes | None:
    """A kubeconfig field given as ``<key>-data`` (base64) or as ``<key>`` (a file)."""
    raw = entry.get(f"{key}-data")
    if raw:
        try:
            return base64.b64decode(str(raw), validate=True)
        except ValueError as e:
            raise ConfigError(f"{key}-data: not base64 ({e})") from None
    path = entry.get(key)
    if not path:
        return None
    full = os.path.join(base, str(path))
    try:
        with open(full, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{key} {full}: {e.strerror or e}") from None


def _named(doc: Mapping[str, Any], key: str, inner: str, name: str) -> Mapping[str, Any]:
    for item in doc.get(key) or []:
        if isinstance(item, Mapping) and item.get("name") == name:
            got = item.get(inner) or {}
            if isinstance(got, Mapping):
                return got
    raise ConfigError(f"no {inner} named {name!r} in {key}")


def load_kubeconfig(path: str, context: str | None = None) -> LiteConfig:
    """The connection a kubeconfig's (current, or named) context describes; ConfigError with
    the file and what is wrong for anything else."""
    try:
        if os.path.getsize(path) > KUBECONFIG_MAX_BYTES:
            raise ConfigError(f"kubeconfig {path}: over {KUBECONFIG_MAX_BYTES >> 20} MiB")
        with open(path, "rb") as f:
            doc = yaml.safe_load(f.read().decode("utf-8"))
    except OSError as e:
        raise ConfigError(f"kubeconfig {path}: {e.strerror or e}") from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as e:
        raise ConfigError(f"kubeconfig {path}: not a readable YAML kubeconfig "
                          f"({type(e).__name__})") from None
    if not isinstance(doc, Mapping):
        raise ConfigError(f"kubeconfig {path}: not a kubeconfig (expected a mapping)")
    try:
        ctx = _named(doc, "contexts", "context", context or str(doc.get("current-context", "")))
        cluster = _named(doc, "clusters", "cluster", str(ctx.get("cluster", "")))
        user = _named(doc, "users", "user", str(ctx.get("user", ""))) if ctx.get("user") else {}
        if user.get("exec") or user.get("auth-provider"):
            raise ConfigError("exec credential plugins and auth providers are not supported "
                              "by the agent (give it a token, a client certificate, or run "
                              "it on its service account)")
        base = os.path.dirname(os.path.abspath(path))
        server = str(cluster.get("server") or "")
        if not server.startswith(("https://", "http://")):
            raise ConfigError(f"the cluster's server is not an http(s) URL: {server[:200]!r}")
        token_file = user.get("tokenFile")
        return LiteConfig(server=server.rstrip("/"),
                          ca_data=_data(cluster, "certificate-authority", base),
                          cert_data=_data(user, "client-certificate", base),
                          key_data=_data(user, "client-key", base),
                          token=str(user["token"]) if user.get("token") else None,
                          token_file=os.path.join(base, str(token_file)) if token_file else None,
                          insecure=bool(cluster.get("insecure-skip-tls-verify")))
    except ConfigError as e:
        raise ConfigError(f"kubeconfig {path}: {e}") from None


def in_cluster(root: str = SERVICE_ACCOUNT) -> LiteConfig:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get(
        "KUBERNETES_SERVICE_PORT")
    token = os.path.join(root, "token")
    if not host or not port or not os.path.exists(token):
        raise ConfigError("not running in a cluster with a ServiceAccount (no "
                          "KUBERNETES_SERVICE_HOST/PORT or no token); pass --kubeconfig FILE")
    host = f"[{host}]" if ":" in host else host
    ca = os.path.join(root, "ca.crt")
    try:
        with open(ca, "rb") as f:
            ca_data = f.read()
    except OSError as e:
        raise ConfigError(f"{ca}: {e.strerror or e}") from None
    return LiteConfig(server=f"https://{host}:{port}", ca_data=ca_data, token_file=token)


def _ssl(cfg: LiteConfig) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=cfg.ca_data.decode() if cfg.ca_data else None)
    if cfg.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_data and cfg.key_data:
        # the ssl module loads a chain from files only: written once, read, removed
        with tempfile.TemporaryDirectory(prefix="healer-agent-") as tmp:
            cert, key = os.path.join(tmp, "c.pem"), os.path.join(tmp, "k.pem")
            for p, data in ((cert, cfg.cert_data), (key, cfg.key_data)):
                fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            ctx.load_cert_chain(cert, key)
    return ctx


class LiteClient:
    """JSON requests to one API server (see the module doc). ``close`` ends the session."""

    def __init__(self, cfg: LiteConfig, *, timeout: float = 10.0) -> None:
        self.cfg = cfg
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._ssl = _ssl(cfg) if cfg.server.startswith("https://") else None
        self._session: aiohttp.ClientSession | None = None

    def _token(self) -> str | None:
        if self.cfg.token_file:
            try:
                with open(self.cfg.token_file) as f:
                    return f.read().strip()
            except OSError as e:
                raise ConfigError(f"token file {self.cfg.token_file}: {e.strerror}") from None
        return self.cfg.token

    async def request(self, method: str, path: str, body: Any = None, *,
                      content_type: str = "application/json", what: str = "",
                      attempts: int = 4) -> dict[str, Any]:
        """``method path`` with a JSON ``body``; the decoded answer. healer's errors; the
        transient ones retried by the one retry policy."""
        what = what or f"{method} {path}"

        async def once() -> dict[str, Any]:
            with timed("kubernetes", what.split(" ", 1)[0]):
                return await self._once(method, path, body, content_type, what)

        return await KUBERNETES.but(attempts=attempts).run(what, once)

    async def _once(self, method: str, path: str, body: Any, content_type: str,
                    what: str) -> dict[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl if self._ssl else False, limit=4))
        headers = {"Accept": "application/json", "User-Agent": "healer-agent"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = orjson.dumps(body)
        try:
            async with self._session.request(method, self.cfg.server + path, data=data,
                                             headers=headers, timeout=self.timeout) as r:
                raw = await r.read()
                if r.status >= 300:
                    raise status_error(r.status, f"{what}: HTTP {r.status} {_message(raw)}",
                                       r.headers.get("Retry-After"))
        except HealerError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise TransientError(f"{what}: {type(e).__name__}: {e}") from e
        out = orjson.loads(raw) if raw else {}
        if not isinstance(out, dict):
            raise PermanentError(f"{what}: the API server answered something not an object")
        return out

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _message(raw: bytes) -> str:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:200].decode("utf-8", "replace")
    if isinstance(doc, dict) and doc.get("message"):
        return str(doc["message"])[:300]
    return ""


def lite_client(kubeconfig: str | None, context: str | None = None, *,
                timeout: float = 10.0) -> LiteClient:
    """The agent's client: from ``kubeconfig``, else the in-cluster service account."""
    cfg = load_kubeconfig(kubeconfig, context) if kubeconfig else in_cluster()
    return LiteClient(cfg, timeout=timeout)
