"""The daemon's Prometheus client (:class:`Http`, made by :func:`connect`): one ``requests``
session (:func:`new_session`, shared with the offline client :mod:`.offline`: TLS, CA bundle,
client certificate or no verification; headers; the bearer token, re-read from its file before
a query: :meth:`Http.refresh_token`), raw bodies read in chunks, orjson, mapped errors. The live
poll queries through it (see :class:`~healer.adapters.prometheus.source.PrometheusSource`); the
backtest's history goes through :mod:`.offline` (prometheus-api-client; ADR 0012).

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
from pathlib import Path
from typing import Any

import orjson
import requests
import structlog
import urllib3

from healer.adapters.prometheus.access import Access, check_file, read_bearer_token
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


def request_error(e: OSError, what: str, url: str, timeout: float) -> HealerError:
    """A failed request (``requests`` raised ``e``) as healer's error: a TLS failure is
    permanent (retrying cannot fix a certificate), a timeout, a lost connection or any other
    request failure transient, a file error of requests' own (a CA bundle that went away)
    permanent."""
    if isinstance(e, requests.exceptions.SSLError):
        return PermanentError(f"{what}: TLS with {url} failed: {root_cause(e)}")
    if isinstance(e, requests.Timeout):
        return TransientError(f"{what}: timed out after {timeout:g}s")
    if isinstance(e, requests.ConnectionError):
        return TransientError(f"{what}: cannot connect to {url}: {root_cause(e)}")
    if isinstance(e, requests.RequestException):
        return TransientError(f"{what}: {e}")
    return PermanentError(f"{what}: {e}")


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


def json_type(content_type: str | None) -> bool:
    """Whether a Content-Type may hold an API answer (absent: assume so)."""
    if not content_type:
        return True
    main = content_type.split(";", 1)[0].strip().lower()
    return main in ("", "application/json", "text/json") or main.endswith("+json")


class Http:
    """GET ``/api/v1/query`` (instant queries); thread-safe request counting."""

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
                    raw = r.raw.read(500, decode_content=True) or b""
                    raise HttpStatus(r.status_code, raw.decode("utf-8", "replace"),
                                     retry_after(r.headers.get("Retry-After")))
                ctype = r.headers.get("Content-Type")
                if not json_type(ctype):
                    raise BadAnswer(f"{what}: {self.url} answered {str(ctype)[:60]!r}, not JSON "
                                    "(a proxy's page?)")
                return self._read(r, what)
        except HttpStatus as e:
            raise map_status(e, what) from None
        except OSError as e:  # requests' errors are OSErrors too
            raise request_error(e, what, self.url, self.timeout) from e

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


def new_session(access: Access, *, announce: bool = True
                ) -> tuple[requests.Session, dict[str, str]]:
    """A ``requests`` session set up for ``access`` (TLS: the CA bundle, the client
    certificate or no verification) and the headers every query carries (the bearer token
    included; a token file is read before each query instead). A missing or unreadable
    ``ca_file`` or ``client_cert`` is a one-line ConfigError now, not at the first query;
    ``verify=False`` (no ``ca_file``) is logged once (``announce``) instead of warned on every
    request."""
    if access.ca_file:
        check_file(access.ca_file, "the CA file")
    cert = access.client_cert
    for f in (cert,) if isinstance(cert, str) else cert or ():
        check_file(f, "the client certificate file")
    session = requests.Session()
    session.verify = access.ca_file if access.ca_file else access.verify
    if not access.verify and not access.ca_file:
        # the operator chose this; one log line instead of a warning on every request
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        if announce:
            log.warning("TLS certificate verification is off", source=access.source,
                        url=access.url)
    if cert is not None:
        session.cert = cert
    headers = dict(access.headers)
    if access.bearer_token:
        headers["Authorization"] = f"Bearer {access.bearer_token}"
    return session, headers


def retry_after(header: str | None) -> float | None:
    """A Retry-After header in seconds (0 to an hour), or None."""
    if not header:
        return None
    try:
        delay = float(header)
    except ValueError:
        return None
    return delay if 0 <= delay <= 3600 else None


def connect(access: Access) -> Http:
    """The daemon's client of the Prometheus ``access`` names (its URL checked by the
    caller); see :func:`new_session`."""
    session, headers = new_session(access)
    return Http(access.url, session, headers, access.timeout,
                token_file=access.bearer_token_file)
