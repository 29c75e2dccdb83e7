"""Which Slurm the local cluster runs, and how it runs a Slurm other than the host's.

Three Slurm releases, each the real program from Debian (:class:`SlurmVersion`):

* **22.05**: the host's own packages (Debian 12, ``hack/install-system-deps.sh``);
* **24.11**: Debian 13 (trixie) in a root filesystem built by ``hack/build-slurm-roots.sh``;
* **26.05**: Debian unstable (sid), the same way; slurmrestd serves v0.0.42 .. v0.0.45, so
  SchedMD's slurm-operator (v0.0.44) talks to the real slurmrestd.

A root lives in ``~/.cache/healer/slurm-root/<suite>-<key>/`` (the script keys it by the
suite's Release file, the package list and its recipe). Its programs run by ``chroot`` in a
private mount namespace (ADR 0017): :func:`runner_script` writes a small ``sh`` script that
``unshare --mount``\\s, bind-mounts ``/proc``, ``/dev``, ``/sys``, the host's ``/etc/hosts`` and
the cluster's work directory at the same path into the root, then ``chroot``\\s and ``exec``\\s the
program: same PID (the caller kills it by PID), same network namespace (loopback is shared
with the rest of the stack), same paths (slurm.conf, sockets, logs, job scripts). Slurm clients
get one wrapper each (:func:`write_client_wrappers`) on the cluster's ``PATH``, so every caller
of ``scontrol`` — tests, the pod runtime's preStop, healer's scontrol driver — runs the root's.
"""

from __future__ import annotations

import enum
import functools
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from healer.errors import ConfigError
from healer_dev.devstack.binaries import cache_dir

__all__ = ["CLIENTS", "DEFAULT_SWITCHES", "MARKER", "SlurmRoot", "SlurmVersion", "ensure_root",
           "root_built", "runner_script", "topology_yaml", "write_client_wrappers"]

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "build-slurm-roots.sh"
#: the file at a root's top that says what it is (and, inside the chroot, that we are in it)
MARKER = ".healer-slurm-root"
#: the Slurm clients that get a wrapper (what tests, the pod runtime and healer run)
CLIENTS = ("scontrol", "sinfo", "squeue", "sbatch", "scancel", "srun", "sacct", "sdiag")
#: the ``default`` tree topology of a 26.05 cluster: switch -> its child switches. Dynamic
#: nodes join it by their topology string (``default:<switch>[:<switch>...]``, what topograph
#: writes and the operator pushes as ``topology_str``); Slurm refuses a switch it does not
#: know ("Requested topology configuration is not available").
DEFAULT_SWITCHES: Mapping[str, Sequence[str]] = {
    "spine1": ("leaf1", "leaf2", "leaf3", "leaf4"),
    "spine2": ("leaf5", "leaf6", "leaf7", "leaf8"),
    "s1": ("l1", "l2"), "nvl-a": (), "nvl-b": (), "nvl-c": (), "a": (), "b": (),
}


class SlurmVersion(enum.StrEnum):
    """The Slurm releases the local stack runs (each from Debian)."""

    V22_05 = "22.05"
    V24_11 = "24.11"
    V26_05 = "26.05"

    @property
    def suite(self) -> str | None:
        """The Debian suite of its root; None: the host's own packages."""
        return {"22.05": None, "24.11": "trixie", "26.05": "sid"}[self.value]

    @property
    def has_topology_str(self) -> bool:
        """Per-node topology strings (``Topology=``, ``topology_str``): Slurm >= 25.05."""
        return self is SlurmVersion.V26_05

    @property
    def restd_versions(self) -> tuple[str, ...]:
        """The slurmrestd OpenAPI versions it serves (data parsers), newest first."""
        return {"22.05": ("v0.0.38",),  # what LocalSlurm loads (-s openapi/v0.0.38)
                "24.11": ("v0.0.42", "v0.0.41", "v0.0.40"),
                "26.05": ("v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42")}[self.value]

    @classmethod
    def parse(cls, value: SlurmVersion | str) -> SlurmVersion:
        try:
            return cls(str(value))
        except ValueError:
            raise ConfigError(f"unknown Slurm version {value!r} (the local stack runs "
                              f"{', '.join(v.value for v in cls)})") from None


@dataclass(frozen=True)
class SlurmRoot:
    """A built root filesystem: where it is, its suite and its exact Slurm release."""

    path: Path
    suite: str
    release: str  # e.g. "26.05.5"

    def uid(self, user: str) -> int:
        """``user``'s uid in the root's /etc/passwd (files owned by SlurmUser use it)."""
        for line in (self.path / "etc" / "passwd").read_text().splitlines():
            parts = line.split(":")
            if len(parts) > 3 and parts[0] == user:
                return int(parts[2])
        raise ConfigError(f"the {self.suite} Slurm root has no user {user!r}")


