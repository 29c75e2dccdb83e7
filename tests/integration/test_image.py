"""The image ``make image`` builds (``healer_dev/image.py``, ADR 0011), inspected and started.

* its files: nothing of the dev side, no tests, no compilers or build tools, no package
  manager caches, no byte-code caches, no pip, no private keys; owned by root, not writable by
  the user it runs as;
* its config as ``skopeo`` reads it from the OCI layout: the non-root user, the entrypoint;
* its layer is a pure function of its files: packing the unpacked image again gives the same
  digest;
* its entrypoint started in a chroot (as the image's user, with the image's environment and
  nothing of the host's Python) as the controller against the local API server, and as the
  agent against the fake NVML library: both answer ``/readyz``, and both are gone when the
  test ends (their whole process group is ended, also when the test fails).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from healer.adapters.kube.store import ensure_crd
from healer_dev import image
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.net import free_port
from tests.fakenvml.build import build as build_fakenvml
from tests.fakenvml.build import write_scenario
from tests.integration.agent.agent_harness import create_gpu_node, scenario
from tests.integration.waiting import wait_for
from tests.processes import end_group, group_members

pytestmark = pytest.mark.timeout(600)  # a cold image build (make test builds it first: `image`)

#: paths (relative to /) the image must never hold
FORBIDDEN = [
    (r"(^|/)healer_dev(/|$)", "the dev side"),
    (r"site-packages/tests(/|$)", "tests"),
    (r"(^|/)__pycache__(/|$)|\.pyc$", "byte-code caches"),
    (r"^var/cache/apt/.+|^var/lib/apt/lists/.+", "apt caches"),
    (r"^root/\.cache(/|$)|^var/log/.+", "caches and logs"),
    (r"site-packages/pip(/|$)|^opt/healer/bin/pip", "pip"),
    (r"^usr/bin/(gcc|cc|c\+\+|g\+\+|make|ld|as|go|cargo|rustc|apt|apt-get)(-[0-9.]+)?$",
     "build tools or a package manager"),
    (r"^usr/lib/gcc(/|$)|^usr/include/.+|\.a$", "compiler files and static libraries"),
    (r"(^|/)\.git(/|$)|\.egg-info(/|$)", "source-control or build metadata"),
    (r"(^|/)(id_rsa|id_ed25519|munge\.key|jwt\.key|.*\.key)$|(^|/)kubeconfig$", "secrets"),
]
FORBIDDEN_PACKAGES = re.compile(
    r"^(gcc(-\d+)?|g\+\+.*|cpp.*|binutils.*|make|libc6-dev|python3(\.\d+)?-(dev|pip|venv)|apt|"
    r"slurm.*|munge)$")
PRIVATE_KEY = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----")


@pytest.fixture(scope="session")
def built() -> image.Image:
    try:
        return image.build()
    except image.ImageBuildError as e:
        pytest.fail(f"the image could not be built:\n{e}", pytrace=False)
    raise AssertionError("unreachable")


def _manifest(img: image.Image) -> dict[str, Any]:
    index = json.loads((img.layout / "index.json").read_text())
    (entry,) = index["manifests"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == img.tag
    return dict(json.loads(_blob(img, entry["digest"])))


def _blob(img: image.Image, digest: str) -> bytes:
    return (img.layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()


def _layer(img: image.Image) -> Path:
    (layer,) = _manifest(img)["layers"]
    digest: str = layer["digest"]
    return img.layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


def _config(img: image.Image) -> dict[str, Any]:
    return dict(json.loads(_blob(img, _manifest(img)["config"]["digest"]))["config"])


@pytest.fixture(scope="session")
def rootfs(built: image.Image, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's layer unpacked (numeric owners kept): what a runtime would start."""
    root = tmp_path_factory.mktemp("image") / "rootfs"
    root.mkdir()
    with tarfile.open(_layer(built), "r:gz") as tar:
        tar.extractall(root, numeric_owner=True, filter="fully_trusted")
    return root


def test_the_image_holds_no_dev_tooling_tests_caches_or_secrets(built: image.Image) -> None:
    found: list[str] = []
    writable: list[str] = []
    n = 0
    with tarfile.open(_layer(built), "r:gz") as tar:
        for m in tar:
            n += 1
            for pattern, what in FORBIDDEN:
                if re.search(pattern, m.name):
                    found.append(f"{m.name} ({what})")
            if m.name.startswith("opt/healer") and not m.issym() and (
                    m.uid != 0 or m.mode & 0o002):
                writable.append(m.name)
            if m.isreg() and m.size < 65536 and m.name.startswith(("etc/", "opt/", "root/")):
                fh = tar.extractfile(m)
                if fh is not None and PRIVATE_KEY.search(fh.read()):
                    found.append(f"{m.name} (a private key)")
    assert found == [], "the image holds:\n" + "\n".join(found[:50])
    assert writable == [], f"healer's files are writable by others: {writable[:10]}"
    packages = dict(ln.split(" ", 1) for ln in built.packages.read_text().splitlines())
    assert {"python3", "ca-certificates"} <= packages.keys()
    bad = sorted(p for p in packages if FORBIDDEN_PACKAGES.match(p))
    assert bad == [], f"the image carries packages it must not: {bad}"
    assert n > 1000, n
    print(f"{n} entries, {len(packages)} Debian packages, "
          f"{built.size / 1e6:.1f} MB compressed, {built.digest}")


