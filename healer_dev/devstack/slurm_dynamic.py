"""Helpers for :class:`~healer_dev.devstack.slurm.LocalSlurm`'s dynamic nodes (``slurmd -Z``).

Slurm 22.05 dynamic nodes register themselves (``slurmd -Z --conf "CPUs=… Features=…"``) when
slurm.conf has ``MaxNodeCount`` (and ``TreeWidth=65533``: the fan-out cannot route to them) and
the partition is ``Nodes=ALL``. slurmctld records such a node's address from the source address
of its registration and always talks to it on the global ``SlurmdPort``, so two dynamic slurmds
on one host collide. The devstack gives every dynamic slurmd its own loopback "pod IP"
(127.0.0.N) with ``podip.c``, an LD_PRELOAD library standing in for pod networking: it is compiled
here with ``gcc`` on first use into ``~/.cache/healer/podip/<sha256 of the source>.so``.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from healer.errors import ConfigError

__all__ = ["PODIP_SOURCE", "dynamic_conf_lines", "kill_processes_with_env", "podip_library",
           "validate_pod_ip"]

PODIP_SOURCE = Path(__file__).with_name("podip.c")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "healer" / "podip"


def podip_library(cache_dir: Path | None = None, *, source: Path = PODIP_SOURCE) -> Path:
    """The compiled pod-IP library (built with gcc once per source version; atomic rename)."""
    code = source.read_bytes()
    cache = cache_dir or default_cache_dir()
    lib = cache / f"{hashlib.sha256(code).hexdigest()}.so"
    if lib.exists():
        return lib
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise ConfigError(f"dynamic slurmd nodes need a C compiler to build {source.name} "
                          "(the pod-IP LD_PRELOAD library): install gcc (Debian: apt-get install "
                          "gcc libc6-dev)")
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".podip-", suffix=".so", dir=cache)
    os.close(fd)
    try:
        r = subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-o", tmp, str(source), "-ldl"],
                           capture_output=True, text=True, timeout=120, check=False)
        if r.returncode != 0:
            raise ConfigError(f"building {source} with {gcc} failed ({r.returncode}):\n"
                              f"{(r.stderr or r.stdout).strip()}")
        os.replace(tmp, lib)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return lib


def validate_pod_ip(pod_ip: str) -> str:
    """``pod_ip`` if it is a loopback IPv4 address other than 127.0.0.1 (slurmctld's)."""
    try:
        ip = ipaddress.IPv4Address(pod_ip)
    except ValueError as e:
        raise ConfigError(f"pod IP {pod_ip!r} is not an IPv4 address") from e
    if not ip.is_loopback or ip == ipaddress.IPv4Address("127.0.0.1") or str(ip).endswith(
            (".0", ".255")):
        raise ConfigError(f"pod IP {pod_ip} must be in 127.0.0.0/8, not 127.0.0.1, "
                          "not a .0/.255 address")
    return str(ip)


def dynamic_conf_lines(static_nodes: int, max_dynamic_nodes: int) -> list[str]:
    """slurm.conf lines that allow ``max_dynamic_nodes`` dynamic nodes next to the static."""
    return [f"MaxNodeCount={static_nodes + max_dynamic_nodes}", "TreeWidth=65533"]


def kill_processes_with_env(required: bytes, any_of: Iterable[bytes]) -> int:
    """SIGKILL every process whose environment holds ``required`` and one of ``any_of``
    (``KEY=value`` entries); the number killed. For slurmstepds and job processes of one
    dynamic node: slurmstepd starts its own session, so killing slurmd's group misses it."""
    wanted = set(any_of)
    me = os.getpid()
    killed = 0
    proc = Path("/proc")
    if not proc.is_dir():
        return 0
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if required in environ and environ & wanted:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed
