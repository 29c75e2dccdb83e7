"""Find the control-plane binaries that ``hack/build-k8s.sh`` builds from the Go module proxy.

The cache layout is the script's: ``$HEALER_CACHE/bin/<component>-<version>/<binary>``, with
``HEALER_CACHE`` defaulting to ``~/.cache/healer``. The versions below are the script's
defaults and are passed to it explicitly, so the two can never disagree about what to build.
When a binary is missing, :func:`ensure` runs the script (a warm cache returns at once; a
cold one takes minutes) and raises :class:`~healer.errors.ConfigError` with the tail of its
stderr when the build fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from healer.errors import ConfigError

ETCD_VERSION = "v3.6.16"
KUBE_VERSION = "v1.36.3"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"

#: component (the script's ``ONLY`` word) -> (version, binaries it provides)
COMPONENTS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "etcd": (ETCD_VERSION, ("etcd", "etcdctl")),
    "kube": (
        KUBE_VERSION,
        ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"),
    ),
    "kwok": (KWOK_VERSION, ("kwok",)),
    "helm": (HELM_VERSION, ("helm",)),
}

#: what the local control plane needs
CONTROL_PLANE = ("etcd", "kube", "kwok")

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "build-k8s.sh"

_VERSION_ENV = {
    "etcd": "ETCD_VERSION",
    "kube": "KUBE_VERSION",
    "kwok": "KWOK_VERSION",
    "helm": "HELM_VERSION",
}


def cache_dir() -> Path:
    """``$HEALER_CACHE``, or ``~/.cache/healer``."""
    env = os.environ.get("HEALER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "healer"


def component_dir(component: str) -> Path:
    """The cache directory of one component, e.g. ``~/.cache/healer/bin/kube-v1.36.3``."""
    try:
        version, _ = COMPONENTS[component]
    except KeyError:
        raise ConfigError(
            f"unknown control-plane component {component!r} (known: {', '.join(COMPONENTS)})"
        ) from None
    return cache_dir() / "bin" / f"{component}-{version}"


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def missing(components: Iterable[str] = CONTROL_PLANE) -> list[str]:
    """The components with at least one binary absent from the cache."""
    out = []
    for c in components:
        d = component_dir(c)
        if not all(_executable(d / b) for b in COMPONENTS[c][1]):
            out.append(c)
    return out


@dataclass(frozen=True, slots=True)
class Binaries:
    """Absolute paths of the cached binaries (``helm`` only when it was asked for)."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path
    helm: Path | None = None

    def dirs(self) -> list[Path]:
        """The directories to put on ``PATH`` (kube first, so ``kubectl`` is the built one)."""
        out: list[Path] = []
        for p in (self.kubectl, self.etcd, self.kwok, self.helm):
            if p is not None and p.parent not in out:
                out.append(p.parent)
        return out


def build(components: Iterable[str] = CONTROL_PLANE, *, echo: bool = False) -> None:
    """Run ``hack/build-k8s.sh`` for ``components``; :class:`ConfigError` when it fails.

    ``echo`` copies the script's progress lines to our stderr as they come (a cold build takes
    minutes and should not look hung).
    """
    comps = list(components)
    if not BUILD_SCRIPT.is_file():
        raise ConfigError(f"control-plane binaries are missing and {BUILD_SCRIPT} is absent")
    env = dict(os.environ)
    env["ONLY"] = " ".join(comps)
    for c in comps:
        env[_VERSION_ENV[c]] = COMPONENTS[c][0]
    env["HEALER_CACHE"] = str(cache_dir())
    try:
        proc = subprocess.Popen(
            ["bash", str(BUILD_SCRIPT)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    except OSError as e:
        raise ConfigError(f"cannot run {BUILD_SCRIPT}: {e}") from e
    tail: list[str] = []
    assert proc.stderr is not None
    with proc.stderr:
        for line in proc.stderr:
            tail.append(line.rstrip("\n"))
            del tail[:-30]
            if echo:
                print(line, end="", file=sys.stderr, flush=True)
    rc = proc.wait()
    if rc != 0:
        raise ConfigError(
            f"{BUILD_SCRIPT.name} (ONLY={' '.join(comps)}) failed with exit code {rc}; "
            "last lines of its stderr:\n" + "\n".join(tail[-20:])
        )
    still = missing(comps)
    if still:
        raise ConfigError(
            f"{BUILD_SCRIPT.name} succeeded but {', '.join(still)} is still missing "
            f"under {cache_dir() / 'bin'}"
        )


def ensure(*, helm: bool = False, build_missing: bool = True, echo: bool = False) -> Binaries:
    """The control-plane binaries, building the missing ones first (unless told not to)."""
    comps = [*CONTROL_PLANE, *(["helm"] if helm else [])]
    absent = missing(comps)
    if absent:
        if not build_missing:
            raise ConfigError(
                f"control-plane binaries missing for {', '.join(absent)} under "
                f"{cache_dir() / 'bin'}; run hack/build-k8s.sh"
            )
        build(absent, echo=echo)
    kube = component_dir("kube")
    return Binaries(
        etcd=component_dir("etcd") / "etcd",
        kube_apiserver=kube / "kube-apiserver",
        kube_controller_manager=kube / "kube-controller-manager",
        kube_scheduler=kube / "kube-scheduler",
        kubectl=kube / "kubectl",
        kwok=component_dir("kwok") / "kwok",
        helm=component_dir("helm") / "helm" if helm else None,
    )
