"""The :class:`~healer.ports.SlurmDriver` over slurmrestd (Slurm's REST API), with a JWT.

Contract followed (SchedMD's OpenAPI for v0.0.40 .. v0.0.45; ``gpu-slurm-facts.md`` section 5),
checked against the real slurmrestd of Slurm 24.11 (v0.0.40 .. v0.0.42) and 26.05 (v0.0.42 ..
v0.0.45) in ``tests/integration/slurm/test_slurmrestd.py``:

* Version: negotiated once from ``GET /openapi/v3`` (which needs auth too): the first of
  ``versions`` whose ``/slurm/v0.0.XX/`` paths the server lists. A server offering only
  v0.0.36 .. v0.0.39 (Slurm 22.05 / 23.02) is used **read-only**: its v0.0.38 has no node
  update at all (HTTP 405) and v0.0.39 ignores signal flags, so every write raises a
  :class:`~healer.errors.PermanentError` saying Slurm ≥ 23.11 is needed.
* Auth headers ``X-SLURM-USER-NAME`` and ``X-SLURM-USER-TOKEN`` on every request; a 401 makes
  the token provider forget its token and the request is sent once more with a fresh one.
* Reads: ``GET /slurm/V/node/{name}``, ``GET /slurm/V/jobs/`` (filtered here by node). Node
  ``state`` is a string plus ``state_flags`` (v0.0.38) or an array (v0.0.39+); the node's
  ``topology`` string (v0.0.44+, Slurm >= 25.05) is reported as ``SlurmNodeState.topology``
  (empty where the version has no such field).
* Drain / undrain: ``POST /slurm/V/node/{name}`` with ``{"state": ["DRAIN"], "reason": ...}`` /
  ``{"state": ["UNDRAIN"]}`` (UNDRAIN, not RESUME: a DOWN node stays DOWN, as in the scontrol
  driver and Slinky's operator).
* Signals: ``DELETE /slurm/V/job/{id}?signal=USR1&flags=BATCH_JOB`` (or ``FULL_JOB``). A DELETE
  without ``signal`` means SIGKILL (and without ``flags`` FULL_JOB): it cancels the job, so the
  only DELETE this module can send is built by :meth:`SlurmrestdDriver._signal_job`, which
  refuses to run without a signal.
* Requeue: slurmrestd has no requeue operation (``scontrol requeue`` is CLI/RPC only), so
  :meth:`SlurmrestdDriver.requeue_jobs` raises PermanentError.
* A 200 response can still carry failures: its ``errors`` array (``error_number`` in v0.0.40+,
  ``errno`` in v0.0.38) and, for job signals, ``status[].error.code`` are checked.

Errors: connection failures, timeouts, 429 and 5xx without a Slurm error, and Slurm's
communication errnos → TransientError; 401/403/511 and Slurm's authentication errnos →
ForbiddenError (after one resend with a freshly fetched token); an unknown node or job →
NotFoundError; anything else → PermanentError. What the real servers do, seen here:

* a token slurmctld refuses (expired, another key) → HTTP 511 "Network Authentication
  Required" with errno 1007 (24.11, 26.05). slurmrestd 26.05 writes that answer twice (the JSON
  511, then a ``text/plain`` 511 "Protocol authentication error") on one connection, which
  aiohttp's parser refuses ("Data after `Connection: close`"): read as the 511 it is;
* ``GET .../node/{name}`` (slurmctld's single-node query) can go on showing a node MIXED or
  ALLOCATED after its last job ended (24.11, 26.05: the allocation it shows is refreshed only
  by a query of every node; seen here for as long as a client went on polling the one node).
  The stale value can only make a node look busier than it is, never idle while a job holds it; so
  a node that reads busy (and not COMPLETING) is checked against the jobs: none active on it →
  it is reported IDLE. Costs one ``GET .../jobs/`` per state read only while a node looks busy;
* an unknown node on ``GET .../node/{name}`` → HTTP 200, no node, and an error with errno 0
  "No error" ("Failure to query node ..."): a read whose errors all carry errno 0 returns its
  body (the node is then not found); a write with such an error is still a failure;
* slurmrestd 22.05 answers both "slurmctld unreachable" and "JWT rejected by slurmctld" with
  HTTP 500 + errno -1 "Unspecified error" (it passes the token through unverified, and even
  serves ``/openapi/v3`` with a bad one): that is a TransientError, and the token is dropped so
  the next attempt fetches a fresh one.

Transient failures are retried (:data:`healer.adapters.retry.QUICK`: ``attempts`` in all, short
waits); writes are retried only when the request never reached the server (a connect error),
so a signal is not sent twice.
"""

