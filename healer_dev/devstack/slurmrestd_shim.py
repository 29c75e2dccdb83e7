"""A slurmrestd v0.0.44 PROTOCOL SHIM over the real local Slurm 22.05 — not slurmrestd.

Why it exists: the local stack runs Debian's Slurm 22.05, whose slurmrestd serves only
``openapi/v0.0.36``..``v0.0.38``: no node update at all (HTTP 405 for ``POST .../node/...``), no
flagged job signal, and none of the v0.0.44 paths SchedMD's slurm-operator (its Go
``slurm-client``, ``api/v0044``) and healer's slurmrestd driver talk. This shim is a protocol
adapter with no state of its own: it answers the v0.0.44 requests those two clients send by
running the real Slurm clients (``scontrol``, ``scancel``; argv, never a shell, each with a
timeout) against the real slurmctld named by ``slurm_env``. Field names and types follow the
Go types of ``github.com/SlinkyProject/slurm-client/api/v0044`` (``slurm.gen.go``), named in
comments below; the client decodes answers with ``encoding/json``, so a wrong type would break
it and a missing optional field reads as nil.

Authentication (slurmrestd with ``auth/jwt``): every request, ``/openapi/v3`` included, needs
``X-SLURM-USER-TOKEN``: an HS256 JWT signed with the configured key, not expired (``exp``
required, ``nbf``/``iat`` honoured), with a ``sun`` claim (the Slurm user name). The operator
sends only that header (token minted by ``slurmjwt.NewToken``: ``sun: slurm``,
``iss: slurm-operator``); healer also sends ``X-SLURM-USER-NAME``, which must equal ``sun``
unless ``sun`` is ``slurm`` or ``root`` (the users auth/jwt lets impersonate). Anything else
(no token, other key, expired, ``alg: none``, another algorithm) → HTTP 401 with a v0.0.44
error body (``error_number`` 6000, ESLURM_AUTH_CRED_INVALID).

Endpoints (``V`` = ``/slurm/v0.0.44``):

* ``GET /openapi/v3`` → a minimal OpenAPI document listing the v0.0.44 paths (healer's driver
  negotiates the version from it).
* ``GET V/nodes/`` and ``GET V/node/{name}`` → ``scontrol show node -o [name]`` mapped to
  ``V0044OpenapiNodesResp`` (``nodes``, ``last_update``). Each node is a ``V0044Node``: ``name``,
  ``state`` (array: the base state, then the flags in scontrol's order, e.g. ``["IDLE",
  "DRAIN"]``, ``["IDLE", "DYNAMIC_NORM"]``, spelled as ``V0044NodeState``), ``reason``,
  ``reason_set_by_user``, ``reason_changed_at``, ``comment``, ``extra``, ``address``,
  ``hostname``, ``port``, ``version``, ``architecture``, ``operating_system``, ``cpus``,
  ``effective_cpus``, ``alloc_cpus``, ``cpu_load``, ``sockets``, ``cores``, ``threads``,
  ``boards``, ``real_memory``, ``alloc_memory``, ``free_mem``, ``temporary_disk``, ``weight``,
  ``gres``, ``gres_used``, ``features``, ``active_features``, ``partitions``, ``owner``,
  ``mcs_label``, ``tres``, ``tres_used``, ``boot_time``, ``slurmd_start_time``, ``last_busy``.
  Query parameters (``update_time``, ``flags``) are accepted and ignored: the answer is always
  the full, current list. An unknown node → HTTP 500, ``error_number`` 2018.
* ``POST V/node/{name}`` with a ``V0044UpdateNodeMsg`` → one ``scontrol update nodename={name}
  ...``: ``state: [S]`` → ``state=s`` for S in DRAIN, UNDRAIN, RESUME, IDLE, DOWN (DRAIN and DOWN
  need ``reason``, as in Slurm); ``reason`` → ``reason=...`` (alone too); ``topology_str``
  (Slurm 25.05; 22.05 has no per-node topology) is kept by the shim per node name and served
  back as the node's ``topology``; ``comment`` →
  ``comment=...`` (alone too; ``""`` clears it). IDLE maps to ``state=idle``: Slurm 22.05's
  ``scontrol update`` accepts it exactly as slurmctld does for slurmrestd (slurmctld clears DRAIN
  and FAIL and marks the node NOT_RESPONDING until its next ping; on a node with jobs it answers
  "Invalid node state specified", relayed as HTTP 500, ``error_number`` 2028). Other fields
  (``features``, ``gres``, ``weight``, ``address``, ...) or several states →
  HTTP 400 naming them: Slurm 22.05 cannot carry them faithfully, so they are never dropped
  silently. Each update carried out is recorded in :attr:`SlurmrestdShim.writes`.
* ``GET V/jobs/`` → ``scontrol show job -o`` mapped to ``V0044OpenapiJobInfoResp``; each job a
  ``V0044JobInfo``: ``job_id``, ``name``, ``job_state`` (array), ``state_reason``, ``nodes``,
  ``partition``, ``user_id``, ``user_name``, ``group_id``, ``group_name``, ``batch_flag``,
  ``requeue``, ``comment``, ``node_count``/``cpus`` (``V0044Uint32NoValStruct``),
  ``time_limit`` (``V0044Uint32NoValStruct``, minutes; UNLIMITED → ``infinite``),
  ``submit_time``/``start_time``/``end_time`` (``V0044Uint64NoValStruct``, Unix seconds; unknown
  → ``set: false``). The operator's ``GetNodeDeadlines`` reads ``job_state``, ``nodes``,
  ``start_time`` and ``time_limit``.
* ``DELETE V/node/{name}`` → ``scontrol delete nodename={name}`` (a dynamic node's record;
  Slurm refuses while jobs run there), recorded in :attr:`SlurmrestdShim.deleted`.
* ``DELETE V/job/{id}?signal=SIG&flags=BATCH_JOB|FULL_JOB`` → ``scancel --signal=SIG
  --batch|--full ID`` (``V0044OpenapiKillJobResp``). Without ``signal`` slurmrestd sends SIGKILL,
  i.e. cancels the job: the shim does that too and records it in :attr:`SlurmrestdShim.kills`.
* slurmctld unreachable → HTTP 500, ``error_number`` 1001 (communication error, transient).

What it does not do: no other endpoint (partitions, ping, reconfigure, job submit/update,
accounting) → HTTP 405; no TLS; no ``auth/local`` or unix socket; no
``update_time`` filtering; no per-user authorisation (every valid token acts as the user
running the shim's scontrol, normally root); features and resume_after updates
(not available, or not mappable, in Slurm 22.05).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import re
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jwt
from aiohttp import web
from aiohttp.http_parser import HttpRequestParserPy
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from healer.adapters.slurm.parse import parse_kv_line, parse_state, scontrol_error_kind

__all__ = ["VERSION", "ShimPortInUse", "Shimmed", "SlurmrestdShim"]

VERSION = "v0.0.44"
RELEASE = "25.11.0 (shim over Slurm 22.05 through scontrol)"
DEFAULT_PORT = 6820  # slurm-operator with DEBUG=1 always calls http://localhost:6820

# Slurm errnos (slurm/slurm_errno.h)
GENERIC_ERROR = 1
COMMUNICATIONS_ERROR = 1001
INVALID_JOB_ID = 2017
INVALID_NODE_NAME = 2018
INVALID_NODE_STATE = 2028
AUTH_CRED_INVALID = 6000
PARSE_ERROR = 9001

#: V0044UpdateNodeMsgState values this shim maps to ``scontrol update state=...``
UPDATE_STATES = ("DRAIN", "UNDRAIN", "RESUME", "IDLE", "DOWN")
#: V0044UpdateNodeMsg fields this shim carries out
UPDATE_FIELDS = frozenset({"state", "reason", "comment", "topology_str"})
#: users auth/jwt lets act for another X-SLURM-USER-NAME (SlurmUser and root)
IMPERSONATORS = frozenset({"slurm", "root"})
SCONTROL_TIMEOUT = 20.0


class ShimPortInUse(RuntimeError):
    """The shim's port is taken."""


