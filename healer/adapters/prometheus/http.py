"""The one Prometheus client (:class:`Http`, made by :func:`connect`): one ``requests``
session (TLS: CA bundle, client certificate or no verification; headers; the bearer token,
re-read from its file before a query: :meth:`Http.refresh_token`), raw bodies, orjson, mapped
errors. The live poll and the backtest's history both query through it (see
:class:`~healer.adapters.prometheus.source.PrometheusSource`).

Errors are mapped to :mod:`healer.errors`: connection problems, timeouts, 5xx, 408 and 429 are
``TransientError``, 401/403 ``ForbiddenError``, 404 ``NotFoundError``, other 4xx
``PermanentError`` (a bad ``promql`` rule, bad credentials); a body that is not an API
answer is :class:`BadAnswer` (a ``TransientError``): not JSON (a proxy's HTML page, a
truncated body), a content type that is not JSON, larger than ``max_body`` bytes (read in
chunks, never whole), nested deeper than JSON decoders allow, ``status`` other than
``success``, ``data.result`` not a list. Bare ``NaN``/``Infinity`` tokens (not JSON, but
some proxies write them) are read as the strings Prometheus would have sent, so that only
their samples are dropped (:mod:`.sanity`), not the whole answer.
"""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import requests
import structlog
import urllib3

from healer.adapters.prometheus.access import check_file, read_bearer_token
from healer.errors import (
    ForbiddenError,
    HealerError,
    NotFoundError,
    PermanentError,
    TransientError,
)

log = structlog.get_logger("healer.adapters.prometheus")

#: The largest answer body read (bytes); a larger one is a :class:`BadAnswer`.
MAX_BODY = 512 * 1024 * 1024


class BadAnswer(TransientError):
    """Prometheus (or whatever answered in its place) sent something that is not an API
    answer: the whole answer is unusable (counted as ``bad-answer``)."""