from __future__ import annotations

import inspect
import json as jsonlib
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp

from healer.adapters.calls import timed
from healer.adapters.redirects import refused_redirect
from healer.adapters.retry import QUICK
from healer.adapters.slurm.parse import parse_job_json, parse_node_json
from healer.adapters.slurm.scontrol import normalize_signal
from healer.core.vocabulary import SLURM_REASON_PREFIX
from healer.errors import (
    ForbiddenError,
    NotFoundError,
    PermanentError,
    TransientError,
)
from healer.ports import SlurmJob, SlurmNodeState, Undrain

__all__ = [
    "READ_ONLY_VERSIONS",
    "WRITE_VERSIONS",
    "CallableToken",
    "SlurmrestdDriver",
    "StaticToken",
    "TokenProvider",
]

#: Versions with node updates and job signal flags (Slurm 23.11 .. 26.05), preferred first.
WRITE_VERSIONS = ("v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42", "v0.0.41", "v0.0.40")
#: Versions healer can read but not write through (Slurm 22.05 .. 23.02).
READ_ONLY_VERSIONS = ("v0.0.39", "v0.0.38", "v0.0.37", "v0.0.36")

#: Job states in which a job still occupies (or will occupy) its node.
ACTIVE_JOB_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING",
                               "RESIZING", "REQUEUED", "SIGNALING", "STAGE_OUT"})

_VERSION_PATH = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")

# Slurm errnos (slurm/slurm_errno.h)
_SLURM_PROTOCOL_AUTHENTICATION_ERROR = 1007
_ESLURM_ACCESS_DENIED = 2002
_ESLURM_INVALID_JOB_ID = 2017
_ESLURM_INVALID_NODE_NAME = 2018
_ESLURM_ALREADY_DONE = 2021
_ESLURM_IN_STANDBY_MODE = 2027
_TRANSIENT_ERRNO_RANGES = ((1000, 1099), (1800, 1899), (5000, 5099))
#: base states a single-node read may show from a stale allocation (see the module doc)
_SHOWN_MIXED = frozenset({"MIXED", "ALLOCATED"})
#: what aiohttp's error says when slurmrestd 26.05 sent its 511 twice (see the module doc)
_DOUBLED_511 = "HTTP/1.1 511"


# ---------------------------------------------------------------------------------------------
# Tokens


class TokenProvider(Protocol):
    """Where the JWT comes from. ``invalidate`` is called after a 401 (expired token)."""

    async def token(self) -> str: ...

    def invalidate(self) -> None: ...


class StaticToken:
    """A fixed token (tests, or a token rotated by restarting healer)."""

    def __init__(self, value: str) -> None:
        if not value:
            raise ValueError("empty slurmrestd token")
        self._value = value

    async def token(self) -> str:
        return self._value

    def invalidate(self) -> None:
        """Nothing to refresh."""

    def __repr__(self) -> str:
        return "StaticToken(***)"


