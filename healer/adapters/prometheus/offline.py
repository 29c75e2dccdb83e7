"""The offline tools' Prometheus client (:class:`OfflineClient`): the range and instant queries
of ``healer backtest``'s history go through prometheus-api-client's ``PrometheusConnect``
(ADR 0012), over a session set up like the daemon's (:func:`.http.new_session`: TLS, headers,
the bearer token file re-read before each query), with the answers bounded and the errors mapped
to :mod:`healer.errors` as the daemon's client maps them (:mod:`.http`).

What the library does not check is checked on the session, before the library reads a byte of
the body (a response hook): a status other than 200 is mapped like the daemon's (408, 429 and
5xx ``TransientError`` with the server's Retry-After, 401/403 ``ForbiddenError``, 404
``NotFoundError``, other 4xx ``PermanentError``); a content type that is not JSON, and a body
larger than ``max_body`` (counted while it is read, never read whole first), are a
:class:`~.http.BadAnswer`. A body the library cannot decode (not JSON, truncated, nested too
deep) or whose ``data.result`` is missing or not a list is a ``BadAnswer`` too. A bare
``NaN``/``Infinity`` decodes to a non-finite number, dropped with its sample (:mod:`.sanity`).
The library's own retries are off: a query is retried by its caller's policy
(:mod:`healer.adapters.retry`), as every other call healer makes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from healer.adapters.prometheus.access import Access, read_bearer_token
from healer.adapters.prometheus.http import (
    MAX_BODY,
    BadAnswer,
    HttpStatus,
    json_type,
    map_status,
    new_session,
    request_error,
    retry_after,
)
from healer.errors import TransientError

#: No retry inside the library (urllib3's): retries are the caller's (healer's one policy).
NO_RETRY = Retry(total=0, read=False, redirect=False, status=0,
                 respect_retry_after_header=False, raise_on_status=False)


class _Bounded:
    """A response body read through a counter: past ``limit`` bytes, a :class:`BadAnswer`.
    ``requests`` reads a body through ``stream`` (and translates urllib3's errors itself)."""

    def __init__(self, raw: Any, limit: int, too_large: str) -> None:
        self._raw = raw
        self._limit = limit
        self._too_large = too_large
        self._size = 0

    def stream(self, amt: int | None = None, decode_content: bool | None = None
               ) -> Iterator[bytes]:
        for chunk in self._raw.stream(amt, decode_content=decode_content):
            self._size += len(chunk)
            if self._size > self._limit:
                raise BadAnswer(self._too_large)
            yield chunk

    def close(self) -> None:
        self._raw.close()

    def release_conn(self) -> None:
        self._raw.release_conn()


class OfflineClient:
    """``query`` and ``query_range`` through ``PrometheusConnect``; each returns the answer's
    ``data.result`` list or raises a :mod:`healer.errors` error (see the module). Blocking:
    the caller runs it in a thread (one query at a time per client); :meth:`close` it.
    ``announce`` logs that TLS verification is off (a source that made one already did)."""

    def __init__(self, access: Access, max_body: int = MAX_BODY, *,
                 announce: bool = True) -> None:
        self.url = access.url
        self.timeout = access.timeout
        self.max_body = max_body
        self.token_file = Path(access.bearer_token_file) if access.bearer_token_file else None
        session, self.headers = new_session(access, announce=announce)
        session.hooks["response"].append(self._check)
        self._local = threading.local()  # what the query in this thread is (for messages)
        self._prom = PrometheusConnect(url=self.url, headers=self.headers, session=session,
                                       retry=NO_RETRY, timeout=self.timeout)  # type: ignore[arg-type]

    def close(self) -> None:
        self._prom.close()

    def _check(self, r: requests.Response, *args: Any, **kwargs: Any) -> requests.Response:
        """The response hook: refuse a failed or foreign answer before its body is read,
        and bound the body (see the module). Redirects are followed as they come."""
        if r.is_redirect:
            return r
        what = str(getattr(self._local, "what", ""))
        if r.status_code != 200:
            try:
                raw = r.raw.read(500, decode_content=True) or b""
            finally:
                r.close()
            raise HttpStatus(r.status_code, raw.decode("utf-8", "replace"),
                             retry_after(r.headers.get("Retry-After")))
        ctype = r.headers.get("Content-Type")
        if not json_type(ctype):
            r.close()
            raise BadAnswer(f"{what}: {self.url} answered {str(ctype)[:60]!r}, not JSON "
                            "(a proxy's page?)")
        r.raw = _Bounded(r.raw, self.max_body, f"{what}: the answer from {self.url} is larger "
                                               f"than {self.max_body >> 20} MiB")
        return r

    def _headers(self) -> None:
        """Re-read the bearer token file (it may be rotated); a one-line PermanentError
        when it cannot be read."""
        if self.token_file is not None:
            token = read_bearer_token(self.token_file)
            self.headers["Authorization"] = f"Bearer {token}"
            self._prom.headers = dict(self.headers)

    def _call(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> list[Any]:
        self._headers()
        self._local.what = what
        try:
            result = fn(**kwargs)
        except HttpStatus as e:
            raise map_status(e, what) from None
        except requests.exceptions.JSONDecodeError as e:  # before OSError: it is one too
            raise BadAnswer(f"{what}: unexpected answer from {self.url} (not JSON: {e})"
                            ) from None
        except (KeyError, TypeError, RecursionError) as e:
            raise BadAnswer(f"{what}: malformed answer from {self.url}: "
                            f"{type(e).__name__} {str(e)[:80]}") from None
        except PrometheusApiClientException as e:  # the hook saw every non-200 first
            raise TransientError(f"{what}: {str(e)[:300]}") from None
        except OSError as e:  # requests' errors
            raise request_error(e, what, self.url, self.timeout) from e
        if not isinstance(result, list):
            raise BadAnswer(f"{what}: malformed answer from {self.url}: result is "
                            f"{type(result).__name__}, not a list")
        return result

    def query(self, expr: str, at: float, what: str) -> list[Any]:
        """An instant query evaluated at ``at`` (a range selector gives raw samples)."""
        return self._call(what, self._prom.custom_query, query=expr,
                          params={"time": f"{at:.3f}"})

    def query_range(self, expr: str, start: float, end: float, step: float, what: str
                    ) -> list[Any]:
        """A range query over ``[start, end]`` (whole seconds) every ``step`` seconds."""
        return self._call(what, self._prom.custom_query_range, query=expr,
                          start_time=datetime.fromtimestamp(start, UTC),
                          end_time=datetime.fromtimestamp(end, UTC), step=f"{step:g}")
