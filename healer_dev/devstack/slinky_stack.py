"""The Slinky world on the local stack: SchedMD's real operator over a real Slurm 26.05 and its
real slurmrestd, with a pod runtime standing in for the kubelet of the slurmd pods.

:class:`SlinkyStack` puts together, on one :class:`~healer_dev.devstack.kube.KubeStack` and one
:class:`~healer_dev.devstack.slurm.LocalSlurm` of Slurm 26.05 (from its Debian root, ADR 0017)
started with dynamic nodes:

* :class:`~healer_dev.devstack.operator.SlinkyOperator`: the operator's manager (+ webhook from
  v1.1), built from the Go module proxy, out of cluster;
* that Slurm's own slurmrestd (``auth/jwt``, data parsers v0.0.42 .. v0.0.45) on
  ``127.0.0.1:6820``, where the operator's client calls with ``DEBUG=1``. The operator mints
  HS256 JWTs (``sun: slurm``) from the key in the clusters' ``<cluster>-auth-jwths256``
  Secrets; slurmctld checks them with its ``jwt_key``: the two hold the same bytes, as a Helm
  install of Slinky mounts the Secret into slurmctld;
* :class:`~healer_dev.devstack.podruntime.PodRuntime`: a real ``slurmd -Z`` for every Running slurmd
  worker pod (kwok runs no containers), with the pod's preStop when it terminates.

The runtime runs on an event loop of its own in a background thread, so that the synchronous
test fixtures and the demo can share one stack. :meth:`add_cluster` creates what the ``slurm``
Helm chart would in a namespace (Secrets, Controller, RestApi; their pods run on a
``devstack-system`` kwok Node), :meth:`use` switches the operator version (one operator at a
time: the client's port is fixed).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Self, TypeVar

from kubernetes_asyncio import client, config

from healer.errors import ConfigError
from healer_dev.devstack.binaries import cache_dir
from healer_dev.devstack.dead_node import resume_heartbeat, stop_heartbeat
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import fake_node
from healer_dev.devstack.operator import (
    DEFAULT_VERSION,
    RESTD_PORT,
    SlinkyOperator,
    cluster_objects,
)
from healer_dev.devstack.podruntime import PodRuntime
from healer_dev.devstack.slurm import LocalSlurm

__all__ = ["SYSTEM_LABEL", "SYSTEM_NODE", "SlinkyStack"]

T = TypeVar("T")

SYSTEM_NODE = "devstack-system"
#: how long a second stack on this machine waits for the first to stop
LOCK_WAIT = 900.0
SYSTEM_LABEL = ("healer.io/devstack-role", "system")


class SlinkyStack:
    """Operator + the Slurm's real slurmrestd + pod runtime over a running KubeStack and a
    LocalSlurm of Slurm 26.05 (its slurmrestd is started here, on ``restd_port``)."""

    def __init__(self, kube: KubeStack, slurm: LocalSlurm, *, workdir: Path,
                 version: str = DEFAULT_VERSION, jwt_key: bytes | None = None,
                 restd_port: int = RESTD_PORT) -> None:
        if "v0.0.44" not in slurm.version.restd_versions:
            raise ConfigError(f"SchedMD's slurm-operator speaks slurmrestd v0.0.44: it needs "
                              f"Slurm >= 25.11, not the LocalSlurm's {slurm.version} (create "
                              "it with version='26.05')")
        if jwt_key is not None and jwt_key != slurm.jwt_key:
            raise ConfigError("the JWT key of the operator's Secret must be slurmctld's: "
                              "create the LocalSlurm with jwt_key=... instead")
        self.kube = kube
        self.slurm = slurm
        self.workdir = Path(workdir)
        self.version = version
        #: the HS256 key in the clusters' JWT Secrets: slurmctld's own ``jwt_key``
        self.jwt_key = slurm.jwt_key
        self.slurm_key = os.urandom(64)
        self.restd_port = restd_port
        self.operator: SlinkyOperator | None = None
        self.runtime: PodRuntime | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._api: client.ApiClient | None = None
        self._runtime_task: asyncio.Task[None] | None = None
        self._lock: int | None = None
        self.timings: dict[str, float] = {}

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Self:
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._take_machine_lock()
        try:
            self.slurm.start_restd(self.restd_port)
            self._start_loop()
            self._call(self._start_async())
            self._system_node()
            self._start_operator(self.version)
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - t0
        return self

    def use(self, version: str) -> None:
        """Run operator ``version`` from now on (the running one is stopped first)."""
        if self.operator is not None and self.operator.version == version \
                and self.operator.running():
            return
        if self.operator is not None:
            self.operator.stop()
            self.operator = None
        self._start_operator(version)

    def restart_operator(self) -> None:
        """Stop the operator and start the same version again: a fresh process with fresh
        informers, as a restarted operator pod would be. Tests that restart the API server call
        it afterwards so that the next test does not inherit client-go reflectors still backing
        off from the outage."""
        version = self.version
        if self.operator is not None:
            self.operator.stop()
            self.operator = None
        self._start_operator(version)

    def stop(self) -> None:
        """Operator first (it must not see slurmds vanish), then the runtime and slurmrestd.
        Idempotent."""
        if self.operator is not None:
            self.operator.stop()
            self.operator = None
        if self._loop is not None and self._loop.is_running():
            try:
                self._call(self._stop_async(), timeout=60)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                if self._thread is not None:
                    self._thread.join(timeout=10)
        self._loop = None
        self._thread = None
        self.slurm.stop_restd()
        if self._lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                os.close(self._lock)
            self._lock = None

    # -- clusters ------------------------------------------------------------------------

    def add_cluster(self, namespace: str, cluster: str = "slurm") -> None:
        """What ``helm install slurm`` creates in ``namespace`` (the namespace too, if new)."""
        op = self._op()
        op.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
        objs = cluster_objects(namespace, cluster, jwt_key=self.jwt_key,
                               slurm_key=self.slurm_key)
        for obj in objs:  # the Controller's and RestApi's own (kwok) pods go to the system Node
            if obj["kind"] in ("Controller", "RestApi"):
                obj["spec"]["template"] = {"spec": {"nodeSelector": dict([SYSTEM_LABEL])}}
        op.apply(objs)
        if self.runtime is not None:  # its slurmd pods get slurmds from this stack's runtime
            runtime = self.runtime

            async def handle() -> None:
                runtime.handle_namespace(namespace)

            self._call(handle())

    def kill_node(self, node: str, *, slurmd: str = "kill") -> list[str]:
        """``node`` dies outright (:mod:`healer_dev.devstack.dead_node`): kwok stops
        heartbeating it and the pod runtime stops acting for its pods, its slurmds killed with
        their jobs (``slurmd="kill"``) or frozen (``"freeze"``: cut off, alive). Returns the
        Slurm names of the slurmds it ran."""
        if self.runtime is None:
            raise ConfigError("the pod runtime is not running")
        stop_heartbeat(self.kube, node)
        return self._call(self.runtime.kill_node(node, slurmd=slurmd))

    def revive_node(self, node: str) -> list[str]:
        """``node`` answers again: its kubelet heartbeats and posts Ready, its frozen slurmds
        go on (killed ones are started again)."""
        if self.runtime is None:
            raise ConfigError("the pod runtime is not running")
        names = self._call(self.runtime.revive_node(node))
        resume_heartbeat(self.kube, node)
        return names

    def token(self, user: str = "root", lifetime: float = 24 * 3600) -> str:
        """A JWT for ``user`` from ``scontrol token`` (slurmctld signs it with its key)."""
        return self.slurm.token(user, lifespan=int(lifetime))

    @property
    def restd_url(self) -> str:
        return f"http://127.0.0.1:{self.restd_port}"

    # -- internals -----------------------------------------------------------------------

    def _op(self) -> SlinkyOperator:
        if self.operator is None:
            raise ConfigError("the slurm-operator is not running")
        return self.operator

    def _take_machine_lock(self) -> None:
        """One Slinky stack per machine: the operator's client always calls localhost:6820.
        A second one waits (up to :data:`LOCK_WAIT`) for the first to stop."""
        path = cache_dir() / "slinky-stack.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                    os.close(fd)
                    raise ConfigError(
                        f"another Slinky stack (pid {holder or '?'}) holds {path} since more "
                        f"than {LOCK_WAIT:.0f} s: only one slurm-operator can run per machine "
                        f"(its client always calls localhost:{RESTD_PORT})") from None
                time.sleep(0.5)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock = fd

    def _start_operator(self, version: str) -> None:
        op = SlinkyOperator(self.kube, version, workdir=self.workdir / f"operator-{version}")
        op.start()
        self.operator = op
        self.version = version

    def _system_node(self) -> None:
        code, body = self.kube.request("POST", "/api/v1/nodes", fake_node(
            SYSTEM_NODE, labels=dict([SYSTEM_LABEL])))
        if code not in (200, 201, 409):
            raise ConfigError(f"cannot create the {SYSTEM_NODE} Node: HTTP {code} {body}")

    def _start_loop(self) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="slinky-stack", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise ConfigError("the Slinky stack's event loop did not start")
        self._loop = loop

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        assert self._loop is not None
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout)

    async def _start_async(self) -> None:
        cfg = client.Configuration()
        await config.load_kube_config(config_file=str(self.kube.kubeconfig),
                                      client_configuration=cfg)
        self._api = client.ApiClient(cfg)
        # only the namespaces given to add_cluster: a test may run its own runtime elsewhere
        self.runtime = PodRuntime(self._api, self.slurm, namespaces=())
        self._runtime_task = asyncio.get_running_loop().create_task(
            self.runtime.run(), name="pod-runtime")

    async def _stop_async(self) -> None:
        if self.runtime is not None:
            await self.runtime.aclose()
        if self._runtime_task is not None:
            self._runtime_task.cancel()
            await asyncio.gather(self._runtime_task, return_exceptions=True)
            self._runtime_task = None
        if self._api is not None:
            await self._api.close()
            self._api = None