@dataclass
class Shimmed:
    """One request the shim received."""
    method: str
    path: str
    query: dict[str, str]
    body: Any
    user: str = ""  # the token's ``sun`` ("" when authentication failed)


class SlurmrestdShim:
    """Serve slurmrestd's v0.0.44 protocol over a real Slurm 22.05 (see the module docstring).

    Records: :attr:`requests` (every request), :attr:`writes` ((node, state, reason) of every
    node update carried out; state ``""`` for a reason/comment-only update), :attr:`comments`
    ((node, comment)), :attr:`signals` ((job, signal, flags)), :attr:`kills` (jobs a DELETE
    without ``signal`` cancelled).
    """

    def __init__(self, slurm_env: Mapping[str, str], *, jwt_key: bytes,
                 host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 timeout: float = SCONTROL_TIMEOUT) -> None:
        if not jwt_key:
            raise ValueError("jwt_key must not be empty")
        self.env = dict(slurm_env)
        self.jwt_key = bytes(jwt_key)
        self.host = host
        self.port = port
        self.timeout = timeout
        self.url = ""
        self.requests: deque[Shimmed] = deque(maxlen=20000)
        #: (user, method, path) → how many requests (safe to read from another thread)
        self.calls: Counter[tuple[str, str, str]] = Counter()
        self.writes: list[tuple[str, str, str]] = []
        #: node records deleted (``DELETE V/node/{name}``)
        self.deleted: list[str] = []
        #: (time, user, node, state, reason) of every state/reason update: who wrote what when
        self.write_log: list[tuple[float, str, str, str, str]] = []
        self.comments: list[tuple[str, str]] = []
        #: Slurm node → the ``topology_str`` last sent (Slurm 22.05 has no topology/tree
        #: blocks per node: the shim keeps what the operator pushes and serves it back)
        self.topology: dict[str, str] = {}
        self.signals: list[tuple[int, str, str]] = []
        self.kills: list[int] = []
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> SlurmrestdShim:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> str:
        """Listen on ``host:port``; the base URL. :class:`ShimPortInUse` if the port is taken."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        try:
            self._runner = _LaxAppRunner(app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, self.host, self.port).start()
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ShimPortInUse(
                    f"slurmrestd shim: port {self.port} on {self.host} is already in use "
                    f"(another slurmrestd or shim?). Stop whatever listens there (e.g. "
                    f"`ss -ltnp 'sport = :{self.port}'`) or pass another port.") from e
            raise
        bound = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{bound}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def updates_of(self, node: str) -> list[tuple[str, str]]:
        """(state, reason) of every update carried out on ``node``."""
        return [(state, reason) for n, state, reason in self.writes if n == node]

    # -- Slurm -----------------------------------------------------------------------------

    async def _slurm(self, *argv: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=self.env)
        try:
            async with asyncio.timeout(self.timeout):
                out, err = await proc.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return -1, "", f"{argv[0]}: timed out after {self.timeout} s (slurm_receive_msg)"
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        return (proc.returncode if proc.returncode is not None else -1,
                out.decode(errors="replace"), err.decode(errors="replace"))

    # -- HTTP ------------------------------------------------------------------------------

    def _resp(self, code: int = 200, errors: Sequence[Mapping[str, Any]] = (),
              **extra: Any) -> web.Response:
        # V0044OpenapiResp: meta (V0044OpenapiMeta), errors, warnings
        body = {"meta": {"plugin": {"type": "openapi/slurmctld",
                                    "name": "Slurm OpenAPI slurmctld",
                                    "data_parser": f"data_parser/{VERSION}"},
                         "slurm": {"release": RELEASE, "cluster": "healer",
                                   "version": {"major": "25", "minor": "11", "micro": "0"}}},
                "errors": [dict(e) for e in errors], "warnings": [], **extra}
        return web.json_response(body, status=code)

    def _error(self, code: int, number: int, text: str, source: str) -> web.Response:
        # V0044OpenapiError: error, error_number (int32), description, source
        return self._resp(code, [{"error": text, "error_number": number,
                                  "description": text, "source": source}])

    def _failed(self, rc: int, out: str, err: str, source: str,
                not_found: int = INVALID_NODE_NAME) -> web.Response:
        text = (err or out).strip()[-300:] or f"exit {rc}"
        kind = scontrol_error_kind(text)
        low = text.lower()
        if kind == "transient":
            return self._error(500, COMMUNICATIONS_ERROR, text, source)
        if kind == "not_found" or "invalid job id" in low:
            return self._error(500, not_found, text, source)
        if "invalid node state" in low:
            return self._error(500, INVALID_NODE_STATE, text, source)
        return self._error(500, GENERIC_ERROR, text, source)

    def _authenticate(self, request: web.Request) -> str | None:
        """The Slurm user the request acts as, or None (→ 401)."""
        token = request.headers.get("X-SLURM-USER-TOKEN", "")
        if not token:
            return None
        try:
            claims = jwt.decode(token, self.jwt_key, algorithms=["HS256"],
                                options={"require": ["exp"], "verify_aud": False})
        except jwt.PyJWTError:
            return None
        sun = claims.get("sun")
        if not isinstance(sun, str) or not sun:
            return None
        user = request.headers.get("X-SLURM-USER-NAME", "")
        if user and user != sun and sun not in IMPERSONATORS:
            return None
        return user or sun

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.text()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        rec = Shimmed(request.method, request.path, dict(request.query), body)
        self.requests.append(rec)
        user = self._authenticate(request)
        if user is None:
            return self._error(401, AUTH_CRED_INVALID, "Authentication failure",
                               "auth/jwt")
        rec.user = user
        self.calls[(user, request.method, request.path)] += 1
        if request.path == "/openapi/v3" and request.method == "GET":
            return web.json_response(_openapi())
        parts = request.path.strip("/").split("/")
        if len(parts) < 3 or parts[0] != "slurm" or parts[1] != VERSION:
            return web.Response(status=404, text="Unable find requested URL.")
        kind, arg = parts[2], parts[3] if len(parts) > 3 else ""
        match (request.method, kind):
            case ("GET", "nodes"):
                return await self._nodes("")
            case ("GET", "node") if arg:
                return await self._nodes(arg)
            case ("POST", "node") if arg:
                return await self._update_node(arg, body, user)
            case ("GET", "jobs"):
                return await self._jobs()
            case ("DELETE", "job") if arg:
                return await self._signal(arg, request.query)
            case ("DELETE", "node") if arg:
                return await self._delete_node(arg)
        return web.Response(status=405, text="Requested REST method is not defined at URL.")

    async def _nodes(self, name: str) -> web.Response:
        argv = ["scontrol", "show", "node", "-o"] + ([name] if name else [])
        rc, out, err = await self._slurm(*argv)
        if rc != 0:
            return self._failed(rc, out, err, "slurm_load_node")
        nodes = [node_json(parse_kv_line(line)) for line in out.splitlines()
                 if "NodeName=" in line]
        for n in nodes:
            n["topology"] = self.topology.get(n["name"], "")
        if name and not any(n["name"] == name for n in nodes):
            return self._error(500, INVALID_NODE_NAME, "Invalid node name specified",
                               "slurm_load_node")
        # V0044OpenapiNodesResp: nodes (V0044Nodes), last_update (V0044Uint64NoValStruct)
        return self._resp(nodes=nodes, last_update=_noval(int(time.time())))

    async def _update_node(self, name: str, body: Any, user: str = "") -> web.Response:
        if not isinstance(body, Mapping):
            return self._error(400, PARSE_ERROR, "Unable to parse request body",
                               "update_node_msg")
        unsupported = sorted(set(body) - UPDATE_FIELDS)
        if unsupported:
            return self._error(400, GENERIC_ERROR,
                               f"fields not supported by this shim (Slurm 22.05): {unsupported}",
                               "update_node_msg")
        raw_states = body.get("state") or []
        if not isinstance(raw_states, list):
            return self._error(400, PARSE_ERROR, "state must be an array", "update_node_msg")
        states = [str(s).upper() for s in raw_states]
        if len(states) > 1 or (states and states[0] not in UPDATE_STATES):
            return self._error(400, INVALID_NODE_STATE,
                               f"unsupported node state {states}; this shim maps one of "
                               f"{list(UPDATE_STATES)}", "update_node_msg")
        state = states[0] if states else ""
        reason = " ".join(str(body.get("reason") or "").split())
        comment = body.get("comment")
        topology = body.get("topology_str")
        if topology is not None:
            self.topology[name] = str(topology)
            if not state and not reason and comment is None:
                return self._resp()
        if not state and not reason and comment is None:
            return self._error(400, GENERIC_ERROR, "nothing to update", "update_node_msg")
        argv = ["scontrol", "update", f"nodename={name}"]
        if state:
            if state in ("DRAIN", "DOWN") and not reason:
                return self._error(400, INVALID_NODE_STATE,
                                   f"reason required for {state}", "slurm_update_node")
            argv.append(f"state={state.lower()}")
        if reason:
            argv.append(f"reason={reason}")
        if comment is not None:
            argv.append(f"comment={comment}")
        rc, out, err = await self._slurm(*argv)
        if rc != 0:
            return self._failed(rc, out, err, "slurm_update_node")
        if state or reason:
            self.writes.append((name, state, reason))
            self.write_log.append((time.time(), user, name, state, reason))
        if comment is not None:
            self.comments.append((name, str(comment)))
        return self._resp()

    async def _delete_node(self, name: str) -> web.Response:
        rc, out, err = await self._slurm("scontrol", "delete", f"nodename={name}")
        if rc != 0:
            return self._failed(rc, out, err, "slurm_delete_node")
        self.deleted.append(name)
        return self._resp()

    async def _jobs(self) -> web.Response:
        rc, out, err = await self._slurm("scontrol", "show", "job", "-o")
        if rc != 0:
            return self._failed(rc, out, err, "slurm_load_jobs")
        jobs = [job_json(parse_kv_line(line)) for line in out.splitlines() if "JobId=" in line]
        # V0044OpenapiJobInfoResp: jobs, last_backfill, last_update (V0044Uint64NoValStruct)
        now = int(time.time())
        return self._resp(jobs=jobs, last_backfill=_noval(now), last_update=_noval(now))

    async def _signal(self, arg: str, query: Mapping[str, str]) -> web.Response:
        if not arg.isdigit():
            return self._error(200, INVALID_JOB_ID, "Invalid job id specified",
                               "slurm_kill_job")
        job = int(arg)
        signal = query.get("signal", "")
        flags = query.get("flags", "FULL_JOB")  # documented default
        if not signal:  # documented default: SIGKILL, i.e. the job is cancelled
            self.kills.append(job)
            signal = "KILL"
        scope = {"BATCH_JOB": "--batch", "FULL_JOB": "--full"}.get(flags.upper())
        if scope is None:
            return self._error(400, GENERIC_ERROR, f"unsupported flags {flags!r}",
                               "slurm_kill_job")
        sig = signal.upper().removeprefix("SIG")
        rc, out, err = await self._slurm("scancel", f"--signal={sig}", scope, str(job))
        text = (err or out).strip()
        if rc != 0 or "error" in err.lower():
            if "invalid job id" in text.lower() or "already" in text.lower():
                return self._error(200, INVALID_JOB_ID, text or "Invalid job id specified",
                                   "slurm_kill_job")
            return self._failed(rc or 1, out, err, "slurm_kill_job", INVALID_JOB_ID)
        if sig not in ("KILL", "9"):
            self.signals.append((job, sig, flags.upper()))
        # V0044OpenapiKillJobResp.status: V0044KillJobsRespMsg
        return self._resp(status=[{"job_id": _noval(job),
                                   "step_id": "batch" if scope == "--batch" else "",
                                   "error": {"code": 0, "string": "", "message": ""},
                                   "federation": {"sibling": ""}}])


# -- scontrol → v0.0.44 ------------------------------------------------------------------

_SUFFIX = "*~#!%$@^-"
_DURATION = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+)(?::(\d+))?$")


def _noval(number: int | None, *, infinite: bool = False) -> dict[str, Any]:
    """V0044Uint64NoValStruct / V0044Uint32NoValStruct: ``set``, ``infinite``, ``number``."""
    if infinite:
        return {"set": True, "infinite": True, "number": 0}
    if number is None:
        return {"set": False, "infinite": False, "number": 0}
    return {"set": True, "infinite": False, "number": number}


def _null(value: str | None) -> str:
    return "" if value is None or value in ("(null)", "N/A", "n/a", "None") else value


def _int(value: str | None) -> int | None:
    text = _null(value)
    try:
        return int(text)
    except ValueError:
        return None


def _csv(value: str | None) -> list[str]:
    """V0044CsvString: a JSON array of strings."""
    return [p for p in _null(value).split(",") if p]


def _epoch(value: str | None) -> int | None:
    """scontrol's local ``YYYY-MM-DDTHH:MM:SS`` → Unix seconds (None: Unknown/None/N/A)."""
    text = _null(value)
    if not text or text == "Unknown":
        return None
    try:
        return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def _minutes(value: str | None) -> dict[str, Any]:
    """scontrol's TimeLimit (``UNLIMITED``, ``MM``, ``HH:MM:SS``, ``D-HH:MM:SS``) →
    V0044Uint32NoValStruct in minutes, as slurmrestd reports ``time_limit``."""
    text = _null(value)
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return _noval(None, infinite=True)
    m = _DURATION.match(text)
    if not m:
        return _noval(None)  # e.g. Partition_Limit: not set on the job
    days, a, b, c = m.groups()
    if c is not None:  # [D-]HH:MM:SS (or MM:SS when no hours)
        hours, mins, secs = (int(a or 0), int(b), int(c)) if a is not None else (0, int(b), int(c))
    elif a is not None:  # [D-]HH:MM or MM:SS
        hours, mins, secs = (int(a), int(b), 0) if days else (0, int(a), int(b))
    else:  # D-HH or MM
        hours, mins, secs = (int(b), 0, 0) if days else (0, int(b), 0)
    total = int(days or 0) * 1440 + hours * 60 + mins + (1 if secs else 0)
    return _noval(total)