class HttpStatus(Exception):
    def __init__(self, status: int, body: str, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body
        self.retry_after = retry_after


def root_cause(e: BaseException) -> str:
    seen: set[int] = set()
    cur: BaseException | None = e
    last = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        last = cur
        cur = cur.__cause__ or cur.__context__
    text = str(last)
    return text if len(text) < 300 else text[:300] + "..."


def map_status(e: HttpStatus, what: str) -> HealerError:
    message = f"{what}: HTTP {e.status}: {e.body.strip()[:300]}"
    if e.status in (408, 429) or e.status >= 500:
        return TransientError(message, delay=e.retry_after)
    if e.status in (401, 403):
        return ForbiddenError(message)
    if e.status == 404:
        return NotFoundError(message)
    return PermanentError(message)


_gc_lock = threading.Lock()
_gc_depth = 0
_gc_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while decoding and parsing a poll.

    Decoded JSON has no reference cycles, but its millions of fresh containers trigger
    collections that scan all of them (a poll's cost grew super-linearly with the fleet).
    Re-entrant and thread-safe (a poll decodes its answers in several threads): the
    collector is enabled again, if it was, when the last user leaves.
    """
    global _gc_depth, _gc_was_enabled
    with _gc_lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_was_enabled:
                gc.enable()


def _lenient(body: bytes) -> Any:
    """JSON with bare ``NaN``/``Infinity``/``-Infinity`` read as strings (orjson refuses
    them); raises ValueError or RecursionError like any decoder."""
    return json.loads(body, parse_constant=lambda c: {"NaN": "NaN", "Infinity": "+Inf",
                                                      "-Infinity": "-Inf"}.get(c, c))


def decode_result(body: bytes, what: str, url: str) -> list[Any]:
    """An API answer's ``data.result`` list, decoded with orjson (no per-sample objects);
    :class:`BadAnswer` if the body is not one (see the module)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        try:
            doc = _lenient(body)
        except (ValueError, RecursionError, UnicodeDecodeError):
            head = body[:80].decode("utf-8", "replace").strip().replace("\n", " ")
            raise BadAnswer(f"{what}: unexpected answer from {url} (not JSON: {e}; it "
                            f"begins {head!r})") from None
    if not isinstance(doc, dict):
        raise BadAnswer(f"{what}: malformed answer from {url}: a JSON "
                        f"{type(doc).__name__}, not an object")
    status = doc.get("status")
    if status is not None and status != "success":
        raise BadAnswer(f"{what}: answer from {url} has status {str(status)[:40]!r}: "
                        f"{str(doc.get('error', ''))[:200]}")
    data = doc.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    if result is None:
        raise BadAnswer(f"{what}: malformed answer from {url}: no data.result")
    if not isinstance(result, list):
        raise BadAnswer(f"{what}: malformed answer from {url}: result is "
                        f"{type(result).__name__}, not a list")
    return result


def _json_type(content_type: str | None) -> bool:
    """Whether a Content-Type may hold an API answer (absent: assume so)."""
    if not content_type:
        return True
    main = content_type.split(";", 1)[0].strip().lower()
    return main in ("", "application/json", "text/json") or main.endswith("+json")


class Http:
    """GET ``/api/v1/query`` and ``/api/v1/query_range``; thread-safe request counting."""

    def __init__(self, url: str, session: requests.Session, headers: Mapping[str, str],
                 timeout: float, max_body: int = MAX_BODY,
                 token_file: str | Path | None = None) -> None:
        self.url = url
        self.session = session
        self.headers = dict(headers)
        self.timeout = timeout
        self.max_body = max_body
        self.token_file = Path(token_file) if token_file else None
        self.requests = 0
        self._lock = threading.Lock()

    def refresh_token(self) -> None:
        """Re-read the bearer token file (it may be rotated); called before every query.
        A one-line :class:`PermanentError` when it cannot be read."""
        if self.token_file is None:
            return
        token = read_bearer_token(self.token_file)
        self.headers = {**self.headers, "Authorization": f"Bearer {token}"}

    def close(self) -> None:
        self.session.close()

    def _get(self, path: str, params: Mapping[str, str], what: str) -> bytes:
        with self._lock:
            self.requests += 1
        try:
            # verify and cert explicitly: requests would let REQUESTS_CA_BUNDLE override them
            with self.session.get(self.url + path, params=params, headers=self.headers,
                                  timeout=self.timeout, verify=self.session.verify,
                                  cert=self.session.cert, stream=True) as r:
                if r.status_code != 200:
                    retry_after: float | None = None
                    header = r.headers.get("Retry-After")
                    if header:
                        try:
                            retry_after = float(header)
                        except ValueError:
                            retry_after = None
                        if retry_after is not None and not 0 <= retry_after <= 3600:
                            retry_after = None
                    raw = r.raw.read(500, decode_content=True) or b""
                    raise HttpStatus(r.status_code, raw.decode("utf-8", "replace"),
                                     retry_after)
                ctype = r.headers.get("Content-Type")
                if not _json_type(ctype):
                    raise BadAnswer(f"{what}: {self.url} answered {str(ctype)[:60]!r}, not JSON "
                                    "(a proxy's page?)")
                return self._read(r, what)
        except HttpStatus as e:
            raise map_status(e, what) from None
        except requests.exceptions.SSLError as e:  # retrying cannot fix a certificate
            raise PermanentError(f"{what}: TLS with {self.url} failed: {root_cause(e)}") from e
        except requests.Timeout as e:
            raise TransientError(f"{what}: timed out after {self.timeout:g}s") from e
        except requests.ConnectionError as e:
            raise TransientError(f"{what}: cannot connect to {self.url}: "
                                 f"{root_cause(e)}") from e
        except requests.RequestException as e:
            raise TransientError(f"{what}: {e}") from e
        except OSError as e:  # requests' own file errors (a CA bundle that went away)
            raise PermanentError(f"{what}: {e}") from e

    def _read(self, r: requests.Response, what: str) -> bytes:
        """The body, in chunks, refusing more than ``max_body`` bytes."""
        parts: list[bytes] = []
        size = 0
        for chunk in r.iter_content(chunk_size=1 << 20):
            size += len(chunk)
            if size > self.max_body:
                raise BadAnswer(f"{what}: the answer from {self.url} is larger than "
                                f"{self.max_body >> 20} MiB")
            parts.append(chunk)
        return b"".join(parts)

    def query(self, expr: str, at: float, what: str) -> list[Any]:
        body = self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"}, what)
        with gc_paused():
            return decode_result(body, what, self.url)

    def query_range(self, expr: str, start: float, end: float, step: float,
                    what: str) -> list[Any]:
        # whole seconds, as prometheus-api-client sent them (backtests stay comparable)
        params = {"query": expr, "start": str(round(datetime.fromtimestamp(start, UTC)
                                                    .timestamp())),
                  "end": str(round(datetime.fromtimestamp(end, UTC).timestamp())),
                  "step": f"{step:g}"}
        body = self._get("/api/v1/query_range", params, what)
        return decode_result(body, what, self.url)


def connect(url: str, *, timeout: float, headers: Mapping[str, str] | None = None,
            bearer_token: str | None = None, bearer_token_file: str | None = None,
            verify: bool = True, ca_file: str | None = None,
            client_cert: str | tuple[str, str] | None = None, source: str = "") -> Http:
    """The client of the Prometheus at ``url`` (checked by the caller). A missing or
    unreadable ``ca_file`` or ``client_cert`` is a one-line ConfigError now, not at the first
    query; ``verify=False`` (no ``ca_file``) is logged once instead of warned on every request.
    ``bearer_token_file`` is read before each query (:meth:`Http.refresh_token`)."""
    if ca_file:
        check_file(ca_file, "the CA file")
    for cert in (client_cert,) if isinstance(client_cert, str) else client_cert or ():
        check_file(cert, "the client certificate file")
    session = requests.Session()
    session.verify = ca_file if ca_file else verify
    if not verify and not ca_file:
        # the operator chose this; one log line instead of a warning on every request
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        log.warning("TLS certificate verification is off", source=source, url=url)
    if client_cert is not None:
        session.cert = client_cert
    hdrs = dict(headers or {})
    if bearer_token:
        hdrs["Authorization"] = f"Bearer {bearer_token}"
    return Http(url, session, hdrs, timeout, token_file=bearer_token_file)
