"""Prometheus' HTTP API with one ``requests`` session: raw bodies, orjson, mapped errors.

Errors are mapped to :mod:`healer.errors`: connection problems, timeouts, 5xx, 408 and 429 are
``TransientError``, 401/403 ``ForbiddenError``, 404 ``NotFoundError``, other 4xx
``PermanentError`` (a bad ``promql`` rule, bad credentials); a body that is not JSON (a
proxy's page) or not shaped like an API answer is ``TransientError``.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import orjson
import requests

from healer.errors import (
    ForbiddenError,
    HealerError,
    NotFoundError,
    PermanentError,
    TransientError,
)


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


def decode_result(body: bytes, what: str, url: str) -> list[Any]:
    """An API answer's ``data.result`` list, decoded with orjson (no per-sample objects)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise TransientError(f"{what}: unexpected answer from {url}: {e}") from e
    try:
        result = doc["data"]["result"]
    except (KeyError, TypeError, IndexError) as e:
        raise TransientError(f"{what}: malformed answer from {url}: {e!r}") from e
    if not result:
        return []
    if not isinstance(result, list):
        raise TransientError(f"{what}: malformed answer from {url}: result is "
                             f"{type(result).__name__}")
    return result


class Http:
    """GET ``/api/v1/query`` and ``/api/v1/query_range``; thread-safe request counting."""

    def __init__(self, url: str, session: requests.Session, headers: Mapping[str, str],
                 timeout: float) -> None:
        self.url = url
        self.session = session
        self.headers = dict(headers)
        self.timeout = timeout
        self.requests = 0
        self._lock = threading.Lock()

    def _get(self, path: str, params: Mapping[str, str], what: str) -> bytes:
        with self._lock:
            self.requests += 1
        try:
            # verify and cert explicitly: requests would let REQUESTS_CA_BUNDLE override them
            r = self.session.get(self.url + path, params=params, headers=self.headers,
                                 timeout=self.timeout, verify=self.session.verify,
                                 cert=self.session.cert)
            if r.status_code != 200:
                retry_after: float | None = None
                header = r.headers.get("Retry-After")
                if header:
                    try:
                        retry_after = float(header)
                    except ValueError:
                        retry_after = None
                raise HttpStatus(r.status_code, r.text[:500], retry_after)
            return r.content
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