class CallableToken:
    """A token from ``fetch()`` (sync or async, e.g. reading a file or a Secret), kept for
    ``ttl`` seconds and fetched again after that or after a 401."""

    def __init__(self, fetch: Callable[[], str | Awaitable[str]], ttl: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:  # a cache's age
        self._fetch = fetch
        self._ttl = ttl
        self._clock = clock
        self._value = ""
        self._at = 0.0

    async def token(self) -> str:
        if self._value and self._clock() - self._at < self._ttl:
            return self._value
        got = self._fetch()
        value = await got if inspect.isawaitable(got) else got
        if not isinstance(value, str) or not value.strip():
            raise PermanentError("the slurmrestd token provider returned no token")
        self._value, self._at = value.strip(), self._clock()
        return self._value

    def invalidate(self) -> None:
        self._value = ""

    def __repr__(self) -> str:
        return f"CallableToken({self._fetch!r}, ttl={self._ttl})"


# ---------------------------------------------------------------------------------------------
# The driver


class _ConnectFailed(TransientError):
    """The request never reached slurmrestd: safe to resend even a write."""


class _ApiVersion:
    def __init__(self, version: str, writable: bool, paths: Sequence[str]) -> None:
        self.version = version
        self.writable = writable
        self.offered: tuple[str, ...] = ()
        base = f"/slurm/{version}"
        have = set(paths)
        self.nodes = f"{base}/nodes/" if f"{base}/nodes/" in have else f"{base}/nodes"
        self.jobs = f"{base}/jobs/" if f"{base}/jobs/" in have else f"{base}/jobs"
        self.node = f"{base}/node/"
        self.job = f"{base}/job/"


class SlurmrestdDriver:
    """SlurmDriver through slurmrestd.

    ``base_url`` like ``http://slurm-restapi:6820``; ``token_provider`` gives the JWT for
    ``user``; ``session`` an aiohttp session to share (None: one is made and closed by
    :meth:`close`); ``versions`` the writable API versions healer may use, preferred first.
    """

    def __init__(self, base_url: str, token_provider: TokenProvider, user: str = "root",
                 session: aiohttp.ClientSession | None = None,
                 versions: Sequence[str] = WRITE_VERSIONS, *, timeout: float = 10.0,
                 attempts: int = 3, read_only_versions: Sequence[str] = READ_ONLY_VERSIONS
                 ) -> None:
        self.base_url = base_url.rstrip("/")
        self.tokens = token_provider
        self.user = user
        self.versions = tuple(versions)
        self.read_only_versions = tuple(read_only_versions)
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self._session = session
        self._own_session = session is None
        self._api: _ApiVersion | None = None

    async def __aenter__(self) -> SlurmrestdDriver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    # -- version ---------------------------------------------------------------------------

    async def version(self) -> str:
        """The API version in use (negotiated on first call)."""
        return (await self._negotiate()).version

    async def writable(self) -> bool:
        return (await self._negotiate()).writable

    async def _negotiate(self) -> _ApiVersion:
        if self._api is not None:
            return self._api
        spec = await self._request("GET", "/openapi/v3")
        raw_paths = spec.get("paths")
        paths = [p for p in raw_paths if isinstance(p, str)] if isinstance(raw_paths, Mapping) \
            else []
        offered = sorted({m.group(1) for p in paths if (m := _VERSION_PATH.match(p))},
                         key=_version_key, reverse=True)
        api: _ApiVersion | None = None
        for v in self.versions:
            if v in offered:
                api = _ApiVersion(v, True, paths)
                break
        else:
            for v in self.read_only_versions:
                if v in offered:
                    api = _ApiVersion(v, False, paths)
                    break
        if api is None:
            raise PermanentError(
                f"slurmrestd at {self.base_url} offers {', '.join(offered) or 'no /slurm/ API'}"
                f"; healer speaks {', '.join(self.versions + self.read_only_versions)}")
        api.offered = tuple(offered)
        self._api = api
        return api

    async def _writable_api(self, what: str) -> _ApiVersion:
        api = await self._negotiate()
        if not api.writable:
            raise PermanentError(
                f"cannot {what} through slurmrestd at {self.base_url}: it offers only "
                f"{', '.join(api.offered)} (Slurm < 23.11), whose REST API has no node update "
                "(drain/undrain) and no flagged job signal; Slurm >= 23.11 (openapi v0.0.40+) "
                "is needed, or use the scontrol driver")
        return api

    # -- reads -----------------------------------------------------------------------------

    async def nodes(self) -> list[SlurmNodeState]:
        api = await self._negotiate()
        body = await self._request("GET", api.nodes)
        return [parse_node_json(n) for n in _objects(body, "nodes")]

    async def jobs(self) -> list[SlurmJob]:
        api = await self._negotiate()
        body = await self._request("GET", api.jobs)
        return [parse_job_json(j) for j in _objects(body, "jobs")]

    async def state(self, node: str, *, host: str = "") -> SlurmNodeState:
        api = await self._negotiate()
        body = await self._request("GET", api.node + _quote(node))
        for obj in _objects(body, "nodes"):
            if obj.get("name") == node:
                st = parse_node_json(obj)
                if st.base in _SHOWN_MIXED and "COMPLETING" not in st.flags and \
                        not await self.jobs_on(node):
                    # a stale allocation (see the module doc): no job holds the node
                    return replace(st, base="IDLE")
                return st
        raise NotFoundError(f"Slurm node {node!r} not found by slurmrestd")

    async def jobs_on(self, node: str) -> list[SlurmJob]:
        return [j for j in await self.jobs() if node in j.nodes and j.state in ACTIVE_JOB_STATES]

    async def recent_jobs_on(self, node: str) -> list[SlurmJob]:
        """Every job slurmctld still lists that ran on ``node``, ended ones (NODE_FAIL) too."""
        return [j for j in await self.jobs() if node in j.nodes]

    # -- writes ----------------------------------------------------------------------------

    async def drain(self, node: str, reason: str, incident: str = "", *,
                    host: str = "") -> bool:
        if not reason.startswith(SLURM_REASON_PREFIX):
            raise PermanentError(f"drain reason must start with {SLURM_REASON_PREFIX!r}: "
                                 f"{reason!r}")
        api = await self._writable_api("drain a node")
        st = await self.state(node)
        if (st.drain or (st.down and st.reason)) and not st.reason_is_ours:
            # someone else's drain, or a DOWN with someone's reason (an admin's, or Slurm's
            # own "Not responding"): keep their reason, do not own it (docs/adr/0016)
            return False
        if st.drain and st.reason == " ".join(reason.split()):
            return True
        await self._request("POST", api.node + _quote(node), write=True,
                            json={"state": ["DRAIN"], "reason": " ".join(reason.split())})
        return True

    async def hold(self, node: str, reason: str) -> None:
        """Drain ``node`` with someone else's ``reason``, word for word (not healer's: healer
        never clears it); nothing if it is drained already."""
        api = await self._writable_api("drain a node")
        st = await self.state(node)
        if st.drain:
            return
        await self._request("POST", api.node + _quote(node), write=True,
                            json={"state": ["DRAIN"], "reason": " ".join(reason.split())})

    async def delete_node(self, node: str) -> bool:
        """Delete ``node``'s record (``DELETE .../node/{name}``, what a slurmd pod's preStop
        does with scontrol); False if there is none."""
        api = await self._writable_api("delete a node record")
        try:
            await self.state(node)
        except NotFoundError:
            return False
        await self._request("DELETE", api.node + _quote(node), write=True)
        return True

    async def undrain(self, node: str, incident: str = "", *,
                      host: str = "") -> Undrain:
        api = await self._writable_api("undrain a node")
        st = await self.state(node)
        if not st.drained_by_healer(incident):
            return Undrain.NOT_OURS
        await self._request("POST", api.node + _quote(node), write=True,
                            json={"state": ["UNDRAIN"]})
        return Undrain.CLEARED

    async def signal_jobs(self, node: str, signal: str, *, batch_only: bool = False) -> list[int]:
        try:
            sig = normalize_signal(signal)
        except ValueError as e:
            raise PermanentError(str(e)) from e
        api = await self._writable_api("signal jobs")
        done: list[int] = []
        for job in await self.jobs_on(node):
            if job.state != "RUNNING":
                continue
            try:
                await self._signal_job(api, job.id, sig, "BATCH_JOB" if batch_only else "FULL_JOB")
            except NotFoundError:
                continue  # the job ended between the listing and the signal
            done.append(job.id)
        return done

    async def requeue_jobs(self, node: str) -> list[int]:
        raise PermanentError(
            "slurmrestd has no job requeue operation (only `scontrol requeue` does that); "
            "use the scontrol driver for requeue")

    async def _signal_job(self, api: _ApiVersion, job_id: int, sig: str, flags: str) -> None:
        """The only DELETE this driver sends. slurmrestd treats a DELETE without ``signal`` as
        SIGKILL (cancel the job), so an empty signal is refused here."""
        if not sig or not flags:
            raise PermanentError("refusing to DELETE a job without a signal and flags "
                                 "(slurmrestd would cancel it)")
        body = await self._request("DELETE", f"{api.job}{job_id}", write=True,
                                   params={"signal": sig, "flags": flags})
        for status in _objects(body, "status"):
            err = status.get("error")
            if isinstance(err, Mapping) and err.get("code") not in (None, 0):
                code = err.get("code")
                _raise_errno(code if isinstance(code, int) else -1,
                             f"signal {sig} to job {job_id}: "
                             f"{err.get('message') or err.get('string') or code}")

    # -- HTTP ------------------------------------------------------------------------------

    async def _request(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                       json: Any = None, write: bool = False) -> dict[str, Any]:
        """Send with retries: reads on any TransientError, writes only on connect errors."""
        def retryable(e: BaseException) -> bool:
            return isinstance(e, _ConnectFailed) or not write

        # operation: the method and the endpoint's kind (``GET nodes``), never a name
        op = f"{method} {_endpoint(path)}"

        async def once() -> dict[str, Any]:
            with timed("slurmrestd", op):
                return await self._send(method, path, params=params, json=json)

        return await QUICK.but(attempts=self.attempts).run(op, once, retry_if=retryable)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def _send(self, method: str, path: str, *, params: Mapping[str, str] | None,
                    json: Any) -> dict[str, Any]:
        url = self.base_url + path
        where = f"{method} {path}"
        for fresh in (False, True):
            headers = {"X-SLURM-USER-TOKEN": await self.tokens.token(),
                       "Accept": "application/json"}
            if self.user:  # without it, Slurm >= 23.02 takes the user from the token
                headers["X-SLURM-USER-NAME"] = self.user
            try:
                async with self._http().request(
                        method, url, params=params, json=json, headers=headers,
                        timeout=aiohttp.ClientTimeout(total=self.timeout),
                        allow_redirects=False) as resp:  # the token never follows one
                    status = resp.status
                    if 300 <= status < 400:
                        raise PermanentError(refused_redirect(f"slurmrestd {where}", url,
                                                              status, resp.headers))
                    text = await resp.text()
            except aiohttp.ClientConnectorError as e:
                raise _ConnectFailed(f"{where}: cannot connect to slurmrestd: {e}") from e
            except aiohttp.ClientResponseError as e:
                if _DOUBLED_511 not in str(e.message):
                    raise TransientError(f"{where}: {type(e).__name__}: {e}") from e
                status, text = 511, "(slurmrestd sent its HTTP 511 twice) " + str(e.message)
            except (aiohttp.ClientError, TimeoutError) as e:
                raise TransientError(f"{where}: {type(e).__name__}: {e}") from e
            suspect = _auth_suspect(status, text)
            if suspect == "rejected" and not fresh:
                self.tokens.invalidate()  # expired or rotated: send once more with a new one
                continue
            if suspect == "maybe":
                self.tokens.invalidate()  # the next attempt (if any) fetches a fresh token
            return _check(where, status, text, read=method == "GET")
        raise AssertionError("unreachable")


def _endpoint(path: str) -> str:
    """``/slurm/v0.0.40/node/gpu-2`` → ``node``: the resource after the version, no name."""
    parts = [p for p in path.split("/") if p]
    for i, p in enumerate(parts[:-1]):
        if re.fullmatch(r"v\d+\.\d+\.\d+", p):
            return parts[i + 1]
    return parts[-1] if parts else "/"


def _decode(text: str) -> dict[str, Any]:
    try:
        decoded = jsonlib.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return decoded if isinstance(decoded, dict) else {}


def _errnos(body: Mapping[str, Any]) -> list[int]:
    out: list[int] = []
    for e in body.get("errors") or ():
        if isinstance(e, Mapping):
            num = e.get("error_number", e.get("errno"))
            out.append(num if isinstance(num, int) and not isinstance(num, bool) else -1)
    return out


def _auth_suspect(status: int, text: str) -> str:
    """``"rejected"``: the token was refused (401, or slurmctld's authentication errnos);
    ``"maybe"``: HTTP 500 with errno -1 "Unspecified error", which is how slurmrestd 22.05
    reports both a JWT that slurmctld rejected *and* an unreachable slurmctld; ``""``: no."""
    if status in (401, 511):
        return "rejected"
    if status < 400 and '"err' not in text:
        return ""
    nums = _errnos(_decode(text))
    if any(n == _SLURM_PROTOCOL_AUTHENTICATION_ERROR or 6000 <= n <= 6099 for n in nums):
        return "rejected"
    if status >= 500 and nums and all(n == -1 for n in nums):
        return "maybe"
    return ""


def _check(where: str, status: int, text: str, *, read: bool = False) -> dict[str, Any]:
    """Decode a slurmrestd response and raise healer's error for a failure (``read``: errors
    that all carry errno 0 "No error" leave the body to the caller, see the module doc)."""
    body = _decode(text)
    errors = [e for e in body.get("errors") or () if isinstance(e, Mapping)]
    snippet = " ".join(text.split())[:300]
    if status in (401, 511):
        raise ForbiddenError(f"{where}: {status} from slurmrestd (token rejected or expired, "
                             f"or X-SLURM-USER-NAME missing): {snippet}")
    if read and status < 400 and errors and all(n == 0 for n in _errnos(body)):
        return body
    if status == 403:
        raise ForbiddenError(f"{where}: 403 from slurmrestd: {snippet}")
    if errors:
        first = errors[0]
        num = _errnos(body)[0]
        msg = first.get("description") or first.get("error") or str(num)
        if num == -1 and status >= 500:
            raise TransientError(f"{where}: HTTP {status}: {msg} (slurmrestd 22.05 says this "
                                 "when slurmctld is unreachable or rejected the JWT)")
        _raise_errno(num, f"{where}: HTTP {status}: {msg}")
    if status == 404:
        raise NotFoundError(f"{where}: 404 from slurmrestd: {snippet}")
    if status == 405:
        raise PermanentError(f"{where}: 405 from slurmrestd (this API version does not offer "
                             f"that method): {snippet}")
    if status == 429 or status >= 500:
        raise TransientError(f"{where}: HTTP {status} from slurmrestd: {snippet}")
    if status >= 400:
        raise PermanentError(f"{where}: HTTP {status} from slurmrestd: {snippet}")
    if not body and text.strip():
        raise TransientError(f"{where}: slurmrestd answered {status} with non-JSON: {snippet}")
    return body


def _raise_errno(num: int, message: str) -> None:
    if num == _SLURM_PROTOCOL_AUTHENTICATION_ERROR or 6000 <= num <= 6099:
        raise ForbiddenError(f"{message} (the JWT was rejected)")
    if num in (_ESLURM_INVALID_NODE_NAME, _ESLURM_INVALID_JOB_ID, _ESLURM_ALREADY_DONE):
        raise NotFoundError(message)
    if num == _ESLURM_ACCESS_DENIED:
        raise ForbiddenError(message)
    if num == _ESLURM_IN_STANDBY_MODE or any(lo <= num <= hi for lo, hi in _TRANSIENT_ERRNO_RANGES):
        raise TransientError(message)
    if "unable to contact slurm controller" in message.lower():
        raise TransientError(message)
    raise PermanentError(message)


def _objects(body: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = body.get(key)
    if not isinstance(items, list):
        return []
    return [x for x in items if isinstance(x, Mapping)]


def _quote(name: str) -> str:
    if not name:
        raise PermanentError("empty Slurm node name")
    return quote(name, safe="")


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.lstrip("v").split("."))
