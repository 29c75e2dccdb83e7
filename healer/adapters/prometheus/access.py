"""Where Prometheus is and how healer proves who it is: :class:`Access` (the settings both
clients are made from: the daemon's, :mod:`.http`, and the offline tools', :mod:`.offline`), the
URL check and the bearer token file, each failing with one line (never a traceback, never a
request sent half-configured)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from healer.errors import ConfigError, PermanentError


@dataclass(frozen=True)
class Access:
    """How to reach one Prometheus: its URL (checked: :func:`check_url`), the request timeout
    (seconds), extra headers, a bearer token or a token file (read before each query), TLS
    (``verify``; a CA bundle; a client certificate file, or certificate and key files) and
    the source's name for the logs."""

    url: str
    timeout: float
    headers: Mapping[str, str] = field(default_factory=dict)
    bearer_token: str | None = None
    bearer_token_file: str | None = None
    verify: bool = True
    ca_file: str | None = None
    client_cert: str | tuple[str, str] | None = None
    source: str = ""


def check_url(url: str) -> str:
    """``url`` if it can name a Prometheus (http or https, a host, a port 1-65535, no
    whitespace or control characters); else a one-line :class:`ConfigError`."""
    shown = repr(url[:200])
    if not isinstance(url, str) or any(c.isspace() or ord(c) < 32 for c in url):
        raise ConfigError(f"Prometheus URL {shown}: whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ConfigError(f"Prometheus URL {shown}: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"Prometheus URL {shown}: expected http:// or https://")
    if not parts.hostname:
        raise ConfigError(f"Prometheus URL {shown}: no host")
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"Prometheus URL {shown}: port {port} is out of range")
    return url


def read_bearer_token(path: str | Path) -> str:
    """The token in a bearer token file; a one-line :class:`PermanentError` when it cannot be
    read (missing, unreadable, a directory, a FIFO) or holds no usable token."""
    p = Path(path)
    try:
        if not p.is_file():
            raise PermanentError(f"cannot read the bearer token file {p}: "
                                 f"{'not a regular file' if p.exists() else 'no such file'}")
        with p.open("rb") as f:
            raw = f.read(65537)
        token = raw.decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise PermanentError(f"cannot read the bearer token file {p}: {why}") from None
    if not token or len(raw) > 65536 or any(c in token for c in "\r\n\0"):
        raise PermanentError(f"the bearer token file {p} holds no usable token (empty, "
                             "several lines, binary or larger than 64 KiB)")
    return token


def check_file(path: str, what: str) -> str:
    """``path`` if it is a readable regular file; else a one-line :class:`ConfigError`."""
    p = Path(path)
    try:
        if not p.is_file():
            raise ConfigError(f"{what} {path}: "
                              f"{'not a regular file' if p.exists() else 'no such file'}")
        with p.open("rb") as f:
            f.read(1)
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror or e}") from None
    return path
