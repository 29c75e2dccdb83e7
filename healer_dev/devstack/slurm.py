"""A private, real Slurm cluster on loopback (22.05, 24.11 or 26.05), for tests and the demo.

One ``slurmctld`` and one ``slurmd -N <node>`` per node, each slurmd on its own port, all on
127.0.0.1, all in the foreground (``-D``) in their own session so every PID is known and a stop
can kill whatever they left behind. Optionally munged (``auth="munge"``) and slurmrestd
(``with_restd=True`` or :meth:`LocalSlurm.start_restd`: on a loopback TCP port, JWT auth;
22.05 serves ``openapi/v0.0.38``, 24.11 v0.0.40..42, 26.05 v0.0.42..45).

``version`` picks the Slurm (:class:`~healer_dev.devstack.slurm_root.SlurmVersion`): 22.05 is
the host's Debian 12 packages; 24.11 and 26.05 run every daemon and client from a Debian root
filesystem (:mod:`healer_dev.devstack.slurm_root`, ADR 0017) on the same loopback and paths.
What differs there: ``SlurmUser=slurm`` (the Slinky charts' user: a JWT for ``slurm`` may then
update nodes, as the operator's does), slurmrestd runs as ``nobody`` (newer slurmrestd refuses
root and SlurmUser), ``CgroupPlugin=disabled`` (Slurm >= 24.05), and on 26.05 a topology.yaml
with one tree topology ``default`` (:data:`~healer_dev.devstack.slurm_root.DEFAULT_SWITCHES`).

Follows the recipe verified on the CI machine kind (``local-infra.md`` section A):

* daemons run through links named ``slurmctld``/``slurmd``/``slurmstepd`` because Slurm checks
  argv[0] (started as ``slurmctld-wlm`` it never loads ``AuthAltTypes``, so no JWT);
* ``AuthAltTypes=auth/jwt`` with a fresh key, so ``scontrol token`` and slurmrestd work;
* GPUs are ``/dev/null`` symlinks named ``nvidiaN`` (GRES needs character devices);
* ``CommunicationParameters=NoInAddrAny,NoCtldInAddrAny``: nothing listens beyond 127.0.0.1;
* ``ReturnToService=2``: a restarted slurmd comes back ``idle`` on its own;
* ports are chosen free when :meth:`LocalSlurm.start` runs.

``max_dynamic_nodes > 0`` adds dynamic nodes (``slurmd -Z``, as Slinky's worker pods run it,
see :meth:`LocalSlurm.start_dynamic_slurmd` and :mod:`healer_dev.devstack.slurm_dynamic`).

Nothing here uses ``/etc/slurm`` or ``/etc/munge``; clients only need :meth:`LocalSlurm.env`.
Everything is synchronous (``subprocess``): it is a fixture, not part of the daemon.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from healer.adapters.slurm.parse import parse_node_line
from healer.errors import ConfigError
from healer.ports import SlurmNodeState
from healer_dev.devstack.net import LOOPBACK, free_ports, listening
from healer_dev.devstack.restd_log import RestdRequest, read_restd_log
from healer_dev.devstack.slurm_dynamic import (
    dynamic_conf_lines,
    kill_processes_with_env,
    podip_library,
    validate_pod_ip,
)
from healer_dev.devstack.slurm_root import (
    DEFAULT_SWITCHES,
    SlurmRoot,
    SlurmVersion,
    ensure_root,
    runner_script,
    topology_yaml,
    write_client_wrappers,
)

__all__ = ["LocalSlurm", "SlurmStartupError", "SlurmVersion"]

SBIN = Path("/usr/sbin")
POLL = 0.05
_NODE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


class SlurmStartupError(ConfigError):
    """A daemon of the local cluster did not come up (the message names it and its log)."""


@dataclass
class _Daemon:
    name: str  # "munged", "slurmctld", "slurmd gpu-0", "slurmrestd"
    argv: list[str]
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    _out: IO[bytes] | None = None
    #: every process group this daemon ever led (a killed slurmd leaves its slurmstepds there)
    pgids: list[int] = field(default_factory=list)

    def spawn(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._out = self.log.open("ab")
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT,
            env=self.env, start_new_session=True, close_fds=True,
        )
        self.pgids.append(self.proc.pid)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self) -> None:
        if self.alive:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)

    def reap(self, deadline: float) -> None:
        """Wait until the process exits (SIGKILL its session after ``deadline``), then kill
        whatever is left in its process group (slurmstepd and job processes)."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _killpg(self.proc.pid)
                self.proc.wait(timeout=5)
        for pgid in self.pgids:
            _killpg(pgid)
        self.pgids.clear()
        self.proc = None
        if self._out is not None:
            self._out.close()
            self._out = None


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(log is empty)"