def _read_marker(path: Path) -> dict[str, str]:
    try:
        text = (path / MARKER).read_text()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def root_built(version: SlurmVersion) -> bool:
    """Whether a root of ``version`` is in the cache (it may still be rebuilt if the archive
    changed): a cold build prints a word first."""
    suite = version.suite
    return suite is None or (cache_dir() / "slurm-root" / suite / MARKER).is_file()


@functools.cache
def ensure_root(version: SlurmVersion) -> SlurmRoot:
    """The root of ``version`` (24.11 or 26.05), built first when it is missing or the
    archive changed (``hack/build-slurm-roots.sh``; a warm cache answers in well under a
    second). Once per process."""
    suite = version.suite
    if suite is None:
        raise ConfigError(f"Slurm {version} runs from the host's packages, not from a root")
    env = {**os.environ, "SLURM_ROOTS": suite, "HEALER_CACHE": str(cache_dir())}
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, check=False)
    lines = [ln.split(" ", 1) for ln in proc.stdout.splitlines() if ln.startswith(suite + " ")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.splitlines()[-20:])
        raise ConfigError(f"{BUILD_SCRIPT.name} could not provide the {suite} root for Slurm "
                          f"{version} (exit {proc.returncode}):\n{tail}")
    path = Path(lines[-1][1].strip())
    info = _read_marker(path)
    release = info.get("slurm", "")
    if not release.startswith(version.value):
        raise ConfigError(f"the {suite} root in {path} has Slurm {release or '?'}, not "
                          f"{version}: the Debian archive moved on; pin the version here")
    for tool in ("unshare", "chroot", "mount"):
        if shutil.which(tool) is None:
            raise ConfigError(f"running Slurm {version} from its root needs {tool} "
                              "(util-linux, coreutils) on the host")
    return SlurmRoot(path, suite, release)


def runner_script(root: Path, binds: Sequence[Path]) -> str:
    """An ``sh`` script that runs ``"$@"`` (an absolute path inside the root) in ``root``:
    a private mount namespace with ``/proc``, ``/dev``, ``/sys``, ``/etc/hosts`` and each of
    ``binds`` mounted at the same path, then chroot, then the caller's working directory.
    Already inside a root (a job script calling ``scontrol``), it just runs the program."""
    r = shlex.quote(str(root))
    mounts = [f'mount --rbind /{d} "$R/{d}"' for d in ("proc", "dev", "sys")]
    mounts.append('mount --bind /etc/hosts "$R/etc/hosts"')
    mounts += [f'mount --bind {shlex.quote(str(b))} "$R"{shlex.quote(str(b))}' for b in binds]
    inner = "set -e\nR=$1; D=$2; shift 2\n" + "\n".join(mounts) + \
        '\nexec chroot "$R" /bin/sh -c \'cd "$0" 2>/dev/null || cd /; exec "$@"\' "$D" "$@"\n'
    return ("#!/bin/sh\n"
            "# written by healer_dev.devstack.slurm_root: run a program of a Slurm root "
            "(ADR 0017)\n"
            f'[ -e /{MARKER} ] && exec "$@"\n'
            "exec unshare --mount --propagation private -- /bin/sh -c "
            f'{shlex.quote(inner)} inroot {r} "$PWD" "$@"\n')


def write_client_wrappers(directory: Path, runner: Path) -> None:
    """One executable per Slurm client in ``directory`` that runs the root's client."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in CLIENTS:
        path = directory / name
        path.write_text(f'#!/bin/sh\nexec {shlex.quote(str(runner))} /usr/bin/{name} "$@"\n')
        path.chmod(0o755)


def topology_yaml(switches: Mapping[str, Sequence[str]]) -> str:
    """topology.yaml with one tree topology named ``default`` (the cluster's default)."""
    if not switches:
        raise ConfigError("a topology needs at least one switch")
    lines = ["# written by healer_dev.devstack.slurm_root", "- topology: default",
             "  cluster_default: true", "  tree:", "    switches:"]
    every = dict(switches)
    for children in switches.values():  # a child switch needs an entry of its own
        for c in children:
            every.setdefault(c, ())
    for name, children in every.items():
        lines.append(f"      - switch: {name}")
        if children:
            lines.append(f"        children: {','.join(children)}")
    return "\n".join(lines) + "\n"