def node_states(text: str) -> list[str]:
    """scontrol's ``State=IDLE+DRAIN+DYNAMIC_NORM`` → ``["IDLE", "DRAIN", "DYNAMIC_NORM"]``:
    the base state first, then the flags in scontrol's order (V0044NodeState spellings)."""
    base, flags = parse_state(text)
    order: list[str] = []
    for raw in re.split(r"[+,\s]+", text.strip()):
        word = raw.strip().upper().rstrip(_SUFFIX)
        if word and word != base and word in flags and word not in order:
            order.append(word)
    order += sorted(flags - set(order))
    return [base, *order]


def node_json(kv: Mapping[str, str]) -> dict[str, Any]:
    """One ``scontrol show node -o`` line (parsed) → a V0044Node object."""
    reason = _null(kv.get("Reason"))
    load = _null(kv.get("CPULoad"))
    node: dict[str, Any] = {
        "name": kv.get("NodeName", ""),
        "state": node_states(kv.get("State", "")),
        "reason": reason,
        "reason_set_by_user": kv.get("ReasonUser", "") if reason else "",
        "reason_changed_at": _noval(_epoch(kv.get("ReasonTime")) if reason else None),
        "comment": _null(kv.get("Comment")),
        "extra": _null(kv.get("Extra")),
        "address": _null(kv.get("NodeAddr")),
        "hostname": _null(kv.get("NodeHostName")),
        "version": _null(kv.get("Version")),
        "architecture": _null(kv.get("Arch")),
        "operating_system": _null(kv.get("OS")),
        "gres": _null(kv.get("Gres")),
        "gres_used": _null(kv.get("GresUsed")),
        "features": _csv(kv.get("AvailableFeatures")),
        "active_features": _csv(kv.get("ActiveFeatures")),
        "partitions": _csv(kv.get("Partitions")),
        "owner": _null(kv.get("Owner")),
        "mcs_label": _null(kv.get("MCS_label")),
        "tres": _null(kv.get("CfgTRES")),
        "tres_used": _null(kv.get("AllocTRES")),
        "free_mem": _noval(_int(kv.get("FreeMem"))),
        "boot_time": _noval(_epoch(kv.get("BootTime"))),
        "slurmd_start_time": _noval(_epoch(kv.get("SlurmdStartTime"))),
        "last_busy": _noval(_epoch(kv.get("LastBusyTime"))),
    }
    # int32 / int64 fields of V0044Node: omitted when scontrol does not report a number
    for key, field_ in (("port", "Port"), ("cpus", "CPUTot"), ("effective_cpus", "CPUEfctv"),
                        ("alloc_cpus", "CPUAlloc"), ("sockets", "Sockets"),
                        ("cores", "CoresPerSocket"), ("threads", "ThreadsPerCore"),
                        ("boards", "Boards"), ("real_memory", "RealMemory"),
                        ("alloc_memory", "AllocMem"), ("temporary_disk", "TmpDisk"),
                        ("weight", "Weight")):
        value = _int(kv.get(field_))
        if value is not None:
            node[key] = value
    with contextlib.suppress(ValueError):
        node["cpu_load"] = round(float(load) * 100)  # V0044Node.cpu_load: load * 100
    return node