def test_skopeo_reads_the_layout_and_the_tarball_non_root_user_and_entrypoint(
        built: image.Image) -> None:
    skopeo = shutil.which("skopeo")
    assert skopeo, "skopeo is missing: make deps (hack/install-system-deps.sh) installs it"
    proc = subprocess.run([skopeo, "inspect", f"oci:{built.layout}:{built.tag}"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["Digest"] == built.digest
    assert info["Architecture"] == "amd64"
    cfg = _config(built)
    assert cfg["User"] == f"{image.UID}:{image.UID}"
    assert cfg["Entrypoint"] == list(image.ENTRYPOINT)
    assert cfg["Cmd"] == list(image.CMD)
    # the tarball: the same image as an OCI archive (skopeo copy, docker load >= 25) and as the
    # docker-archive format older `docker load`s read (its manifest.json)
    def inspect(ref: str, *flags: str) -> dict[str, Any]:
        p = subprocess.run([skopeo, "inspect", *flags, ref], capture_output=True, text=True,
                           timeout=60, check=False)
        assert p.returncode == 0, f"skopeo inspect {ref}: {p.stderr}"
        return dict(json.loads(p.stdout))

    assert inspect(f"oci-archive:{built.tarball}:{built.tag}")["Digest"] == built.digest
    docker = inspect(f"docker-archive:{built.tarball}", "--config")["config"]
    assert (docker["User"], docker["Entrypoint"]) == (cfg["User"], cfg["Entrypoint"])


def test_packing_the_unpacked_image_again_gives_the_same_digest(
        built: image.Image, rootfs: Path, tmp_path: Path) -> None:
    epoch = json.loads((built.layout.parent / "image.json").read_text())["epoch"]
    digest = image.pack(rootfs, tmp_path / "oci", tmp_path / "img.tar", epoch, built.tag)
    assert digest == built.digest


@contextlib.contextmanager
def _started(img: image.Image, root: Path, mnt: Path, args: list[str], env: dict[str, str],
             log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The image's entrypoint in a chroot of ``root`` (its /dev and /proc mounted, ``mnt``
    bound on /mnt), as the image's user, with only the image's and ``env``'s variables."""
    cfg_env = dict(e.split("=", 1) for e in _config(img)["Env"])
    for p in mnt.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    mnt.chmod(0o755)
    script = ('set -e; mount --rbind /dev "$R/dev"; mount -t proc proc "$R/proc"; '
              'mount --bind "$M" "$R/mnt"; exec chroot --userspec="$U" "$R" "$@"')
    # --kill-child: the chroot'ed process dies with unshare; the group kill below ends both
    argv = ["unshare", "--mount", "--fork", "--kill-child", "sh", "-c", script, "sh",
            *image.ENTRYPOINT, *args]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={"R": str(root), "M": str(mnt), "U": f"{image.UID}:{image.UID}",
                 "PATH": os.environ["PATH"], **cfg_env, **env})
    try:
        yield proc
    finally:  # the whole group: SIGTERM to unshare alone left healer running in the chroot
        end_group(proc)


def _tail(log: Path) -> str:
    return log.read_text()[-4000:]


async def _ready(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    async def ok() -> bool:
        assert proc.poll() is None, f"exited {proc.returncode}:\n{_tail(log)}"
        async with aiohttp.ClientSession() as s, \
                s.get(f"http://127.0.0.1:{port}/readyz") as r:
            return r.status == 200

    try:
        await wait_for(ok, timeout=60, description=f"/readyz on {port}",
                       ignore=(aiohttp.ClientError,))
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{_tail(log)}") from e


async def test_the_controller_starts_from_the_image_against_the_api_server(
        built: image.Image, rootfs: Path, kube_stack: KubeStack, kube_api: client.ApiClient,
        namespace: str, tmp_path: Path) -> None:
    await ensure_crd(kube_api, install=True)  # what the chart's crds/ installs
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    shutil.copy(kube_stack.kubeconfig, mnt / "config")
    port = free_port()
    args = ["run", "--policies", "/etc/healer/policies", "--kubeconfig", "/mnt/config",
            "--no-leader-election", "--namespace", namespace, "--http-host", "127.0.0.1",
            "--http-port", str(port), "--log-format", "json"]
    log = tmp_path / "controller.log"
    with _started(built, rootfs, mnt, args, {}, log) as proc:
        await _ready(port, proc, log)
        assert proc.poll() is None
    assert group_members(proc.pid) == [], "the chroot'ed controller outlived the test"


async def test_the_agent_starts_from_the_image_on_the_fake_nvml(
        built: image.Image, rootfs: Path, kube_stack: KubeStack, kube_api: client.ApiClient,
        tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    (mnt / "nvml").mkdir(parents=True)
    shutil.copy(build_fakenvml() / "libnvidia-ml.so.1", mnt / "nvml" / "libnvidia-ml.so.1")
    write_scenario(mnt / "scenario", scenario(n=2))
    shutil.copy(kube_stack.kubeconfig, mnt / "config")
    node = f"image-gpu-{free_port()}"
    await create_gpu_node(kube_api, node)
    port = free_port()
    args = ["agent", "--interval", "0.5", "--heartbeat", "1", "--http-host", "127.0.0.1",
            "--http-port", str(port), "--log-format", "json"]
    env = {"KUBECONFIG": "/mnt/config", "NODE_NAME": node, "LD_LIBRARY_PATH": "/mnt/nvml",
           "FAKENVML_SCENARIO": "/mnt/scenario"}
    log = tmp_path / "agent.log"
    try:
        with _started(built, rootfs, mnt, args, env, log) as proc:
            await _ready(port, proc, log)
            core = client.CoreV1Api(kube_api)

            async def published() -> bool:
                n = await core.read_node(node)
                return any(c.type == "GPUHealthy" and c.status == "True"
                           for c in n.status.conditions or [])

            await wait_for(published, timeout=60, description=f"GPUHealthy on {node}")
        assert group_members(proc.pid) == [], "the chroot'ed agent outlived the test"
    finally:
        await client.CoreV1Api(kube_api).delete_node(node)
