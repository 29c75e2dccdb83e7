"""A TEST BRIDGE: slurmrestd's documented v0.0.44 contract, served over the REAL local Slurm.

Why it exists: the only slurmrestd we can run here is Slurm 22.05's (``openapi/v0.0.38``), and
its REST API has no node update at all (HTTP 405 for ``POST /slurm/v0.0.38/node/...``) and no
flagged job signal, so healer's slurmrestd driver cannot drain, undrain or signal through it.
This bridge is not slurmrestd and not a fake with its own state: it answers the v0.0.44 requests
healer sends (paths, headers, body and error shapes as in ``tests/integration/slurm/
fake_slurmrestd.py``, which follows SchedMD's OpenAPI for v0.0.44) by running the real Slurm
clients against the test's real slurmctld:

* every request, ``/openapi/v3`` included, needs ``X-SLURM-USER-NAME`` and
  ``X-SLURM-USER-TOKEN`` (the configured token; healer reads it from a Kubernetes Secret),
  otherwise HTTP 401;
* ``GET /slurm/v0.0.44/nodes/`` and ``.../node/{name}`` → ``scontrol show node -o``, parsed
  (:func:`healer.adapters.slurm.parse.parse_nodes`) into v0.0.44 node objects (``state`` an
  array: base state, then flags); an unknown node → HTTP 500, ``error_number`` 2018;
* ``POST /slurm/v0.0.44/node/{name}`` ``{"state": ["DRAIN"], "reason": ...}`` /
  ``["UNDRAIN"]`` / ``["RESUME"]`` → ``scontrol update nodename=... state=drain reason=...`` /
  ``state=undrain`` / ``state=resume``;
* ``GET /slurm/v0.0.44/jobs/`` → ``scontrol show job -o`` (``job_state`` an array);
* ``DELETE /slurm/v0.0.44/job/{id}?signal=SIG&flags=BATCH_JOB|FULL_JOB`` →
  ``scancel --signal=SIG --batch|--full ID``. A DELETE **without** ``signal`` is what
  slurmrestd documents as SIGKILL (cancel the job): the bridge does that too, and records it in
  :attr:`SlurmrestdBridge.kills` so the test fails on it;
* slurmctld unreachable → HTTP 500, ``error_number`` 1001 (a communication error, transient).

Every request is recorded in :attr:`requests`, every write in :attr:`writes` / :attr:`signals`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from healer.adapters.slurm.parse import parse_kv_line, parse_nodes, scontrol_error_kind
from healer.obs.http import serve

__all__ = ["VERSION", "Bridged", "SlurmrestdBridge"]

VERSION = "v0.0.44"
RELEASE = "25.11.0 (bridged to Slurm 22.05 through scontrol)"

# Slurm errnos (slurm/slurm_errno.h)
COMMUNICATIONS_ERROR = 1001
INVALID_JOB_ID = 2017
INVALID_NODE_NAME = 2018
INVALID_NODE_STATE = 2028
GENERIC_ERROR = 1


@dataclass
class Bridged:
    method: str
    path: str
    query: dict[str, str]
    body: Any


@dataclass
class SlurmrestdBridge:
    env: Mapping[str, str]
    token: str
    requests: list[Bridged] = field(default_factory=list)
    #: (node, state, reason) of every node update carried out
    writes: list[tuple[str, str, str]] = field(default_factory=list)
    #: (job id, signal, flags) of every signal sent
    signals: list[tuple[int, str, str]] = field(default_factory=list)
    #: job ids a DELETE without ``signal`` cancelled (healer must never send one)
    kills: list[int] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = await serve(app, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def updates_of(self, node: str) -> list[tuple[str, str]]:
        return [(state, reason) for n, state, reason in self.writes if n == node]

    # -- Slurm -----------------------------------------------------------------------------

    async def _slurm(self, *argv: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=dict(self.env))
        try:
            async with asyncio.timeout(20):
                out, err = await proc.communicate()
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
        body = {"meta": {"plugin": {"type": "openapi/slurmctld",
                                    "name": "Slurm OpenAPI slurmctld",
                                    "data_parser": f"data_parser/{VERSION}"},
                         "slurm": {"release": RELEASE, "cluster": "healer"}},
                "errors": [dict(e) for e in errors], "warnings": [], **extra}
        return web.json_response(body, status=code)

    def _error(self, code: int, number: int, text: str, source: str) -> web.Response:
        return self._resp(code, [{"error": text, "error_number": number,
                                  "description": text, "source": source}])

    def _failed(self, rc: int, out: str, err: str, source: str,
                not_found: int = INVALID_NODE_NAME) -> web.Response:
        text = (err or out).strip()[-300:] or f"exit {rc}"
        kind = scontrol_error_kind(text)
        if kind == "transient":
            return self._error(500, COMMUNICATIONS_ERROR, text, source)
        if kind == "not_found" or "invalid job id" in text.lower():
            return self._error(500, not_found, text, source)
        return self._error(500, GENERIC_ERROR, text, source)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.text()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        self.requests.append(Bridged(request.method, request.path, dict(request.query), body))
        if (request.headers.get("X-SLURM-USER-TOKEN") != self.token
                or not request.headers.get("X-SLURM-USER-NAME")):
            return web.Response(status=401, text="Authentication failure")
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
                return await self._update_node(arg, body)
            case ("GET", "jobs"):
                return await self._jobs()
            case ("DELETE", "job") if arg:
                return await self._signal(arg, request.query)
        return web.Response(status=405, text="Requested REST method is not defined at URL.")

    async def _nodes(self, name: str) -> web.Response:
        argv = ["scontrol", "show", "node", "-o"] + ([name] if name else [])
        rc, out, err = await self._slurm(*argv)
        if rc != 0:
            return self._failed(rc, out, err, "slurm_load_node")
        nodes = [_node_json(s.name, s.base, sorted(s.flags), s.reason, s.reason_user)
                 for s in parse_nodes(out)]
        if name and not any(n["name"] == name for n in nodes):
            return self._error(500, INVALID_NODE_NAME, "Invalid node name specified",
                               "slurm_load_node")
        return self._resp(nodes=nodes)

    async def _update_node(self, name: str, body: Any) -> web.Response:
        if not isinstance(body, Mapping):
            return self._error(400, 9001, "Unable to parse request body", "update_node_msg")
        states = [str(s).upper() for s in body.get("state") or ()]
        reason = " ".join(str(body.get("reason") or "").split())
        if len(states) != 1 or states[0] not in ("DRAIN", "UNDRAIN", "RESUME"):
            return self._error(400, INVALID_NODE_STATE, f"unsupported node state {states}",
                               "update_node_msg")
        state = states[0]
        argv = ["scontrol", "update", f"nodename={name}", f"state={state.lower()}"]
        if state == "DRAIN":
            if not reason:
                return self._resp(200, [{"error": "Invalid node state specified",
                                         "error_number": INVALID_NODE_STATE,
                                         "description": "reason required for DRAIN",
                                         "source": "slurm_update_node"}])
            argv.append(f"reason={reason}")
        rc, out, err = await self._slurm(*argv)
        if rc != 0:
            return self._failed(rc, out, err, "slurm_update_node")
        self.writes.append((name, state, reason))
        return self._resp()

    async def _jobs(self) -> web.Response:
        rc, out, err = await self._slurm("scontrol", "show", "job", "-o")
        if rc != 0:
            return self._failed(rc, out, err, "slurm_load_jobs")
        jobs = []
        for line in out.splitlines():
            if "JobId=" not in line:
                continue
            kv = parse_kv_line(line)
            nodes = kv.get("NodeList", "")
            jobs.append({"job_id": int(kv["JobId"]), "job_state": [kv.get("JobState", "")],
                         "nodes": "" if nodes in ("(null)", "") else nodes,
                         "name": kv.get("JobName", ""),
                         "comment": "" if kv.get("Comment") in (None, "(null)")
                         else kv["Comment"],
                         "requeue": kv.get("Requeue", "0") == "1"})
        return self._resp(jobs=jobs)

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
        return self._resp(status=[{"job_id": {"set": True, "infinite": False, "number": job},
                                   "step_id": "batch" if scope == "--batch" else "",
                                   "error": {"code": 0, "string": "", "message": ""},
                                   "federation": {"sibling": ""}}])


def _node_json(name: str, base: str, flags: Sequence[str], reason: str,
               user: str) -> dict[str, Any]:
    return {"name": name, "state": [base, *flags], "reason": reason,
            "reason_set_by_user": user,
            "reason_changed_at": {"set": bool(reason), "infinite": False, "number": 0}}


def _openapi() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for p, methods in (("nodes/", ["get", "post"]), ("node/{node_name}", ["get", "post",
                                                                          "delete"]),
                       ("jobs/", ["get", "delete"]), ("job/{job_id}", ["get", "post",
                                                                       "delete"]),
                       ("ping/", ["get"])):
        paths[f"/slurm/{VERSION}/{p}"] = {m: {} for m in methods}
    return {"openapi": "3.0.3", "info": {"title": "Slurm REST API",
                                         "version": f"Slurm-{RELEASE}"}, "paths": paths}
