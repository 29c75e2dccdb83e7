"""Running the real ``healer agent`` in a subprocess against the fake NVML and the local API.

The agent runs as ``python -m healer.agent.main`` with the fake ``libnvidia-ml.so.1`` on
``LD_LIBRARY_PATH`` and ``FAKENVML_SCENARIO`` set (glibc reads LD_LIBRARY_PATH only when a
process starts), ``KUBECONFIG`` and ``NODE_NAME`` in its environment, its JSON log in a file.
:class:`TcpProxy` sits between an agent and kube-apiserver so a test can take the API server
away from that one agent (and give it back) without disturbing the shared control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client

from healer_dev.devstack.kwok import fake_node
from healer_dev.devstack.net import free_port
from tests.fakenvml.build import nvml_env
from tests.integration.waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
N_GPUS = 4
GPU_LABEL = "nvidia.com/gpu.present"


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-4222-8333-000000abc{i:03d}"


def scenario(n: int = N_GPUS, events: list[dict[str, Any]] | None = None,
             **per_gpu: dict[str, Any]) -> dict[str, Any]:
    """``per_gpu``: ``g2={"remap": {"pending": 1}}`` adds to GPU 2's settings."""
    return {"driver": "550.54.15",
            "gpus": [{"uuid": uuid(i), "serial": f"165123{i:07d}", **per_gpu.get(f"g{i}", {})}
                     for i in range(n)],
            "events": events or []}


@dataclass
class AgentProcess:
    """One ``healer agent`` process; its stdout and stderr go to ``log``."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    node: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def lines(self) -> list[dict[str, Any]]:
        """The JSON log lines (anything else is kept as ``{"raw": line}``)."""
        out: list[dict[str, Any]] = []
        for line in self.text().splitlines():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                obj = {"raw": line}
            out.append(obj if isinstance(obj, dict) else {"raw": line})
        return out

    def logged(self, event: str, **match: Any) -> list[dict[str, Any]]:
        return [m for m in self.lines() if m.get("event") == event
                and all(m.get(k) == v for k, v in match.items())]

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.text().splitlines()[-n:])

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"healer agent exited {self.proc.returncode}:\n{self.tail()}")
        return True

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def terminate(self, timeout: float = 20) -> int:
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
            return -9

    async def get(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.get(self.url + path) as r:
            return r.status, await r.text()

    async def ready(self, deadline: float = 60) -> None:
        async def ok() -> bool:
            self.alive()
            try:
                status, _ = await self.get("/readyz")
            except aiohttp.ClientError:
                return False
            return status == 200

        await wait_for(ok, timeout=deadline, description=f"agent /readyz on {self.node}")

    async def metrics(self) -> str:
        status, text = await self.get("/metrics")
        assert status == 200, text
        return text


def spawn_agent(*, lib_dir: Path, scenario_path: Path, kubeconfig: Path, node: str,
                workdir: Path, interval: float = 0.5,
                heartbeat: float = 1.0, extra: tuple[str, ...] = (),
                env: Mapping[str, str] | None = None) -> AgentProcess:
    port = free_port()
    log = workdir / f"agent-{node}-{port}.log"
    base = {**os.environ, "PYTHONPATH": str(ROOT), "KUBECONFIG": str(kubeconfig),
            "NODE_NAME": node, **(env or {})}
    argv = [sys.executable, "-m", "healer.agent.main", "--interval", str(interval),
            "--heartbeat", str(heartbeat),
            "--http-host", "127.0.0.1", "--http-port", str(port), "--log-format", "json",
            *extra]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=nvml_env(lib_dir, scenario_path, base))
    return AgentProcess(proc, port, log, node)


# ---------------------------------------------------------------------------------------------
# the API side


async def create_gpu_node(api: client.ApiClient, name: str) -> None:
    """A kwok node labelled as a GPU node, Ready (kwok writes its conditions once)."""
    core = client.CoreV1Api(api)
    await core.create_node(fake_node(name, labels={GPU_LABEL: "true"}))  # type: ignore[arg-type]

    async def ready() -> bool:
        n = await core.read_node(name)
        return any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])

    await wait_for(ready, timeout=60, description=f"kwok node {name} Ready")


async def node_raw(api: client.ApiClient, name: str) -> dict[str, Any]:
    obj = await client.CoreV1Api(api).read_node(name)
    raw = api.sanitize_for_serialization(obj)
    assert isinstance(raw, dict)
    return raw


def conditions(raw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (raw.get("status") or {}).get("conditions") or []}


async def gpu_condition(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    return conditions(await node_raw(api, name)).get("GPUHealthy")


async def node_events(api: client.ApiClient, namespace: str, node: str,
                      reason: str | None = None) -> list[dict[str, Any]]:
    raw = await client.EventsV1Api(api).list_namespaced_event(
        namespace, label_selector=f"healer.io/node={node}")
    items = api.sanitize_for_serialization(raw)["items"]
    return [e for e in items if e["regarding"]["name"] == node
            and (reason is None or e["reason"] == reason)]


def kubeconfig_via(admin: Path, port: int, out: Path) -> Path:
    """A copy of ``admin`` whose server is https://127.0.0.1:``port`` (the proxy)."""
    cfg = yaml.safe_load(admin.read_text())
    for c in cfg["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{port}"
    out.write_text(yaml.safe_dump(cfg))
    return out


@dataclass
class TcpProxy:
    """A TCP forwarder on 127.0.0.1 (TLS passes through untouched). ``stop`` closes the port
    and cuts every connection; ``start`` opens the same port again."""

    target_port: int
    port: int = 0
    _server: asyncio.Server | None = None
    _conns: set[asyncio.StreamWriter] = field(default_factory=set)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._conns):
            w.transport.abort()
        self._conns.clear()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            down_w.transport.abort()
            return
        self._conns |= {down_w, up_w}

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                w.transport.abort()
                self._conns.discard(w)

        await asyncio.gather(pipe(down_r, up_w), pipe(up_r, down_w))


def elapsed_ms(t0: float) -> float:
    return (time.time() - t0) * 1e3
