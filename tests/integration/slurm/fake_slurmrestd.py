"""A small in-process slurmrestd that follows the documented v0.0.44 contract (Slurm 25.11).

The real slurmrestd we can run here is 22.05 (v0.0.38), which has no node update at all, so the
write paths of :class:`healer.adapters.slurm.SlurmrestdDriver` are checked against this fake.
What it implements, from SchedMD's OpenAPI for v0.0.44 (``rest_api.html``) and
``gpu-slurm-facts.md`` section 5:

* Auth: every request, ``/openapi/v3`` included, needs ``X-SLURM-USER-NAME`` and
  ``X-SLURM-USER-TOKEN`` (the configured token); otherwise HTTP 401 "Authentication failure".
* ``GET /openapi/v3``: an OpenAPI document whose ``paths`` list ``/slurm/V/...`` for each
  served version ``V`` (collections with a trailing slash, as v0.0.40+ spells them).
* ``GET /slurm/V/nodes/`` and ``GET /slurm/V/node/{node_name}``: ``{"nodes": [...]}``, node
  ``state`` an array (base state first, then flags), ``reason``, ``reason_set_by_user``,
  ``reason_changed_at`` (a no-val number struct).
* ``POST /slurm/V/node/{node_name}`` with an ``update_node_msg``: ``state`` ``["DRAIN"]`` (needs
  ``reason``), ``["UNDRAIN"]`` (clears DRAIN, keeps the base state), ``["RESUME"]`` (clears
  DRAIN and DOWN), ``reason``. Unknown node: HTTP 500 with ``errors`` error_number 2018.
* ``GET /slurm/V/jobs/``: ``{"jobs": [...]}`` with ``job_id``, ``job_state`` (array),
  ``nodes`` (hostlist), ``name``, ``comment``, ``requeue``.
* ``DELETE /slurm/V/job/{job_id}?signal=SIG&flags=FLAG``: **defaults when missing: signal
  SIGKILL, flags FULL_JOB** (``src/slurmrestd/plugins/openapi/slurmctld/jobs.c``), i.e. a
  DELETE without ``signal`` cancels the job: the fake records it in :attr:`kills` and marks the
  job CANCELLED. Responses carry ``status[]`` with ``error.code`` per job.
* Every response body has ``meta``, ``errors`` and ``warnings``; failures can ride on HTTP 200
  in ``errors`` (see :meth:`FakeSlurmrestd.fail_next`).

Every request is recorded (method, path, query, JSON body, headers) in :attr:`requests` so a
test can assert exactly what healer sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from healer.adapters.slurm.parse import expand_hostlist
from healer.obs.http import serve

__all__ = ["FakeSlurmrestd", "Recorded"]

BASE_STATES = {"IDLE", "ALLOCATED", "MIXED", "DOWN", "UNKNOWN", "ERROR", "FUTURE"}


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    headers: dict[str, str]


@dataclass
class _Failure:
    status: int
    errors: list[dict[str, Any]]
    paths: tuple[str, ...]
    method: str


@dataclass
class FakeSlurmrestd:
    versions: Sequence[str] = ("v0.0.42", "v0.0.43", "v0.0.44")
    token: str = "test-token"
    release: str = "25.11.2"
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    signals: list[tuple[int, str, str]] = field(default_factory=list)
    kills: list[int] = field(default_factory=list)
    _failures: list[_Failure] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    url: str = ""

    # -- setup -----------------------------------------------------------------------------

    def add_node(self, name: str, state: Sequence[str] = ("IDLE",), reason: str = "",
                 user: str = "") -> None:
        self.nodes[name] = {"name": name, "state": list(state), "reason": reason,
                            "reason_set_by_user": user,
                            "reason_changed_at": {"set": bool(reason), "infinite": False,
                                                  "number": 1_790_000_000 if reason else 0}}

    def add_job(self, job_id: int, nodes: str, state: str = "RUNNING", name: str = "job",
                requeue: bool = True) -> None:
        self.jobs[job_id] = {"job_id": job_id, "job_state": [state], "nodes": nodes,
                             "name": name, "comment": "", "requeue": requeue}

    def fail_next(self, status: int, error_number: int = 0, error: str = "",
                  paths: Sequence[str] = (), method: str = "") -> None:
        """Make the next request (to one of ``paths`` / with ``method`` if given) fail: HTTP
        ``status`` with an ``errors`` entry when ``error_number`` is set (200 + errors is
        allowed, as slurmrestd does)."""
        errors = [{"error": error or "injected", "error_number": error_number,
                   "description": error or "injected", "source": "fake"}] if error_number else []
        self._failures.append(_Failure(status, errors, tuple(paths), method.upper()))

    def calls(self, method: str = "") -> list[Recorded]:
        """Recorded requests, without the version negotiation."""
        return [r for r in self.requests
                if r.path != "/openapi/v3" and (not method or r.method == method)]

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

    # -- HTTP ------------------------------------------------------------------------------

    def _resp(self, code: int = 200, errors: list[dict[str, Any]] | None = None,
              **extra: Any) -> web.Response:
        body = {"meta": {"plugin": {"type": "openapi/slurmctld", "name": "Slurm OpenAPI slurmctld",
                                    "data_parser": f"data_parser/{self.versions[-1]}"},
                         "slurm": {"release": self.release, "cluster": "fake"}},
                "errors": errors or [], "warnings": [], **extra}
        return web.json_response(body, status=code)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.text()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        self.requests.append(Recorded(request.method, request.path, dict(request.query), body,
                                      dict(request.headers)))
        if (request.headers.get("X-SLURM-USER-TOKEN") != self.token
                or not request.headers.get("X-SLURM-USER-NAME")):
            return web.Response(status=401, text="Authentication failure")
        for i, f in enumerate(self._failures):
            if ((not f.paths or request.path in f.paths)
                    and (not f.method or f.method == request.method)):
                del self._failures[i]
                return self._resp(f.status, f.errors)
        if request.path == "/openapi/v3" and request.method == "GET":
            return web.json_response(self._openapi())
        parts = request.path.strip("/").split("/")
        if len(parts) < 3 or parts[0] != "slurm" or parts[1] not in self.versions:
            return web.Response(status=404, text="Unable find requested URL.")
        kind, arg = parts[2], parts[3] if len(parts) > 3 else ""
        match (request.method, kind):
            case ("GET", "nodes"):
                return self._resp(nodes=list(self.nodes.values()))
            case ("GET", "node") if arg:
                if arg not in self.nodes:
                    return self._invalid_node()
                return self._resp(nodes=[self.nodes[arg]])
            case ("POST", "node") if arg:
                return self._update_node(arg, body)
            case ("GET", "jobs"):
                return self._resp(jobs=list(self.jobs.values()))
            case ("DELETE", "job") if arg:
                return self._signal(arg, request.query)
        return web.Response(status=405, text="Requested REST method is not defined at URL.")

    def _openapi(self) -> dict[str, Any]:
        paths: dict[str, Any] = {}
        for v in self.versions:
            for p, methods in (("nodes/", ["get", "post"]), ("node/{node_name}",
                               ["get", "post", "delete"]), ("jobs/", ["get", "delete"]),
                               ("job/{job_id}", ["get", "post", "delete"]), ("ping/", ["get"])):
                paths[f"/slurm/{v}/{p}"] = {m: {} for m in methods}
        return {"openapi": "3.0.3", "info": {"title": "Slurm REST API",
                                             "version": f"Slurm-{self.release}"}, "paths": paths}

    def _invalid_node(self) -> web.Response:
        return self._resp(500, [{"error": "Invalid node name specified", "error_number": 2018,
                                 "description": "Invalid node name specified",
                                 "source": "slurm_update_node"}])

    def _update_node(self, name: str, body: Any) -> web.Response:
        if name not in self.nodes:
            return self._invalid_node()
        if not isinstance(body, Mapping):
            return self._resp(400, [{"error": "Unable to parse request body", "error_number": 9001,
                                     "description": "body", "source": "fake"}])
        node = self.nodes[name]
        state: list[str] = node["state"]
        for s in [str(x).upper() for x in body.get("state") or ()]:
            if s == "DRAIN":
                if not body.get("reason"):
                    return self._resp(200, [{"error": "Invalid node state specified",
                                             "error_number": 2028, "description": "reason "
                                             "required for DRAIN", "source": "fake"}])
                if "DRAIN" not in state:
                    state.append("DRAIN")
            elif s == "UNDRAIN":
                if "DRAIN" in state:
                    state.remove("DRAIN")
                node["reason"] = ""
            elif s == "RESUME":
                state[:] = ["IDLE" if x == "DOWN" else x for x in state if x != "DRAIN"]
                node["reason"] = ""
        if body.get("reason"):
            node["reason"] = body["reason"]
            node["reason_set_by_user"] = "root"
        return self._resp()

    def _signal(self, arg: str, query: Mapping[str, str]) -> web.Response:
        if not arg.isdigit() or int(arg) not in self.jobs:
            return self._resp(200, [{"error": "Invalid job id specified", "error_number": 2017,
                                     "description": "Invalid job id specified",
                                     "source": "slurm_kill_job"}])
        job_id = int(arg)
        signal = query.get("signal", "SIGKILL")  # documented default
        flags = query.get("flags", "FULL_JOB")  # documented default
        if signal.upper().removeprefix("SIG") in ("KILL", "9"):
            self.kills.append(job_id)
            self.jobs[job_id]["job_state"] = ["CANCELLED"]
        else:
            self.signals.append((job_id, signal, flags))
        return self._resp(status=[{"job_id": {"set": True, "infinite": False, "number": job_id},
                                   "step_id": "batch", "error": {"code": 0, "string": "",
                                                                 "message": ""},
                                   "federation": {"sibling": ""}}])

    def running_on(self, node: str) -> list[int]:
        return [j for j, o in self.jobs.items()
                if node in expand_hostlist(o["nodes"]) and o["job_state"] == ["RUNNING"]]
