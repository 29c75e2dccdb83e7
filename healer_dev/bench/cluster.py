"""The real stack the ``stack`` and ``promql`` groups stand up, and stop again.

:class:`BenchCluster` starts kube-apiserver + etcd + kwok (:class:`~healer_dev.devstack.kube
.KubeStack`, no controller manager or scheduler: no Pods are involved), creates kwok GPU nodes,
runs the healer daemon as a child process (:mod:`healer_dev.bench.daemon`, in its own session so
the whole process group is stopped), and watches the API for what the bench times: the first
NodeRemediation of a node, its ``drain`` step, and the node turning unschedulable. Every wait
has a deadline; nothing sleeps to let things settle. :meth:`stop` stops everything it started,
in reverse order, also after an error or Ctrl-C.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio import client, watch

from healer.adapters.kube.client import make_api_client
from healer.adapters.kube.crd import GROUP, PLURAL, VERSION
from healer.errors import ConfigError
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import fake_node
from healer_dev.devstack.net import LOOPBACK, free_port

from .policies import BENCH_LABEL

log = structlog.get_logger(__name__)
ROOT = Path(__file__).resolve().parents[2]
DOMAIN = "accelerator.topograph.run/domain"
#: phases of a NodeRemediation that is over ("" : no phase written yet counts as open)
CLOSED = frozenset({"Done", "Cancelled", "Recovered", "Escalated", "Healthy"})


async def wait_until(pred: Callable[[], Awaitable[bool] | bool], limit: float, what: str,
                     interval: float = 0.02) -> float:
    """Poll ``pred`` until true; ConfigError after ``limit`` seconds. Returns when it was."""
    deadline = time.monotonic() + limit
    while True:
        r = pred()
        if not isinstance(r, bool):
            r = await r
        if r:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise ConfigError(f"bench: timed out after {limit:g}s waiting for {what}")
        await asyncio.sleep(interval)


@dataclass
class Seen:
    """First times (time.monotonic, in this process) the watches saw something per node."""

    remediation: dict[str, float] = field(default_factory=dict)
    remediation_wall: dict[str, float] = field(default_factory=dict)  # time.time()
    drain: dict[str, float] = field(default_factory=dict)
    cordoned: dict[str, float] = field(default_factory=dict)
    phases: dict[str, str] = field(default_factory=dict)  # NR name -> phase
    node_phase: dict[str, str] = field(default_factory=dict)  # node -> its latest NR's phase

    def open(self) -> int:
        return sum(1 for p in self.phases.values() if p not in CLOSED)

    def closed(self, node: str) -> bool:
        return self.node_phase.get(node, "") in CLOSED


class BenchCluster:
    def __init__(self, workdir: Path, run_id: str, say: Callable[[str], None]) -> None:
        self.dir = workdir
        self.run = run_id
        self.say = say
        self.kube: KubeStack | None = None
        self.api: client.ApiClient | None = None
        self.daemon: subprocess.Popen[bytes] | None = None
        self.daemon_port = 0
        self.seen = Seen()
        self.tasks: list[asyncio.Task[Any]] = []
        self.nodes: list[str] = []

    # -- control plane and nodes ----------------------------------------------------------

    async def start_kube(self) -> None:
        t0 = time.monotonic()
        self.kube = KubeStack(self.dir / "kube", controllers=False, kwok=True)
        try:
            await asyncio.to_thread(self.kube.start)
        except ConfigError as e:
            raise ConfigError(f"the control plane (etcd, kube-apiserver, kwok) did not "
                              f"start:\n{e}") from e
        self.api = await make_api_client(str(self.kube.kubeconfig))
        core = client.CoreV1Api(self.api)
        with contextlib.suppress(client.exceptions.ApiException):
            await core.create_namespace({"metadata": {"name": "healer-system"}})  # type: ignore[arg-type]
        self.say(f"  control plane up in {time.monotonic() - t0:.1f}s: {self.kube.server} "
                 "(etcd, kube-apiserver, kwok)")

    async def create_nodes(self, count: int, prefix: str = "gpu",
                           names: list[str] | None = None) -> list[str]:
        assert self.api is not None
        core = client.CoreV1Api(self.api)
        names = names or [f"{prefix}-{i:05d}" for i in range(count)]
        sem = asyncio.Semaphore(32)
        t0 = time.monotonic()

        async def make(i: int, n: str) -> None:
            body = fake_node(n, labels={"nvidia.com/gpu.present": "true", BENCH_LABEL: self.run,
                                        DOMAIN: f"nvl-{i // 8:04d}"})
            async with sem:
                await core.create_node(body)  # type: ignore[arg-type]

        await asyncio.gather(*(make(i, n) for i, n in enumerate(names)))

        async def ready() -> bool:
            got = await core.list_node(label_selector=f"{BENCH_LABEL}={self.run}")
            return sum(1 for n in got.items if any(c.type == "Ready" and c.status == "True"
                                                   for c in n.status.conditions or [])) == count

        await wait_until(ready, 60 + count / 20, f"{count} kwok nodes Ready", interval=0.5)
        self.nodes = names
        self.say(f"  {count:,} kwok GPU nodes created and Ready in {time.monotonic() - t0:.1f}s")
        return names

    async def set_condition(self, node: str, status: str = "False",
                            reason: str = "XidFatal") -> None:
        """What healer's agent publishes: the GPUHealthy condition (strategic merge)."""
        assert self.api is not None
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cond = {"type": "GPUHealthy", "status": status, "reason": reason,
                "message": "XID 79 on GPU 3 (bench)" if status == "False" else "",
                "lastHeartbeatTime": now, "lastTransitionTime": now}
        await client.CoreV1Api(self.api).patch_node_status(
            node, {"status": {"conditions": [cond]}},  # type: ignore[call-arg]
            _content_type="application/strategic-merge-patch+json", field_manager="bench-agent")

    async def heal(self, nodes: list[str], limit: float) -> None:
        """What an admin does once the GPU is fixed: the condition back to True, then an
        uncordon, which cancels healer's remediation; returns once every one is closed."""
        assert self.api is not None
        core = client.CoreV1Api(self.api)
        sem = asyncio.Semaphore(64)

        async def one(node: str) -> None:
            async with sem:
                await self.set_condition(node, "True", "Healthy")
                await core.patch_node(node, {"spec": {"unschedulable": False}})

        await asyncio.gather(*(one(n) for n in nodes))
        await wait_until(lambda: all(self.seen.closed(n) for n in nodes), limit,
                         f"the remediations of {len(nodes)} healed node(s) to close",
                         interval=0.05)

    # -- watches --------------------------------------------------------------------------

    async def start_watches(self) -> None:
        """Watch nodes and NodeRemediations (the CRD must exist); returns once both listed."""
        synced = [asyncio.Event(), asyncio.Event()]
        self.tasks.append(asyncio.create_task(self._watch_nodes(synced[0]), name="bench-nodes"))
        self.tasks.append(asyncio.create_task(self._watch_nrs(synced[1]), name="bench-nrs"))
        await wait_until(lambda: all(e.is_set() for e in synced), 60, "the bench's watches")

    async def _stream(self, lister: Callable[..., Any], on: Callable[[dict[str, Any]], None],
                      synced: asyncio.Event, **kw: Any) -> None:
        """List (every item is an event), then watch from the list's resourceVersion."""
        rv = ""
        while True:
            try:
                if not rv:
                    listed = await lister(**kw)
                    if not isinstance(listed, dict):
                        assert self.api is not None
                        listed = self.api.sanitize_for_serialization(listed)
                    for item in listed.get("items") or []:
                        on(item)
                    rv = str((listed.get("metadata") or {}).get("resourceVersion", ""))
                    synced.set()
                async with watch.Watch() as w:
                    async for ev in w.stream(lister, resource_version=rv, timeout_seconds=300,
                                             **kw):
                        raw = ev.get("raw_object")
                        if not isinstance(raw, dict):
                            continue
                        if ev.get("type") == "ERROR":
                            rv = ""
                            break
                        rv = str((raw.get("metadata") or {}).get("resourceVersion", rv))
                        on(raw)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the API server's hiccup: watch again
                log.debug("bench watch restarts", error=str(e))
                await asyncio.sleep(0.1)

    async def _watch_nodes(self, synced: asyncio.Event) -> None:
        assert self.api is not None

        def on(raw: dict[str, Any]) -> None:
            name = raw.get("metadata", {}).get("name", "")
            if (raw.get("spec") or {}).get("unschedulable") and name not in self.seen.cordoned:
                self.seen.cordoned[name] = time.monotonic()

        await self._stream(client.CoreV1Api(self.api).list_node, on, synced,
                           label_selector=f"{BENCH_LABEL}={self.run}")

    async def _watch_nrs(self, synced: asyncio.Event) -> None:
        assert self.api is not None
        co = client.CustomObjectsApi(self.api)

        def on(raw: dict[str, Any]) -> None:
            node = (raw.get("spec") or {}).get("node", "")
            now = time.monotonic()
            if node not in self.seen.remediation:
                self.seen.remediation[node] = now
                self.seen.remediation_wall[node] = time.time()
            st = raw.get("status") or {}
            phase = str(st.get("phase", ""))
            self.seen.phases[raw.get("metadata", {}).get("name", "")] = phase
            self.seen.node_phase[node] = phase
            if node not in self.seen.drain and any(
                    s.get("step") == "drain" for s in st.get("ledger") or []):
                self.seen.drain[node] = now

        await self._stream(co.list_cluster_custom_object, on, synced, group=GROUP, version=VERSION,
                           plural=PLURAL)

    # -- the daemon -----------------------------------------------------------------------

    async def start_daemon(self, policies: Path, *, prometheus_url: str = "",
                           poll_interval: float = 15.0, qps: float = 0.0,
                           burst: int = 1000) -> None:
        """The daemon, its API requests counted (:meth:`requests`); ``qps`` 0: no client-side
        rate limit (the bench measures healer's own ceiling; ``--kube-api-qps`` to apply one)."""
        assert self.kube is not None
        self.daemon_port = free_port()
        argv = [sys.executable, "-m", "healer_dev.bench.daemon",
                "--kubeconfig", str(self.kube.kubeconfig), "--policies", str(policies),
                "--http-port", str(self.daemon_port), "--log-file", str(self.dir / "healer.log"),
                "--poll-interval", str(poll_interval), "--requests-file",
                str(self.dir / "requests.json"), "--kube-api-qps", str(qps),
                "--kube-api-burst", str(burst)]
        if prometheus_url:
            argv += ["--prometheus-url", prometheus_url]
        self.daemon = await asyncio.to_thread(self._spawn, argv)
        t0 = time.monotonic()

        async def ready() -> bool:
            assert self.daemon is not None
            if self.daemon.poll() is not None:
                raise ConfigError(f"the healer daemon exited {self.daemon.returncode}:\n"
                                  + self.log_tail())
            return (await self.http_get("/readyz"))[0] == 200

        await wait_until(ready, 120, "the healer daemon's /readyz", interval=0.1)
        self.say(f"  healer daemon ready in {time.monotonic() - t0:.1f}s (pid {self.daemon.pid})")

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.dir / "healer.stderr", "ab") as err:
            return subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=err,
                                    stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def log_tail(self, n: int = 30) -> str:
        lines: list[str] = []
        for name in ("healer.stderr", "healer.log"):
            with contextlib.suppress(OSError):
                lines += (self.dir / name).read_text(errors="replace").splitlines()[-n:]
        return "\n".join(lines[-n:])

    async def http_get(self, path: str) -> tuple[int, str]:
        try:
            async with aiohttp.ClientSession() as s, s.get(
                    f"http://{LOOPBACK}:{self.daemon_port}{path}",
                    timeout=aiohttp.ClientTimeout(total=10)) as r:
                return r.status, await r.text()
        except (aiohttp.ClientError, TimeoutError):
            return 0, ""

    async def requests(self) -> dict[tuple[str, str, str], int]:
        """The daemon's API requests so far: (what it was doing, verb, resource) → count."""
        assert self.daemon is not None
        path = self.dir / "requests.json"
        before = path.stat().st_mtime_ns if path.exists() else 0
        os.kill(self.daemon.pid, signal.SIGUSR1)
        await wait_until(lambda: path.exists() and path.stat().st_mtime_ns != before, 30,
                         "the daemon's request counts")
        return {(d["doing"], d["verb"], d["resource"]): int(d["count"])
                for d in json.loads(path.read_text())}

    async def apiserver_writes_per_second(self, window: float) -> float:
        """Write requests per second the API server served over ``window`` seconds (its
        ``apiserver_request_total``), whoever sent them (in the bench: kwok's node Leases)."""
        api = self.api
        assert api is not None

        async def writes() -> float:
            resp = await api.call_api("/metrics", "GET", auth_settings=["BearerToken"],
                                           _preload_content=False, _return_http_data_only=True)
            text = (await resp.read()).decode()
            resp.release()
            total = 0.0
            for line in text.splitlines():
                if line.startswith("apiserver_request_total{") and any(
                        f'verb="{v}"' in line for v in ("POST", "PUT", "PATCH", "DELETE")):
                    total += float(line.rsplit(" ", 1)[1])
            return total

        w0, t0 = await writes(), time.monotonic()
        await asyncio.sleep(window)  # the measurement window itself
        return (await writes() - w0) / (time.monotonic() - t0)

    def daemon_cpu_seconds(self) -> float:
        assert self.daemon is not None
        fields = Path(f"/proc/{self.daemon.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def daemon_rss_mb(self) -> float:
        assert self.daemon is not None
        for line in Path(f"/proc/{self.daemon.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
        return 0.0

    # -- stop -----------------------------------------------------------------------------

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.daemon is not None and self.daemon.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.daemon.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(self.daemon.wait, 15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.daemon.pid, signal.SIGKILL)
                await asyncio.to_thread(self.daemon.wait, 15)
        if self.api is not None:
            await self.api.close()
        if self.kube is not None:
            await asyncio.to_thread(self.kube.stop)