def _id_name(value: str | None) -> tuple[str, int | None]:
    """``root(0)`` → ("root", 0)."""
    m = re.match(r"^(.*)\((\d+)\)$", _null(value))
    return (m.group(1), int(m.group(2))) if m else (_null(value), None)


def job_json(kv: Mapping[str, str]) -> dict[str, Any]:
    """One ``scontrol show job -o`` line (parsed) → a V0044JobInfo object."""
    user, uid = _id_name(kv.get("UserId"))
    group, gid = _id_name(kv.get("GroupId"))
    job: dict[str, Any] = {
        "job_id": int(kv["JobId"]),
        "name": _null(kv.get("JobName")),
        "job_state": [s for s in kv.get("JobState", "").upper().split("+") if s],
        "state_reason": _null(kv.get("Reason")) or "None",
        "nodes": _null(kv.get("NodeList")),
        "partition": _null(kv.get("Partition")),
        "user_name": user,
        "group_name": group,
        "batch_flag": kv.get("BatchFlag", "0") == "1",
        "requeue": kv.get("Requeue", "0") == "1",
        "comment": _null(kv.get("Comment")),
        "node_count": _noval(_int(kv.get("NumNodes"))),
        "cpus": _noval(_int(kv.get("NumCPUs"))),
        "time_limit": _minutes(kv.get("TimeLimit")),
        "submit_time": _noval(_epoch(kv.get("SubmitTime"))),
        "start_time": _noval(_epoch(kv.get("StartTime"))),
        "end_time": _noval(_epoch(kv.get("EndTime"))),
    }
    if uid is not None:
        job["user_id"] = uid
    if gid is not None:
        job["group_id"] = gid
    return job


