"""A real Kubernetes control plane on loopback, for the integration tests and the demo.

:class:`KubeStack` runs etcd and kube-apiserver (RBAC, client-certificate users, service-account
tokens), and optionally kube-controller-manager, kube-scheduler and kwok (fake kubelets), all
built from the Go module proxy by ``hack/build-k8s.sh`` (see :mod:`healer_dev.devstack.binaries`).
Nothing listens on anything but 127.0.0.1; ports are picked by binding port 0 and retried when
another process wins the race. Every child runs in its own session (so a process group can be
killed as a whole) and logs to ``<workdir>/logs/<component>.log``.

Readiness is always an observable condition polled against a deadline, never a sleep:

* etcd: ``GET /health`` says ``"health":"true"``;
* kube-apiserver: ``GET /readyz`` with the admin client certificate (mTLS) is ``ok``, then the
  ``default`` Namespace is readable;
* kube-controller-manager: the ``default`` ServiceAccount exists in ``default`` and
  ``kube-system`` and the ``kube-root-ca.crt`` ConfigMap was published;
* kwok: a probe Node annotated ``kwok.x-k8s.io/node=fake`` turns Ready;
* kube-scheduler: a probe Pod gets bound to that node and, through kwok, Running (without kwok:
  the scheduler marks an unschedulable probe Pod ``PodScheduled=False``).

The probe objects are deleted again, so tests start from an empty fleet.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

from healer.errors import ConfigError
from healer_dev.devstack import binaries as bins
from healer_dev.devstack.certs import PKI, CertificateAuthority, KeyPair, write_kubeconfig
from healer_dev.devstack.children import ChildProcess, log_tail, stop_all
from healer_dev.devstack.kwok import KWOK_ANNOTATION, KWOK_STAGES, fake_node
from healer_dev.devstack.net import LOOPBACK, free_port

T = TypeVar("T")

STATE_FILE = "state.json"
STATE_VERSION = 1

#: the annotation kwok selects its nodes by (``--manage-nodes-with-annotation-selector``)
SERVICE_CIDR = "10.96.0.0/24"
POD_CIDR = "10.244.0.0/16"
KWOK_NODE_IP = "10.240.0.1"

ETCD = "etcd"
APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
KWOK = "kwok"
#: start order
COMPONENTS = (ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER, KWOK)
#: stop order: each tier gets SIGTERM together and is gone before the next one
_STOP_TIERS = ((KWOK, SCHEDULER, CONTROLLER_MANAGER), (APISERVER,), (ETCD,))

_PORT_TRIES = 4
_POLL = 0.1
_ADDR_IN_USE = re.compile(r"address already in use|bind: address|EADDRINUSE", re.IGNORECASE)


# --------------------------------------------------------------------------- REST


class _Rest:
    """A tiny synchronous client for readiness probes (the stack must not need an event loop)."""

    def __init__(self, port: int, ca: Path, cert: Path, key: Path) -> None:
        self.port = port
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.ctx.load_cert_chain(str(cert), str(key))

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 10.0
    ) -> tuple[int, Any]:
        conn = http.client.HTTPSConnection(LOOPBACK, self.port, context=self.ctx, timeout=timeout)
        try:
            headers = {"Accept": "application/json"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode("utf-8", "replace")
        return resp.status, parsed


# --------------------------------------------------------------------------- the stack


class KubeStack:
    """etcd + kube-apiserver (+ controller manager, scheduler, kwok) on 127.0.0.1.

    ``with KubeStack(tmpdir) as stack: ...`` starts and stops it; or call :meth:`start` and
    :meth:`stop`. :meth:`write_state` and :meth:`from_state` let another process stop a stack
    that was started detached (``python -m healer_dev devstack up`` / ``down``).

    * ``workdir``: certificates, etcd data, logs, kubeconfigs (default: a new temp dir; kept
      after :meth:`stop` unless ``stop(remove=True)``). Starting again in the same workdir
      keeps etcd's data.
    * ``controllers``: run kube-controller-manager (namespaces finish deleting, default
      ServiceAccounts, Deployments/Jobs make Pods, garbage collection). With it the
      ServiceAccount admission plugin stays on; without it, it is disabled (nothing would
      create the ``default`` SA and no Pod could be admitted).
    * ``scheduler``: run kube-scheduler (default: the same as ``controllers``).
    * ``kwok``: fake kubelets for Nodes made with :func:`fake_node`.
    * ``start_timeout``: seconds each component may take to become ready;
      ``stop_timeout``: seconds between SIGTERM and SIGKILL.
    * ``node_grace``: kube-controller-manager's ``--node-monitor-grace-period`` (seconds; None:
      its default, 50 s): how long a Node may go without a heartbeat (kwok renews each Node's
      Lease) before the node lifecycle controller marks it ``Ready=Unknown`` and taints it
      ``node.kubernetes.io/unreachable``; with it set, kwok's Leases last ``node_grace`` (kwok
      renews a quarter of the way through) and the controller looks every second. The
      dead-node demo and bench set it short (:meth:`set_node_grace` changes the controller's
      side of it on a running stack: the dead-node tests).
    """

    def __init__(
        self,
        workdir: Path | str | None = None,
        *,
        controllers: bool = True,
        scheduler: bool | None = None,
        kwok: bool = True,
        start_timeout: float = 60.0,
        stop_timeout: float = 20.0,
        binaries: bins.Binaries | None = None,
        node_grace: float | None = None,
    ) -> None:
        self._workdir = (
            Path(workdir).resolve()
            if workdir is not None
            else Path(tempfile.mkdtemp(prefix="healer-kube-"))
        )
        self.controllers = controllers
        self.scheduler = controllers if scheduler is None else scheduler
        self.kwok = kwok
        self.node_grace = node_grace
        #: kwok's Node Lease duration: 40 s, or ``node_grace`` (at least 4 s) when set at start
        self._lease_seconds = 40 if node_grace is None else max(4, round(node_grace))
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._binaries = binaries
        self._pki = PKI(self._workdir / "pki")
        self._procs: dict[str, ChildProcess] = {}
        self.ports: dict[str, int] = {}
        self.timings: dict[str, float] = {}
        self._rest: _Rest | None = None

    # ---------------------------------------------------------------- properties

    @property
    def workdir(self) -> Path:
        return self._workdir

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (user ``admin``, group ``system:masters``)."""
        return self._workdir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://{LOOPBACK}:{self._port(APISERVER)}"

    @property
    def ca_file(self) -> Path:
        """The CA that signed kube-apiserver's serving certificate."""
        return self._pki.serving_ca_crt

    @property
    def etcd_url(self) -> str:
        return f"http://{LOOPBACK}:{self._port(ETCD)}"

    @property
    def binaries(self) -> bins.Binaries:
        if self._binaries is None:
            self._binaries = bins.ensure()
        return self._binaries

    @property
    def pids(self) -> dict[str, int]:
        """Pid of every component that was started (and not stopped since)."""
        return {n: p.pid for n, p in self._procs.items() if p.pid is not None}

    def logs(self, component: str) -> Path:
        return self._workdir / "logs" / f"{component}.log"

    def running(self) -> dict[str, bool]:
        return {n: p.running() for n, p in self._procs.items() if p.pid is not None}

    def _port(self, name: str) -> int:
        try:
            return self.ports[name]
        except KeyError:
            raise ConfigError(f"{name} has no port yet: the stack was not started") from None

    # ---------------------------------------------------------------- environment

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for subprocesses: KUBECONFIG and PATH (built binaries first)."""
        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = str(self.kubeconfig)
        dirs = [str(d) for d in self.binaries.dirs()]
        env["PATH"] = os.pathsep.join([*dirs, env.get("PATH", os.defpath)])
        return env

    def user_kubeconfig(self, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig for a client-certificate user (CN=user, O=groups), for RBAC tests."""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", user)
        tag = re.sub(r"[^A-Za-z0-9_.-]", "_", "+".join(groups)) if groups else ""
        path = self._workdir / "users" / (f"{safe}--{tag}" if tag else safe)
        path = path.with_name(path.name + ".kubeconfig")
        return self._pki.user_kubeconfig(path, server=self.server, user=user, groups=groups)

    # ---------------------------------------------------------------- REST

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One admin (mTLS) request to kube-apiserver: ``(status, parsed JSON body)``.

        Meant for probes and test set-up; real code uses kubernetes_asyncio.
        """
        if self._rest is None:
            self._rest = _Rest(
                self._port(APISERVER),
                self._pki.serving_ca_crt,
                self._pki.dir / "admin.crt",
                self._pki.dir / "admin.key",
            )
        return self._rest.request(method, path, body)

    def _get_ok(self, path: str) -> bool:
        try:
            status, _ = self.request("GET", path)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200

    # ---------------------------------------------------------------- waiting

    def _wait(
        self,
        component: str,
        what: str,
        check: Callable[[], T | None],
        timeout: float | None = None,
    ) -> T:
        """Poll ``check`` until it returns non-None; ConfigError naming ``component`` if not."""
        limit = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        last_error = ""
        while True:
            # A dead process can never pass the check: look first (a probe of a port some other
            # program holds could otherwise hang until its timeout), and look at every
            # component, so the one that died is named, not the one being waited for.
            for name, proc in self._procs.items():
                if proc.pid is not None and not proc.running():
                    code = proc.exit_code()
                    raise ConfigError(
                        f"{name} exited{'' if code is None else f' with code {code}'} "
                        f"while waiting for {component}: {what}; "
                        f"last lines of {proc.log}:\n{log_tail(proc.log)}"
                    )
            try:
                result = check()
            except (OSError, http.client.HTTPException) as e:
                result, last_error = None, f" (last error: {e})"
            if result is not None:
                return result
            if time.monotonic() >= deadline:
                log = self.logs(component)
                raise ConfigError(
                    f"{component}: timed out after {limit:.0f}s waiting for "
                    f"{what}{last_error}; last lines of {log}:\n{log_tail(log)}"
                )
            time.sleep(_POLL)

    # ---------------------------------------------------------------- start

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        """Start every component and wait until each one is observably working."""
        if any(p.running() for p in self._procs.values()):
            raise ConfigError(f"the stack in {self._workdir} is already running")
        t0 = time.monotonic()
        b = self.binaries
        self._workdir.mkdir(parents=True, exist_ok=True)
        (self._workdir / "logs").mkdir(exist_ok=True)
        if not self._pki.exists():
            self._pki.generate()
            admin = self._pki.client_ca().issue_client("admin", ["system:masters"])
            admin.write(self._pki.dir / "admin.crt", self._pki.dir / "admin.key")
        try:
            self._start_etcd(b)
            self._start_apiserver_fresh(b)
            if self.controllers:
                self._start_controller_manager(b)
            if self.scheduler:
                self._start_scheduler(b)
            if self.kwok:
                self._start_kwok(b)
            self._probe_workloads()
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - t0
        return self

    def _spawn(self, name: str, argv: list[str]) -> ChildProcess:
        proc = ChildProcess(name=name, argv=argv, log=self.logs(name))
        self._procs[name] = proc
        proc.spawn(self._workdir, self._child_env())
        return proc

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        return env

    def _with_port_retry(
        self, name: str, attempt: Callable[[], None], cleanup: Callable[[], None] | None = None
    ) -> None:
        """Run ``attempt`` (start + wait) again with new ports when a port was taken.

        Between free_port() and the child's bind another process may take the port; the child
        then exits with "address already in use" and is started again on fresh ports.
        """
        for i in range(_PORT_TRIES):
            try:
                attempt()
                return
            except ConfigError:
                proc = self._procs.get(name)
                if proc is None or i == _PORT_TRIES - 1:
                    raise
                if not _ADDR_IN_USE.search(proc.output_since_spawn()):
                    raise
                stop_all([proc], 5)
                with proc.log.open("ab") as f:
                    f.write(b"---- a port was taken; retrying with new ports\n")
                if cleanup is not None:
                    cleanup()

    def _start_etcd(self, b: bins.Binaries) -> None:
        data = self._workdir / "etcd"
        fresh = not data.exists()

        def attempt() -> None:
            client, peer = free_port(), free_port()
            while peer == client:
                peer = free_port()
            self.ports[ETCD] = client
            self.ports["etcd-peer"] = peer
            curl, purl = f"http://{LOOPBACK}:{client}", f"http://{LOOPBACK}:{peer}"
            t = time.monotonic()
            self._spawn(
                ETCD,
                [
                    str(b.etcd),
                    "--name=devstack",
                    f"--data-dir={data}",
                    f"--listen-client-urls={curl}",
                    f"--advertise-client-urls={curl}",
                    f"--listen-peer-urls={purl}",
                    f"--initial-advertise-peer-urls={purl}",
                    f"--initial-cluster=devstack={purl}",
                    "--unsafe-no-fsync=true",
                    "--quota-backend-bytes=268435456",
                    "--log-level=warn",
                ],
            )
            limit = min(30.0, self.start_timeout)
            self._wait(ETCD, "GET /health", self._etcd_healthy, timeout=limit)
            self.timings[ETCD] = time.monotonic() - t

        def cleanup() -> None:
            if fresh:  # a half-initialised member would remember the lost peer URL
                shutil.rmtree(data, ignore_errors=True)

        self._with_port_retry(ETCD, attempt, cleanup)

    def _etcd_healthy(self) -> bool | None:
        conn = http.client.HTTPConnection(LOOPBACK, self._port(ETCD), timeout=1)
        try:
            conn.request("GET", "/health")
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        if resp.status == 200 and json.loads(body).get("health") == "true":
            return True
        return None

    def _apiserver_argv(self, b: bins.Binaries, port: int) -> list[str]:
        p = self._pki
        argv = [
            str(b.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={LOOPBACK}",
            f"--advertise-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--tls-cert-file={p.apiserver_crt}",
            f"--tls-private-key-file={p.apiserver_key}",
            f"--client-ca-file={p.client_ca_crt}",
            f"--service-account-issuer=https://{LOOPBACK}:{port}",
            f"--service-account-key-file={p.sa_pub}",
            f"--service-account-signing-key-file={p.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            # The lease reconciler would publish 127.0.0.1 in Endpoints/kubernetes, which
            # validation rejects ("may not be in the loopback range") and logs as an error.
            "--endpoint-reconciler-type=none",
            # Without it SIGTERM waits for open watches up to --request-timeout (60 s); with it
            # the HTTP server gets 2 s, new requests a 429 + Retry-After meanwhile.
            "--shutdown-send-retry-after=true",
            "--profiling=false",
            "--v=0",
        ]
        if not self.controllers:
            # Nothing creates the `default` ServiceAccount, so Pods could never be admitted.
            argv.append("--disable-admission-plugins=ServiceAccount")
        return argv

    def _start_apiserver_fresh(self, b: bins.Binaries) -> None:
        def attempt() -> None:
            port = free_port()
            self.ports[APISERVER] = port
            self._rest = None
            self._write_admin_kubeconfig()
            self._launch_apiserver(self._apiserver_argv(b, port))

        self._with_port_retry(APISERVER, attempt)

    def _launch_apiserver(self, argv: list[str]) -> None:
        t = time.monotonic()
        self._spawn(APISERVER, argv)
        self._wait(APISERVER, "GET /readyz (mTLS) = ok", lambda: self._get_ok("/readyz") or None)
        self._wait(
            APISERVER,
            "Namespace default readable",
            lambda: self._get_ok("/api/v1/namespaces/default") or None,
        )
        self.timings[APISERVER] = time.monotonic() - t

    def _write_admin_kubeconfig(self) -> None:
        admin = KeyPair(
            (self._pki.dir / "admin.crt").read_bytes(), (self._pki.dir / "admin.key").read_bytes()
        )
        write_kubeconfig(
            self.kubeconfig,
            server=self.server,
            ca_pem=self._pki.serving_ca_crt.read_bytes(),
            client=admin,
            user="admin",
        )

    def _start_controller_manager(self, b: bins.Binaries) -> None:
        t = time.monotonic()
        p = self._pki
        self._spawn(
            CONTROLLER_MANAGER,
            [
                str(b.kube_controller_manager),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                f"--bind-address={LOOPBACK}",
                "--secure-port=0",
                f"--service-account-private-key-file={p.sa_key}",
                f"--root-ca-file={p.serving_ca_crt}",
                f"--cluster-signing-cert-file={p.client_ca_crt}",
                f"--cluster-signing-key-file={p.client_ca_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--profiling=false",
                "--v=0",
                *self._node_grace_args(),
            ],
        )

        self._wait_controller_manager(("default", "kube-system"))
        self.timings[CONTROLLER_MANAGER] = time.monotonic() - t

    def _wait_controller_manager(self, namespaces: Sequence[str]) -> None:
        """Wait until the `default` SA and `kube-root-ca.crt` exist in every namespace given."""

        def ready() -> bool | None:
            for ns in namespaces:
                for path in (
                    f"/api/v1/namespaces/{ns}/serviceaccounts/default",
                    f"/api/v1/namespaces/{ns}/configmaps/kube-root-ca.crt",
                ):
                    if not self._get_ok(path):
                        return None
            return True

        self._wait(
            CONTROLLER_MANAGER,
            f"ServiceAccount default and ConfigMap kube-root-ca.crt in {', '.join(namespaces)}",
            ready,
        )

    def _probe_controller_manager(self) -> None:
        """Prove a (re)started controller manager works: a new namespace gets its SA."""
        ns = f"devstack-probe-{secrets.token_hex(3)}"
        self._create("/api/v1/namespaces", {"metadata": {"name": ns}})
        try:
            self._wait_controller_manager((ns,))
        finally:
            with contextlib.suppress(OSError, http.client.HTTPException):
                self.request("DELETE", f"/api/v1/namespaces/{ns}")

    def _start_scheduler(self, b: bins.Binaries) -> None:
        self._spawn(
            SCHEDULER,
            [
                str(b.kube_scheduler),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                f"--bind-address={LOOPBACK}",
                "--secure-port=0",
                "--profiling=false",
                "--v=0",
            ],
        )

    def _start_kwok(self, b: bins.Binaries) -> None:
        config = self._workdir / "kwok.yaml"
        # Stages only: a KwokConfiguration document in the file would be taken without its
        # defaults (every *Parallelism 0: "node leases parallelism must be greater than 0").
        config.write_text(KWOK_STAGES)
        self._spawn(
            KWOK,
            [
                str(b.kwok),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={config}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION[0]}={KWOK_ANNOTATION[1]}",
                f"--cidr={POD_CIDR}",
                f"--node-ip={KWOK_NODE_IP}",
                f"--node-lease-duration-seconds={self._lease_seconds}",
            ],
        )

    def _node_grace_args(self) -> list[str]:
        if self.node_grace is None:
            return []
        return [f"--node-monitor-grace-period={self.node_grace:g}s", "--node-monitor-period=1s"]


    def set_node_grace(self, grace: float | None) -> None:
        """Run kube-controller-manager with another ``--node-monitor-grace-period`` (None: its
        default): it is restarted with the new flag and probed again; Nodes, Leases and Pods
        stay. kwok is left alone (restarted, it would take over its own Leases only once they
        expire, and every Node would go Unknown meanwhile), so its Leases keep the duration
        the stack started with: keep ``grace`` well above a quarter of it (kwok's renewal
        interval) plus the machine's hiccups."""
        if grace == self.node_grace:
            return
        self.node_grace = grace
        proc = self._procs.get(CONTROLLER_MANAGER)
        if proc is None or proc.pid is None:
            return
        stop_all([proc], self.stop_timeout)
        self._start_controller_manager(self.binaries)
        if (self._workdir / STATE_FILE).exists():
            self.write_state()

    # ---------------------------------------------------------------- probes

    def _probe_workloads(self) -> None:
        """Prove kwok and the scheduler work, with throw-away objects deleted afterwards."""
        if not (self.kwok or self.scheduler):
            return
        suffix = secrets.token_hex(3)
        node = f"devstack-probe-{suffix}"
        pod = f"devstack-probe-{suffix}"
        ns = "kube-system" if self.controllers else "default"
        pod_path = f"/api/v1/namespaces/{ns}/pods/{pod}"
        try:
            if self.kwok:
                t = time.monotonic()
                self._create("/api/v1/nodes", fake_node(node, labels={"healer.io/probe": "true"}))
                self._wait(KWOK, f"probe Node {node} to turn Ready", lambda: self._node_ready(node))
                self.timings[KWOK] = time.monotonic() - t
            if self.scheduler:
                t = time.monotonic()
                selector = (
                    {"kubernetes.io/hostname": node}
                    if self.kwok
                    else {"healer.io/devstack-probe": "nowhere"}
                )
                self._create(
                    f"/api/v1/namespaces/{ns}/pods",
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": pod, "labels": {"healer.io/probe": "true"}},
                        "spec": {
                            "nodeSelector": selector,
                            "tolerations": [{"operator": "Exists"}],
                            "automountServiceAccountToken": False,
                            "terminationGracePeriodSeconds": 0,
                            "containers": [{"name": "probe", "image": "registry.k8s.io/pause"}],
                        },
                    },
                )
                if self.kwok:
                    self._wait(
                        SCHEDULER,
                        f"probe Pod bound to {node} and Running",
                        lambda: self._pod_running_on(pod_path, node),
                    )
                else:
                    self._wait(
                        SCHEDULER,
                        "probe Pod marked PodScheduled=False (Unschedulable)",
                        lambda: self._pod_unschedulable(pod_path),
                    )
                self.timings[SCHEDULER] = time.monotonic() - t
        finally:
            with contextlib.suppress(OSError, http.client.HTTPException):
                if self.scheduler:
                    self.request("DELETE", pod_path + "?gracePeriodSeconds=0")
                if self.kwok:
                    self.request("DELETE", f"/api/v1/nodes/{node}")

    def _create(self, path: str, body: dict[str, Any]) -> None:
        status, resp = self.request("POST", path, body)
        if status not in (200, 201):
            raise ConfigError(f"POST {path} failed with HTTP {status}: {resp}")

    def _get(self, path: str) -> Any:
        status, body = self.request("GET", path)
        return body if status == 200 else None

    def _node_ready(self, name: str) -> bool | None:
        node = self._get(f"/api/v1/nodes/{name}")
        for c in ((node or {}).get("status") or {}).get("conditions") or []:
            if c.get("type") == "Ready" and c.get("status") == "True":
                return True
        return None

    def _pod_running_on(self, path: str, node: str) -> bool | None:
        pod = self._get(path) or {}
        if pod.get("spec", {}).get("nodeName") != node:
            return None
        return True if pod.get("status", {}).get("phase") == "Running" else None

    def _pod_unschedulable(self, path: str) -> bool | None:
        for c in ((self._get(path) or {}).get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                return True
        return None

    # ---------------------------------------------------------------- apiserver restarts

    def kill_apiserver(self, *, hard: bool = False) -> None:
        """Stop only kube-apiserver (SIGTERM, or SIGKILL with ``hard``); etcd keeps running."""
        proc = self._procs.get(APISERVER)
        if proc is None or proc.pid is None:
            raise ConfigError("kube-apiserver is not running")
        if hard:
            proc.signal(signal.SIGKILL)
            proc.wait(time.monotonic() + 10)
            proc.forget()
        else:
            stop_all([proc], self.stop_timeout)
        self._rest = None

    def start_apiserver(self) -> None:
        """Start kube-apiserver again with the very same flags (same port, same etcd)."""
        proc = self._procs.get(APISERVER)
        if proc is None:
            raise ConfigError("kube-apiserver was never started")
        if proc.running():
            raise ConfigError("kube-apiserver is already running")
        self._rest = None
        self._launch_apiserver(proc.argv)
        if (self._workdir / STATE_FILE).exists():
            self.write_state()

    def restart_apiserver(self, *, restart_clients: bool = True) -> float:
        """Stop kube-apiserver and start it on the same port and etcd; returns the seconds taken.

        etcd keeps running, so every object survives; clients keep their kubeconfig, and their
        connections and watches drop (a watch resumed from an old resourceVersion gets
        410 Expired: the new watch cache starts at etcd's current revision).

        With ``restart_clients`` (the default) kube-controller-manager, kube-scheduler and
        kwok are stopped first and started again afterwards, and each is probed. Left alone,
        their client-go reflectors back off exponentially (0.8 s doubling to 30-60 s, reset
        only after 2 quiet minutes), so after a few restarts in a row the controllers stay
        blind for up to a minute (measured: a new namespace got its ServiceAccount after 1 s,
        10 s, then 59 s) and later tests would wait on them.
        """
        t = time.monotonic()
        clients = [
            self._procs[n]
            for n in (KWOK, SCHEDULER, CONTROLLER_MANAGER)
            if restart_clients and n in self._procs and self._procs[n].pid is not None
        ]
        stop_all(clients, self.stop_timeout)
        self.kill_apiserver()
        self.start_apiserver()
        if clients:
            env = self._child_env()
            for proc in reversed(clients):  # controller manager, scheduler, kwok
                proc.spawn(self._workdir, env)
            if self.controllers:
                self._probe_controller_manager()
            self._probe_workloads()
            if (self._workdir / STATE_FILE).exists():
                self.write_state()
        took = time.monotonic() - t
        self.timings["restart-apiserver"] = took
        return took

    # ---------------------------------------------------------------- stop

    def stop(self, *, remove: bool = False) -> None:
        """Stop every component (SIGTERM, deadline, SIGKILL of the process group).

        With ``remove``, also delete the work directory.
        """
        t = time.monotonic()
        # Clients first, then kube-apiserver while etcd is still there (without etcd its
        # shutdown hooks wait ~10 s on storage timeouts), then etcd.
        for tier in _STOP_TIERS:
            stop_all([self._procs[n] for n in tier if n in self._procs], self.stop_timeout)
        self._rest = None
        state = self._workdir / STATE_FILE
        if state.exists():
            state.unlink()
        self.timings["stop"] = time.monotonic() - t
        if remove:
            shutil.rmtree(self._workdir, ignore_errors=True)

    # ---------------------------------------------------------------- state

    def write_state(self) -> Path:
        """Record ports, pids and flags in ``<workdir>/state.json`` (for :meth:`from_state`)."""
        b = self.binaries
        doc = {
            "version": STATE_VERSION,
            "workdir": str(self._workdir),
            "controllers": self.controllers,
            "scheduler": self.scheduler,
            "kwok": self.kwok,
            "ports": self.ports,
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "binaries": {
                k: (str(v) if v is not None else None)
                for k, v in (
                    ("etcd", b.etcd),
                    ("kube_apiserver", b.kube_apiserver),
                    ("kube_controller_manager", b.kube_controller_manager),
                    ("kube_scheduler", b.kube_scheduler),
                    ("kubectl", b.kubectl),
                    ("kwok", b.kwok),
                    ("helm", b.helm),
                )
            },
            "processes": {n: p.to_state() for n, p in self._procs.items() if p.pid is not None},
        }
        path = self._workdir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def from_state(cls, workdir: Path | str) -> KubeStack:
        """A handle on a stack another process started (and recorded with :meth:`write_state`)."""
        wd = Path(workdir).resolve()
        try:
            doc = json.loads((wd / STATE_FILE).read_text())
        except FileNotFoundError:
            raise ConfigError(f"no devstack recorded in {wd} ({STATE_FILE} is absent)") from None
        except ValueError as e:
            raise ConfigError(f"{wd / STATE_FILE} is not valid JSON: {e}") from e
        if doc.get("version") != STATE_VERSION:
            raise ConfigError(f"{wd / STATE_FILE}: unknown format version {doc.get('version')}")
        bd = doc["binaries"]
        binaries = bins.Binaries(
            etcd=Path(bd["etcd"]),
            kube_apiserver=Path(bd["kube_apiserver"]),
            kube_controller_manager=Path(bd["kube_controller_manager"]),
            kube_scheduler=Path(bd["kube_scheduler"]),
            kubectl=Path(bd["kubectl"]),
            kwok=Path(bd["kwok"]),
            helm=Path(bd["helm"]) if bd.get("helm") else None,
        )
        stack = cls(
            wd,
            controllers=bool(doc["controllers"]),
            scheduler=bool(doc["scheduler"]),
            kwok=bool(doc["kwok"]),
            binaries=binaries,
        )
        stack.ports = {str(k): int(v) for k, v in doc["ports"].items()}
        for name, d in doc["processes"].items():
            stack._procs[name] = ChildProcess.from_state(name, d)
        return stack

    # ---------------------------------------------------------------- misc

    def describe(self) -> Iterator[str]:
        """One line per component: pid, state, port, log."""
        for name in COMPONENTS:
            p = self._procs.get(name)
            if p is None or p.pid is None:
                continue
            port = f" port {self.ports[name]}" if name in self.ports else ""
            state = "running" if p.running() else "gone"
            yield f"{name:24s} pid {p.pid:<7d} {state:8s}{port}  log {p.log}"

    def client_ca(self) -> CertificateAuthority:
        """The CA kube-apiserver trusts for client certificates."""
        return self._pki.client_ca()