class LocalSlurm:
    """A real Slurm cluster under ``workdir``: ``slurmctld`` + one ``slurmd`` per node.

    >>> with LocalSlurm(tmp) as slurm:               # doctest: +SKIP
    ...     job = slurm.submit("sleep 1", "gpu-1")
    ...     slurm.run(["scontrol", "show", "node", "gpu-1", "-o"])
    """

    def __init__(self, workdir: Path, nodes: Sequence[str] = ("gpu-0", "gpu-1", "gpu-2", "gpu-3"),
                 *, gpus_per_node: int = 8, auth: Literal["munge", "none"] = "munge",
                 with_restd: bool = False, cpus_per_node: int = 2,
                 start_timeout: float = 30.0, sbin: Path = SBIN,
                 max_dynamic_nodes: int = 0,
                 version: SlurmVersion | str = SlurmVersion.V22_05,
                 jwt_key: bytes | None = None, restd_port: int = 0,
                 topology: Mapping[str, Sequence[str]] | None = None) -> None:
        if not nodes and max_dynamic_nodes <= 0:
            raise ConfigError("LocalSlurm needs at least one node")
        bad = [n for n in nodes if not _NODE_NAME.match(n)]
        if bad or len(set(nodes)) != len(nodes):
            raise ConfigError(f"LocalSlurm node names must be unique and match "
                              f"{_NODE_NAME.pattern}: {list(nodes)}")
        if auth not in ("munge", "none"):
            raise ConfigError(f"LocalSlurm auth must be 'munge' or 'none', not {auth!r}")
        self.workdir = Path(workdir).resolve()
        self.version = SlurmVersion.parse(version)
        #: the root filesystem Slurm runs from (None: the host's 22.05); set by :meth:`start`
        self.root: SlurmRoot | None = None
        self.jwt_key = bytes(jwt_key) if jwt_key else os.urandom(32)
        #: the ``default`` tree topology (26.05 only): switch -> child switches
        self.topology = dict(topology if topology is not None else DEFAULT_SWITCHES)
        self.sbin = Path(sbin)  # where Debian puts slurmctld-wlm, slurmd-wlm, slurmrestd
        self.nodes = tuple(nodes)
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node
        self.auth = auth
        self.with_restd = with_restd
        self.start_timeout = start_timeout
        self.conf = self.workdir / "slurm.conf"
        self.logdir = self.workdir / "log"
        self.jobdir = self.workdir / "jobs"
        self.ctld_port = 0
        self.restd_port = restd_port  # 0: a free port, chosen at start
        self._node_ports: dict[str, int] = {}
        self._munged: _Daemon | None = None
        self._ctld: _Daemon | None = None
        self._slurmd: dict[str, _Daemon] = {}
        self._restd: _Daemon | None = None
        self.max_dynamic_nodes = max(0, max_dynamic_nodes)
        self.slurmd_port = 0  # the global SlurmdPort (where dynamic slurmds listen)
        self._dynamic: dict[str, _Daemon] = {}  # dynamic node name -> its slurmd
        self._jobs = 0
        self.timings: dict[str, float] = {}

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> LocalSlurm:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def restd_url(self) -> str:
        """``http://127.0.0.1:PORT`` of slurmrestd (with ``with_restd=True`` or after
        :meth:`start_restd`)."""
        if not self.with_restd:
            raise ConfigError("LocalSlurm was created without slurmrestd (with_restd=False)")
        return f"http://127.0.0.1:{self.restd_port}"

    @property
    def release(self) -> str:
        """The exact Slurm release, e.g. ``26.05.5`` (after :meth:`start`)."""
        if self.root is not None:
            return self.root.release
        r = subprocess.run([str(self.sbin / "slurmctld-wlm"), "-V"], capture_output=True,
                           text=True, check=False)
        return r.stdout.split()[-1] if r.returncode == 0 and r.stdout.split() else \
            self.version.value

    @property
    def slurm_user(self) -> str:
        """``SlurmUser``: ``root`` on 22.05 (as before), ``slurm`` from a root (Slinky's)."""
        return "root" if self.root is None else "slurm"

    def start(self) -> None:
        """Write the configuration, start every daemon, wait until every node is ``idle``."""
        t0 = time.monotonic()
        if self.version.suite is not None and self.root is None:
            self.root = ensure_root(self.version)
        self._check_binaries()
        try:
            self._write_config()
            if self.auth == "munge":
                self._start_munged()
            self.start_slurmctld()
            for node in self.nodes:
                self.start_slurmd(node, wait=False)
            self.wait_all_idle()
            if self.with_restd:
                self.start_restd()
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - t0

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every daemon in reverse start order, wait (SIGKILL its session after
        ``timeout``), and kill what is left in each daemon's process group. Idempotent."""
        t0 = time.monotonic()
        daemons = [d for d in (self._munged, self._ctld, *self._slurmd.values(),
                               *self._dynamic.values(), self._restd) if d is not None]
        for d in reversed(daemons):
            d.terminate()
        deadline = time.monotonic() + timeout
        for d in reversed(daemons):
            d.reap(deadline)
        self._munged = self._ctld = self._restd = None
        self._slurmd.clear()
        self._dynamic.clear()
        self._kill_leftovers()
        if self.root is not None:  # the empty mount point made in the shared root
            with contextlib.suppress(OSError):
                (self.root.path / self.workdir.relative_to("/")).rmdir()
        self.timings["stop"] = time.monotonic() - t0

    def restart_slurmctld(self) -> None:
        """Stop slurmctld (SIGTERM, it saves its state) and start it again with the same port."""
        self.stop_slurmctld()
        self.start_slurmctld()

    def stop_slurmctld(self, timeout: float = 10.0) -> None:
        if self._ctld is not None:
            self._ctld.terminate()
            self._ctld.reap(time.monotonic() + timeout)

    def start_slurmctld(self) -> None:
        """Start slurmctld (again) and wait until it answers ``scontrol ping``."""
        if self._ctld is None:
            self._ctld = _Daemon(
                "slurmctld", [*self._exe("slurmctld"), "-D", "-f", str(self.conf)],
                self.logdir / "slurmctld.stderr", self._daemon_env())
        if self._ctld.alive:
            return
        self._ctld.spawn()
        deadline = time.monotonic() + self.start_timeout
        while True:
            self._must_be_alive(self._ctld, self.logdir / "slurmctld.log")
            r = self.run(["scontrol", "ping"], check=False, timeout=10)
            if "is UP" in r.stdout:
                return
            if time.monotonic() > deadline:
                raise self._startup_error(self._ctld, self.logdir / "slurmctld.log",
                                          f"did not answer `scontrol ping` in "
                                          f"{self.start_timeout:.0f} s ({r.stdout.strip()})")
            time.sleep(POLL)

    def kill_slurmd(self, node: str, sig: int = signal.SIGKILL) -> None:
        """Kill ``node``'s slurmd (SIGKILL by default: it vanishes without telling slurmctld).
        Jobs already running there keep running under their slurmstepd."""
        d = self._slurmd.get(node)
        if d is None or d.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            d.proc.send_signal(sig)
        d.proc.wait(timeout=10)
        if d._out is not None:
            d._out.close()
            d._out = None
        d.proc = None

    def start_slurmd(self, node: str, *, wait: bool = True) -> None:
        """Start ``node``'s slurmd (again); with ``wait`` until it answers (``registered``)."""
        self._node(node)
        d = self._slurmd.get(node)
        if d is None:
            d = self._slurmd[node] = _Daemon(
                f"slurmd {node}",
                [*self._exe("slurmd"), "-D", "-f", str(self.conf), "-N", node,
                 "-d", self._stepd()],
                self.logdir / f"slurmd-{node}.stderr", self._daemon_env())
        if d.alive:
            return
        d.spawn()
        if wait:
            # listening on its port = started (slurmctld may not have noticed a kill yet, so
            # "registered" alone could be stale), then registered with slurmctld
            deadline = time.monotonic() + self.start_timeout
            while not listening(LOOPBACK, self._node_ports[node]):
                self._must_be_alive(d, self.logdir / f"slurmd-{node}.log")
                if time.monotonic() > deadline:
                    raise self._startup_error(
                        d, self.logdir / f"slurmd-{node}.log",
                        f"is not listening on 127.0.0.1:{self._node_ports[node]}")
                time.sleep(POLL / 5)
            self.wait_state(node, lambda s: s.registered and not s.down,
                            timeout=max(1.0, deadline - time.monotonic()))

    def start_dynamic_slurmd(self, name: str, *, pod_ip: str, conf: str,
                             wait: bool = True) -> None:
        """Start a dynamic node: ``slurmd -Z -N name --conf conf`` on loopback ``pod_ip``
        (``conf`` e.g. ``"CPUs=2 RealMemory=1000 Gres=gpu:h100:2 Features=a,b"``); with
        ``wait`` until it listens on ``pod_ip:SlurmdPort`` and is registered and not down."""
        if self.max_dynamic_nodes <= 0:
            raise ConfigError("LocalSlurm was created without dynamic nodes (max_dynamic_nodes)")
        if not _NODE_NAME.match(name) or name in self.nodes:
            raise ConfigError(f"dynamic node name {name!r} is invalid or a static node's")
        pod_ip = validate_pod_ip(pod_ip)
        d = self._dynamic.get(name)
        if d is not None and d.alive:
            if d.env.get("HEALER_POD_IP") != pod_ip:
                raise ConfigError(f"dynamic slurmd {name} already runs on "
                                  f"{d.env.get('HEALER_POD_IP')}, not {pod_ip}")
            return
        (self.workdir / "spool" / name).mkdir(parents=True, exist_ok=True)
        env = {**self._daemon_env(), "LD_PRELOAD": str(self._podip()), "HEALER_POD_IP": pod_ip}
        d = self._dynamic[name] = _Daemon(
            f"slurmd {name} (dynamic, {pod_ip})",
            [*self._exe("slurmd"), "-D", "-f", str(self.conf), "-Z", "-N", name,
             "--conf", conf, "-d", self._stepd()],
            self.logdir / f"slurmd-{name}.stderr", env)
        d.spawn()
        if wait:
            self._wait_dynamic_registered(d, name, pod_ip)

    def _wait_dynamic_registered(self, d: _Daemon, name: str, pod_ip: str) -> None:
        """Wait until dynamic slurmd ``d`` listens on ``pod_ip:SlurmdPort`` (a stale record of
        an earlier slurmd of that name proves nothing) and its node is registered and not down;
        SlurmStartupError with its log when it exits or the time is up."""
        log = self.logdir / f"slurmd-{name}.log"
        deadline = time.monotonic() + self.start_timeout
        while not listening(pod_ip, self.slurmd_port):
            self._must_be_alive(d, log)
            if time.monotonic() > deadline:
                raise self._startup_error(d, log, f"is not listening on {pod_ip}:"
                                                  f"{self.slurmd_port}")
            time.sleep(0.01)
        while True:
            self._must_be_alive(d, log)
            r = self.run(["scontrol", "show", "node", name, "-o"], check=False, timeout=10)
            if r.returncode == 0 and r.stdout.strip():
                st = parse_node_line(r.stdout.strip().splitlines()[0])
                if st.registered and not st.down:
                    return
            if time.monotonic() > deadline:
                raise self._startup_error(d, log, f"did not register in "
                                                  f"{self.start_timeout:.0f} s "
                                                  f"({(r.stdout or r.stderr).strip()})")
            time.sleep(0.05)

    def stop_dynamic_slurmd(self, name: str, timeout: float = 10.0) -> None:
        """Stop dynamic node ``name``'s slurmd (SIGTERM; SIGKILL its session after
        ``timeout``) and kill its slurmstepds and job processes. Slurm keeps the node's record
        (``scontrol delete nodename=…`` removes it). No-op when it does not run."""
        d = self._dynamic.pop(name, None)
        if d is None:
            return
        d.terminate()
        d.reap(time.monotonic() + timeout)
        kill_processes_with_env(f"SLURM_CONF={self.conf}".encode(), (
            f"HEALER_POD_IP={d.env['HEALER_POD_IP']}".encode(), f"SLURMD_NODENAME={name}".encode()))

    def signal_dynamic_slurmd(self, name: str, sig: int) -> bool:
        """Send ``sig`` to dynamic node ``name``'s slurmd and everything it started (its
        slurmstepds and their jobs: its process groups): SIGKILL as a node that lost power,
        SIGSTOP as one cut off (alive, silent), SIGCONT to let it answer again. False when no
        such slurmd runs."""
        d = self._dynamic.get(name)
        if d is None or not d.alive:
            return False
        for pgid in d.pgids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        if sig == signal.SIGKILL:  # the jobs' own process groups go with the power too
            kill_processes_with_env(f"SLURM_CONF={self.conf}".encode(), (
                f"HEALER_POD_IP={d.env['HEALER_POD_IP']}".encode(),
                f"SLURMD_NODENAME={name}".encode()))
        return True

    @property
    def dynamic_nodes(self) -> dict[str, str]:
        """Running dynamic slurmds: node name -> pod IP."""
        return {n: d.env["HEALER_POD_IP"] for n, d in self._dynamic.items() if d.alive}

    def reset(self, timeout: float = 30.0) -> None:
        """Back to a clean cluster between tests: every daemon running, no jobs, every node
        ``idle`` (drained/down nodes resumed)."""
        self.start_slurmctld()
        for node in self.nodes:
            self.start_slurmd(node, wait=False)
        jobs = self.run(["squeue", "-h", "-o", "%A"]).stdout.split()
        if jobs:
            self.run(["scancel", *jobs], check=False)
        deadline = time.monotonic() + timeout
        while self.run(["squeue", "-h", "-o", "%A"]).stdout.split():
            if time.monotonic() > deadline:
                raise ConfigError(f"jobs still queued {timeout} s after scancel")
            time.sleep(POLL)
        for node in (*self.nodes, *(n for n, d in self._dynamic.items() if d.alive)):
            st = self.node_state(node)
            if st.drain or st.down or "FAIL" in st.flags:
                self.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        self.wait_all_idle(max(1.0, deadline - time.monotonic()))

    def wait_all_idle(self, timeout: float | None = None) -> None:
        """Wait until ``sinfo`` shows every node exactly ``idle`` (no ``*``: responding)."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        states: dict[str, str] = {}
        while True:
            r = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, timeout=10)
            states = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
            if all(states.get(n) == "idle" for n in self.nodes):
                return
            for node in self.nodes:
                d = self._slurmd.get(node)
                if d is not None:
                    self._must_be_alive(d, self.logdir / f"slurmd-{node}.log")
            if self._ctld is not None:
                self._must_be_alive(self._ctld, self.logdir / "slurmctld.log")
            if time.monotonic() > deadline:
                bad = next((n for n in self.nodes if states.get(n) != "idle"), self.nodes[0])
                d = self._slurmd.get(bad)
                msg = f"node {bad} is {states.get(bad, 'missing')!r}, not 'idle', after " \
                      f"{timeout or self.start_timeout:.0f} s (sinfo: {states})"
                if d is None:
                    raise SlurmStartupError(msg)
                raise self._startup_error(d, self.logdir / f"slurmd-{bad}.log", msg)
            time.sleep(POLL)

    # -- clients ---------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """Environment for Slurm clients: ``SLURM_CONF`` and ``PATH`` (with /usr/sbin; from a
        root, the wrappers that run the root's clients come first)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMRESTD_"))}
        path = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        if "/usr/sbin" not in path.split(os.pathsep):
            path = f"{path}{os.pathsep}/usr/sbin"
        if self.version.suite is not None:
            path = f"{self.client_bindir}{os.pathsep}{path}"
        env["PATH"] = path
        env["SLURM_CONF"] = str(self.conf)
        return env

    @property
    def client_bindir(self) -> Path:
        """Where ``scontrol``, ``sinfo``, ... of this cluster's Slurm are: the wrappers into
        the root, or /usr/bin for the host's 22.05 (healer's ``ScontrolDriver(bindir=)``)."""
        return self.workdir / "clients" if self.version.suite is not None else Path("/usr/bin")

    def _daemon_env(self) -> dict[str, str]:
        """The daemons' environment: the clients' minus the wrappers (inside a root, jobs and
        scripts find the root's own programs)."""
        env = self.env()
        if self.root is not None:
            env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        return env

    def _exe(self, daemon: str) -> list[str]:
        """argv[0..] that runs ``daemon`` (slurmctld, slurmd, slurmrestd, munged) under its
        plain name: Slurm compares the program name (see the module docstring)."""
        if self.root is not None:
            return [str(self.workdir / "bin" / "inroot"), f"/usr/sbin/{daemon}"]
        if daemon in ("slurmctld", "slurmd", "slurmstepd"):
            return [str(self.workdir / "bin" / daemon)]
        if daemon == "munged":
            return [self._munged_bin() or "munged"]
        return [str(self.sbin / daemon)]

    def _stepd(self) -> str:
        return "/usr/sbin/slurmstepd" if self.root is not None else \
            str(self.workdir / "bin" / "slurmstepd")

    def _podip(self) -> Path:
        """The pod-IP library, copied into the work directory when slurmd runs in a root."""
        lib = podip_library()
        if self.root is None:
            return lib
        dest = self.workdir / "lib" / lib.name
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib, dest)
        return dest

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 30.0,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client with :meth:`env`; ``check`` raises ConfigError with its output."""
        full_env = self.env()
        if env:
            full_env.update(env)
        try:
            r = subprocess.run(list(argv), env=full_env, capture_output=True, text=True,
                               timeout=timeout, check=False)
        except subprocess.TimeoutExpired as e:
            raise ConfigError(f"`{shlex.join(argv)}` did not finish in {timeout} s") from e
        if check and r.returncode != 0:
            raise ConfigError(f"`{shlex.join(argv)}` exited {r.returncode}: "
                              f"{(r.stderr or r.stdout).strip()}")
        return r

    def token(self, user: str = "root", lifespan: int = 3600) -> str:
        """A JWT for ``user`` from ``scontrol token`` (slurmctld signs it with the jwt key)."""
        r = self.run(["scontrol", "token", f"username={user}", f"lifespan={lifespan}"])
        m = re.search(r"SLURM_JWT=(\S+)", r.stdout)
        if not m:
            raise ConfigError(f"`scontrol token` printed no SLURM_JWT: {r.stdout.strip()!r}")
        return m.group(1)

    def node_state(self, node: str) -> SlurmNodeState:
        self._node(node)
        r = self.run(["scontrol", "show", "node", node, "-o"])
        return parse_node_line(r.stdout.strip().splitlines()[0])

    def wait_state(self, node: str, predicate: Callable[[SlurmNodeState], bool],
                   timeout: float = 30.0) -> SlurmNodeState:
        """Poll ``scontrol show node`` until ``predicate(state)``; ConfigError on timeout."""
        deadline = time.monotonic() + timeout
        last: SlurmNodeState | str = "never read"
        while True:
            r = self.run(["scontrol", "show", "node", node, "-o"], check=False, timeout=10)
            if r.returncode == 0 and r.stdout.strip():
                last = parse_node_line(r.stdout.strip().splitlines()[0])
                if predicate(last):
                    return last
            else:
                last = (r.stderr or r.stdout).strip()
            if time.monotonic() > deadline:
                raise ConfigError(f"node {node} did not reach the expected state in {timeout} s;"
                                  f" last: {last}")
            time.sleep(POLL)

    def submit(self, script: str, node: str, *, name: str = "", gres: str = "gpu:h100:1",
               args: Iterable[str] = (), env: Mapping[str, str] | None = None) -> int:
        """``sbatch -w node --parsable`` a bash ``script`` (body only; ``#!/bin/bash`` and
        ``set -u`` are added). Output goes to ``jobs/<id>.out``; the job sees ``OUTDIR``
        = :attr:`jobdir` and can write marker files there. Returns the job id."""
        self._node(node)
        self.jobdir.mkdir(parents=True, exist_ok=True)
        self._jobs += 1
        path = self.jobdir / f"script-{self._jobs}.sh"
        path.write_text("#!/bin/bash\n" + script.strip() + "\n")
        path.chmod(0o755)
        argv = ["sbatch", "--parsable", "-w", node, "-J", name or f"job-{self._jobs}",
                "-o", str(self.jobdir / "%j.out"), "-D", str(self.jobdir)]
        if gres:
            argv.append(f"--gres={gres}")
        argv += [*args, str(path)]
        r = self.run(argv, env={"OUTDIR": str(self.jobdir), **(env or {})})
        return int(r.stdout.strip().split(";")[0])

    def job_state(self, job_id: int) -> str:
        """``JobState`` from ``scontrol show job`` ("" once slurmctld forgot the job)."""
        r = self.run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
        m = re.search(r"\bJobState=(\S+)", r.stdout)
        return m.group(1) if m else ""

    def wait_job(self, job_id: int, states: Iterable[str], timeout: float = 30.0) -> str:
        """Poll until job ``job_id`` is in one of ``states`` (e.g. RUNNING); returns it."""
        want = {s.upper() for s in states}
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job_id)
            if state in want:
                return state
            if time.monotonic() > deadline:
                raise ConfigError(f"job {job_id} is {state or 'gone'!r}, not one of "
                                  f"{sorted(want)}, after {timeout} s")
            time.sleep(POLL)

    def restd_requests(self) -> list[RestdRequest]:
        """Every request slurmrestd served (method, path, user header), from its own log."""
        return read_restd_log(self.logdir / "slurmrestd.log")

    def log(self, daemon: str = "slurmctld") -> str:
        """The log text of ``slurmctld``, ``slurmd-<node>``, ``munged`` or ``slurmrestd``."""
        path = self.logdir / f"{daemon}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- internals -------------------------------------------------------------------------

    def _node(self, node: str) -> None:
        if node not in self.nodes and node not in self._dynamic:
            raise ConfigError(f"unknown node {node!r}; this cluster has {', '.join(self.nodes)}")

    def _check_binaries(self) -> None:
        if self.root is not None:
            missing = [p for p in ("usr/sbin/slurmctld", "usr/sbin/slurmd", "usr/sbin/slurmrestd",
                                   "usr/sbin/munged", "usr/bin/scontrol",
                                   "usr/lib/x86_64-linux-gnu/slurm-wlm/auth_jwt.so")
                       if not (self.root.path / p).exists()]
            if missing:
                raise SlurmStartupError(f"the Slurm {self.root.release} root {self.root.path} "
                                        f"lacks {', '.join(missing)}; remove it and run "
                                        "hack/build-slurm-roots.sh")
            return
        need = ["slurmctld-wlm", "slurmd-wlm", "slurmstepd-wlm"]
        if self.with_restd:
            need.append("slurmrestd")
        missing = [b for b in need if not (self.sbin / b).exists()]
        for b in ("sinfo", "scontrol", "sbatch", "squeue", "scancel"):
            if shutil.which(b) is None:
                missing.append(b)
        if self.auth == "munge" and self._munged_bin() is None:
            missing.append("munged")
        if missing:
            raise SlurmStartupError(
                f"Slurm is not installed (missing {', '.join(missing)}); run "
                "hack/install-system-deps.sh (Debian: slurmctld slurmd slurm-client slurmrestd "
                "slurm-wlm-jwt-plugin munge)")

    def _munged_bin(self) -> str | None:
        return shutil.which("munged", path=os.pathsep.join((str(self.sbin), "/usr/sbin",
                                                           os.environ.get("PATH", ""))))

    def _write_config(self) -> None:
        w = self.workdir
        for sub in ("state", "log", "bin", "dev", "jobs", "spool"):
            (w / sub).mkdir(parents=True, exist_ok=True)
        w.chmod(0o711)  # munged refuses group/world-writable dirs; sockets need o+x
        if self.root is not None:
            runner = w / "bin" / "inroot"
            runner.write_text(runner_script(self.root.path, (w,)))
            runner.chmod(0o755)
            write_client_wrappers(self.client_bindir, runner)
            (self.root.path / w.relative_to("/")).mkdir(parents=True, exist_ok=True)
        else:
            # Slurm compares the program name with "slurmctld"/"slurmd": run through plain
            # names.
            for b in ("slurmctld", "slurmd", "slurmstepd"):
                link = w / "bin" / b
                link.unlink(missing_ok=True)
                link.symlink_to(self.sbin / f"{b}-wlm")
        for g in range(self.gpus_per_node):
            dev = w / "dev" / f"nvidia{g}"
            dev.unlink(missing_ok=True)
            dev.symlink_to("/dev/null")  # GRES files must be character devices
        key = w / "jwt.key"
        key.unlink(missing_ok=True)
        key.write_bytes(self.jwt_key)
        key.chmod(0o600)
        if self.root is not None:  # slurmctld runs as SlurmUser: its files are its own
            uid = self.root.uid("slurm")
            for p in (key, w / "state", self.logdir):
                os.chown(p, uid, uid)

        ports = free_ports(3 + len(self.nodes))
        self.ctld_port, slurmd_port, restd_port = ports[:3]
        self.restd_port = self.restd_port or restd_port
        self.slurmd_port = slurmd_port
        self._node_ports = dict(zip(self.nodes, ports[3:], strict=True))

        if self.auth == "munge":
            mkey = w / "munge.key"
            mkey.unlink(missing_ok=True)
            mkey.write_bytes(os.urandom(128))
            mkey.chmod(0o400)
            auth = f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={w}/munge.sock"
        else:
            auth = "AuthType=auth/none\nCredType=cred/none"
        gpus = f"gpu:h100:{self.gpus_per_node}"
        lines = [
            "# written by healer_dev.devstack.slurm.LocalSlurm",
            "ClusterName=healer",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
            f"SlurmUser={self.slurm_user}",
            "SlurmdUser=root",
            auth,
            "AuthAltTypes=auth/jwt",
            f"AuthAltParameters=jwt_key={key}",
            f"StateSaveLocation={w}/state",
            f"SlurmdSpoolDir={w}/spool/%n",
            f"SlurmctldPidFile={w}/slurmctld.pid",
            f"SlurmdPidFile={w}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.logdir}/slurmctld.log",
            f"SlurmdLogFile={self.logdir}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "SlurmctldTimeout=10",
            "SlurmdTimeout=10",
            "MessageTimeout=5",
            "SchedulerParameters=sched_interval=1",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "GresTypes=gpu",
        ]
        if self.max_dynamic_nodes:
            lines += dynamic_conf_lines(len(self.nodes), self.max_dynamic_nodes)
        if self.version.has_topology_str and self.topology:
            # nodes outside the tree (no topology string yet) still take jobs: the tree
            # shapes only the jobs that ask for --switches
            lines.append("TopologyParam=TopoOptional")
        for node in self.nodes:
            (w / "spool" / node).mkdir(parents=True, exist_ok=True)
            lines.append(f"NodeName={node} NodeHostname={node} NodeAddr=127.0.0.1 "
                         f"Port={self._node_ports[node]} CPUs={self.cpus_per_node} "
                         f"RealMemory=1000 Gres={gpus} State=UNKNOWN")
        members = "ALL" if self.max_dynamic_nodes else ",".join(self.nodes)
        lines.append(f"PartitionName=gpu Nodes={members} Default=YES "
                     "MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        last = self.gpus_per_node - 1
        files = f"{w}/dev/nvidia[0-{last}]" if last > 0 else f"{w}/dev/nvidia0"
        (w / "gres.conf").write_text(  # dynamic nodes: one line for every node
            f"Name=gpu Type=h100 File={files}\n" if self.max_dynamic_nodes else "".join(
                f"NodeName={n} Name=gpu Type=h100 File={files}\n" for n in self.nodes))
        # slurmd 22.05 always loads a cgroup plugin (even with proctrack/linuxproc +
        # task/none); autodetect picks v1 or v2 from /sys/fs/cgroup, IgnoreSystemd keeps it
        # off dbus. From 24.05 on the plugin can be off.
        (w / "cgroup.conf").write_text(
            "CgroupPlugin=autodetect\nIgnoreSystemd=yes\n" if self.root is None
            else "CgroupPlugin=disabled\n")
        topo = w / "topology.yaml"  # read from slurm.conf's directory when it exists
        topo.unlink(missing_ok=True)
        if self.version.has_topology_str and self.topology:
            topo.write_text(topology_yaml(self.topology))

    def _start_munged(self) -> None:
        w = self.workdir
        sock = w / "munge.sock"
        self._munged = _Daemon(
            "munged",
            [*self._exe("munged"), "-F", "--force",
             f"--socket={sock}", f"--key-file={w}/munge.key", f"--pid-file={w}/munged.pid",
             f"--log-file={self.logdir}/munged.log", f"--seed-file={w}/munged.seed"],
            self.logdir / "munged.stderr", self._daemon_env())
        self._munged.spawn()
        deadline = time.monotonic() + self.start_timeout
        while not sock.exists():
            self._must_be_alive(self._munged, self.logdir / "munged.log")
            if time.monotonic() > deadline:
                raise self._startup_error(self._munged, self.logdir / "munged.log",
                                          f"created no socket {sock}")
            time.sleep(POLL / 5)

    def start_restd(self, port: int | None = None) -> None:
        """Start slurmrestd (JWT auth) on 127.0.0.1:``port`` (default: the port chosen at
        start) and wait until it listens. 22.05 runs as root with ``disable_user_check``
        and ``openapi/v0.0.38``; 24.11 and 26.05 refuse root and SlurmUser, so they run as
        ``nobody`` and serve every data parser they have (``openapi/slurmctld``)."""
        if self._restd is not None and self._restd.alive:
            return
        if port:
            self.restd_port = port
        if self.restd_port and listening(LOOPBACK, self.restd_port):
            # it would fail to bind and the wait below would meet whatever listens there (a
            # slurmrestd left by a killed run answers "Unable to contact slurm controller")
            raise SlurmStartupError(
                f"slurmrestd cannot listen on 127.0.0.1:{self.restd_port}: something listens "
                f"there already (a slurmrestd left by a killed run?); stop it first, e.g. "
                f"fuser -k {self.restd_port}/tcp")
        self.with_restd = True
        env = self._daemon_env()
        env["SLURM_JWT"] = "daemon"
        if self.root is None:
            env["SLURMRESTD_SECURITY"] = "disable_user_check"
            args = ["-a", "rest_auth/jwt", "-s", "openapi/v0.0.38"]
        else:
            nobody = str(self.root.uid("nobody"))
            args = ["-u", nobody, "-g", nobody, "-a", "rest_auth/jwt", "-s", "openapi/slurmctld"]
        self._restd = _Daemon(
            "slurmrestd", [*self._exe("slurmrestd"), *args, f"127.0.0.1:{self.restd_port}"],
            self.logdir / "slurmrestd.log", env)
        self._restd.spawn()
        deadline = time.monotonic() + self.start_timeout
        while not listening(LOOPBACK, self.restd_port):
            self._must_be_alive(self._restd, self.logdir / "slurmrestd.log")
            if time.monotonic() > deadline:
                raise self._startup_error(self._restd, self.logdir / "slurmrestd.log",
                                          f"is not listening on 127.0.0.1:{self.restd_port}")
            time.sleep(POLL / 5)

    def stop_restd(self, timeout: float = 10.0) -> None:
        """Stop slurmrestd (SIGTERM; SIGKILL after ``timeout``). Idempotent."""
        if self._restd is not None:
            self._restd.terminate()
            self._restd.reap(time.monotonic() + timeout)
            self._restd = None

    def _kill_leftovers(self) -> None:
        """SIGKILL job processes and slurmstepds of this cluster that outlived their slurmd.

        slurmstepd starts its own session, so killing slurmd's process group misses it; every
        process of this cluster carries ``SLURM_CONF=<our slurm.conf>`` in its environment.
        """
        marker = f"SLURM_CONF={self.conf}".encode()
        me = os.getpid()
        proc = Path("/proc")
        if not proc.is_dir():
            return
        for entry in proc.iterdir():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry.name), signal.SIGKILL)

    def _must_be_alive(self, d: _Daemon, log: Path) -> None:
        if d.proc is not None and d.proc.poll() is not None:
            raise self._startup_error(d, log, f"exited with status {d.proc.returncode}")

    def _startup_error(self, d: _Daemon, log: Path, what: str) -> SlurmStartupError:
        parts = [f"{d.name} {what}"]
        for path in dict.fromkeys((log, d.log)):
            if path.exists():
                parts.append(f"--- {path.name} (last lines) ---\n{_tail(path)}")
        return SlurmStartupError("\n".join(parts))