def _openapi() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for p, methods in (("nodes/", ["get"]), ("node/{node_name}", ["get", "post", "delete"]),
                       ("jobs/", ["get"]), ("job/{job_id}", ["delete"])):
        paths[f"/slurm/{VERSION}/{p}"] = {m: {} for m in methods}
    return {"openapi": "3.0.3", "info": {"title": "Slurm REST API",
                                         "version": f"Slurm-{RELEASE}"}, "paths": paths}


# The operator's Go client (slurm-client ``api/v0044``) *adds* ``Content-Type: application/json``
# to requests that already carry one, so every POST it sends has the header twice. Real
# slurmrestd accepts that; aiohttp's strict request parser answers 400 "Duplicate 'Content-Type'
# header". The shim's connections therefore use aiohttp's lenient (pure Python) request parser.


class _LaxRequestParser(HttpRequestParserPy):
    lax = True


class _LaxServer(web.Server):
    def __call__(self) -> RequestHandler:
        handler = super().__call__()
        handler._parser = _LaxRequestParser(
            handler, self._loop, 2**16, max_line_size=8190, max_field_size=8190,
            max_headers=128, payload_exception=RequestPayloadError, auto_decompress=True,
            max_msg_queue_size=32)
        return handler


class _LaxAppRunner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _LaxServer
        return server
