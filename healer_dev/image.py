"""The controller/agent image, built without a container engine (``make image``, ADR 0011).

The recipe (the constants below) is the one source of truth; ``Dockerfile`` says the same for
users with Docker and ``tests/unit/test_image_recipe.py`` keeps the two in step.

The build, all on this machine:

1. healer's wheel, built from a copy of the checkout (``pip wheel --no-deps``), and its runtime
   dependencies as PyPI wheels (``pip download --only-binary=:all:``), pinned to the versions in
   the development virtualenv (``pip freeze`` is the constraints file);
2. a root filesystem from Debian packages (``mmdebstrap --variant=essential``: only the
   Essential set plus :data:`PACKAGES`, no apt, no compilers, no docs, no package caches);
3. a customize hook that adds the non-root user, makes a venv at :data:`VENV` with Debian's
   python3 (``--without-pip``) and installs the wheels with a pip run from its own wheel
   (``--no-index``, ``--no-compile``), then removes the wheels and pip;
4. one layer packed by :func:`pack` (sorted entries, every mtime set to
   ``SOURCE_DATE_EPOCH``, numeric owners, gzip without a timestamp), its config, manifest and
   index: an OCI image layout, and the same layout as one tarball (with a ``manifest.json``, so
   ``docker load`` takes it too).

Everything lands under ``~/.cache/healer/image/<key>/``, keyed by a hash of the inputs (healer's
sources, the pinned wheels, this module, the default policy, and the Debian archive's Release
files as the host's ``apt-get update`` last saw them), so a second ``make image`` with the same
inputs is instant, and a rebuild gives the same digest.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# the recipe (Dockerfile says the same: tests/unit/test_image_recipe.py)

#: the Debian release the image is built from (its python3 is 3.11, healer's requires-python)
SUITE = "bookworm"
#: the archive: the release, its updates and its security fixes (what the host's apt sees)
SOURCES: tuple[str, ...] = (
    f"deb http://deb.debian.org/debian {SUITE} main",
    f"deb http://deb.debian.org/debian {SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {SUITE}-security main",
)
#: the Debian packages on top of the Essential set
PACKAGES: tuple[str, ...] = ("python3", "ca-certificates", "libstdc++6")
#: the non-root user the image runs as
UID = 65532
USER = "healer"
#: where healer and its dependencies are installed (a venv over Debian's python3)
VENV = "/opt/healer"
ENTRYPOINT: tuple[str, ...] = (f"{VENV}/bin/healer",)
CMD: tuple[str, ...] = ("run", "--policies", "/etc/healer/policies")
ENV: dict[str, str] = {
    "PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}
EXPOSE = 8080
#: the files copied into the image from the checkout: source → path in the image
FILES: dict[str, str] = {"policies/default.yaml": "/etc/healer/policies/default.yaml"}
#: the image's name as the chart's default image.repository and the tarball's tag
REPOSITORY = "ghcr.io/healer-project/healer"
#: dpkg path exclusions (documentation, manual pages, translations: nothing that runs)
DPKG_EXCLUDE: tuple[str, ...] = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*",
                                 "/usr/share/locale/*", "/usr/share/lintian/*")

# ---------------------------------------------------------------------------------------------


class ImageBuildError(RuntimeError):
    """A step of the build failed; the message says which and shows its output."""


@dataclass(frozen=True)
class Image:
    """A built image: its OCI layout, the tarball, its digest and what it holds."""

    layout: Path
    tarball: Path
    tag: str
    digest: str
    size: int
    packages: Path

    @property
    def ref(self) -> str:
        return f"{REPOSITORY}:{self.tag}"


def version() -> str:
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise ImageBuildError("no version in pyproject.toml")


def cache_root() -> Path:
    env = os.environ.get("HEALER_CACHE")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "healer") / "image"


def _run(argv: Sequence[str], what: str, **kw: object) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False,
                          **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise ImageBuildError(f"{what} failed ({proc.returncode}): {' '.join(argv)}\n"
                              f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return str(proc.stdout)


def _tree_hash(h: hashlib._Hash, base: Path, rel: str) -> None:
    root = base / rel
    paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()
                                                  and "__pycache__" not in p.parts)
    for p in paths:
        h.update(str(p.relative_to(base)).encode() + b"\0" + p.read_bytes() + b"\0")


def _archive_state() -> str:
    """The Debian archive as the host's last ``apt-get update`` saw it (its Release files)."""
    h = hashlib.sha256()
    lists = Path("/var/lib/apt/lists")
    for p in sorted(lists.glob("*Release")):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def constraints() -> str:
    """The versions of the development virtualenv: the wheels in the image are these."""
    out = _run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], "pip freeze")
    return "".join(line + "\n" for line in sorted(out.splitlines())
                   if "==" in line and not line.startswith("healer"))


def source_date_epoch() -> int:
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env:
        return int(env)
    # the newest commit of the image's inputs, so a rebuild of the same checkout matches
    proc = subprocess.run(["git", "log", "-1", "--format=%ct", "--", "healer", "pyproject.toml",
                           "policies/default.yaml", "healer_dev/image.py"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    return int(proc.stdout.strip() or "1700000000")


def input_key(pins: str, epoch: int) -> str:
    h = hashlib.sha256()
    for rel in ("healer", "pyproject.toml", "README.md", "healer_dev/image.py", *FILES):
        _tree_hash(h, ROOT, rel)
    h.update(pins.encode() + _archive_state().encode() + str(epoch).encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# step 1: the wheels


def wheels(work: Path, pins: str) -> Path:
    src, out = work / "src", work / "wheels"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    shutil.copytree(ROOT / "healer", src / "healer", ignore=ignore)
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / f, src / f)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "wheel", "--no-deps", "--quiet", str(src), "-w", str(out)], "healer's wheel")
    (wheel,) = out.glob("healer-*.whl")
    cfile = work / "constraints.txt"
    cfile.write_text(pins)
    dl = cache_root() / "wheels"
    # healer's own wheel never stays in the shared cache: pip would take a stale copy of the
    # same version (older dependencies) as already downloaded and resolve from it
    _drop_own_wheels(dl)
    _run([*pip, "download", "--quiet", "--only-binary=:all:", "-c", str(cfile), "-d", str(dl),
          str(wheel)], "the runtime dependencies' wheels")
    _drop_own_wheels(dl)
    pip_pin = next((p for p in pins.splitlines() if p.startswith("pip==")), "pip")
    _run([*pip, "download", "--quiet", "--only-binary=:all:", "--no-deps", "-d", str(dl),
          pip_pin], "pip's wheel")
    # only the wheels this resolution chose: resolve again offline into the build's own folder
    _run([*pip, "download", "--quiet", "--only-binary=:all:", "--no-index", "--find-links",
          str(dl), "-c", str(cfile), "-d", str(out), str(wheel)], "the wheel set")
    _run([*pip, "download", "--quiet", "--only-binary=:all:", "--no-index", "--no-deps",
          "--find-links", str(dl), "-d", str(work / "pip"), pip_pin], "pip's wheel")
    return out


def _drop_own_wheels(folder: Path) -> None:
    for own in folder.glob("healer-*.whl"):
        own.unlink()


# ---------------------------------------------------------------------------------------------
# step 2 and 3: the root filesystem


def _hook(work: Path) -> Path:
    """The customize hook (a script mmdebstrap runs with the root filesystem as $1)."""
    files = "\n".join(f'install -D -m 0644 "{ROOT / src}" "$1{dst}"' for src, dst in FILES.items())
    script = f"""#!/bin/sh
set -eu
echo '{USER}:x:{UID}:{UID}:healer:/nonexistent:/usr/sbin/nologin' >> "$1/etc/passwd"
echo '{USER}:x:{UID}:' >> "$1/etc/group"
echo '{USER}:*:19000:0:99999:7:::' >> "$1/etc/shadow"
mkdir -p "$1/tmp/wheels" "$1/tmp/pip"
cp "{work}"/wheels/*.whl "$1/tmp/wheels/"
cp "{work}"/pip/*.whl "$1/tmp/pip/pip.whl"
chroot "$1" /usr/bin/python3 -m venv --without-pip {VENV}
chroot "$1" {VENV}/bin/python /tmp/pip/pip.whl/pip install --quiet --no-index --no-compile \\
    --disable-pip-version-check --no-cache-dir --find-links /tmp/wheels healer
rm -rf "$1/tmp/wheels" "$1/tmp/pip"
{files}
# what only a package manager or a build needs, and every cache and log
rm -rf "$1/var/cache/"* "$1/var/lib/apt" "$1/var/log/"* "$1/root/.cache"
find "$1{VENV}" -name __pycache__ -prune -exec rm -rf {{}} +
find "$1{VENV}" -name direct_url.json -delete
rm -f "$1/etc/machine-id" "$1/var/lib/dbus/machine-id"
: > "$1/etc/machine-id"
"""
    hook = work / "customize.sh"
    hook.write_text(script)
    hook.chmod(0o755)
    return hook


def rootfs(work: Path, epoch: int) -> Path:
    target = work / "rootfs"
    argv = ["mmdebstrap", "--quiet", "--mode=root", "--variant=essential",
            f"--include={','.join(PACKAGES)}",
            *(f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDE),
            f"--customize-hook={_hook(work)} \"$1\"", SUITE, str(target), *SOURCES]
    _run(argv, "mmdebstrap", env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)})
    # Debian's own byte-code, written at install time, is the one thing that would differ
    # between two builds: Python compiles what it needs at start (and may not write it)
    for d in sorted(target.rglob("__pycache__")):
        shutil.rmtree(d)
    # mmdebstrap's own clean-up leaves apt's (empty) state behind: no apt runs in the image
    shutil.rmtree(target / "var" / "lib" / "apt", ignore_errors=True)
    for p in (target / "var" / "cache").glob("*"):
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    return target


def package_list(target: Path) -> str:
    return _run(["dpkg-query", f"--admindir={target}/var/lib/dpkg", "-W",
                 "-f=${Package} ${Version}\\n"], "dpkg-query")


# ---------------------------------------------------------------------------------------------
# step 4: the OCI image


def _entries(target: Path) -> Iterator[Path]:
    stack = [target]
    while stack:
        d = stack.pop()
        for p in sorted(d.iterdir(), reverse=True):
            yield p
            if p.is_dir() and not p.is_symlink():
                stack.append(p)


def layer_tar(target: Path, epoch: int) -> bytes:
    """The root filesystem as one tar: sorted, every mtime ``epoch``, numeric owners only."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(_entries(target), key=lambda q: str(q.relative_to(target))):
            info = tar.gettarinfo(str(p), arcname=str(p.relative_to(target)))
            info.mtime = epoch
            info.uname = info.gname = ""
            info.pax_headers = {}
            if info.isreg():
                with open(p, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue()


def _blob(layout: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return digest


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def image_config(epoch: int, diff_id: str, tag: str) -> dict[str, object]:
    from datetime import UTC, datetime

    created = datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "architecture": "amd64", "os": "linux", "created": created,
        "config": {
            "User": f"{UID}:{UID}",
            "Env": [f"{k}={v}" for k, v in ENV.items()],
            "Entrypoint": list(ENTRYPOINT), "Cmd": list(CMD),
            "ExposedPorts": {f"{EXPOSE}/tcp": {}}, "WorkingDir": "/",
            "Labels": {"org.opencontainers.image.title": "healer",
                       "org.opencontainers.image.version": tag,
                       "org.opencontainers.image.source": "healer_dev/image.py"},
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created": created,
                     "created_by": f"mmdebstrap {SUITE} {' '.join(PACKAGES)} + healer {tag}"}],
    }


def pack(target: Path, layout: Path, tarball: Path, epoch: int, tag: str) -> str:
    """Write the OCI layout and its tarball; return the manifest digest."""
    raw = layer_tar(target, epoch)
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=6) as z:
        z.write(raw)
    layer = gz.getvalue()
    layer_d = _blob(layout, layer)
    config = _json(image_config(epoch, hashlib.sha256(raw).hexdigest(), tag))
    config_d = _blob(layout, config)
    manifest = _json({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": f"sha256:{config_d}", "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": f"sha256:{layer_d}", "size": len(layer)}],
    })
    manifest_d = _blob(layout, manifest)
    index = _json({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": f"sha256:{manifest_d}", "size": len(manifest),
        "annotations": {"org.opencontainers.image.ref.name": tag,
                        "io.containerd.image.name": f"{REPOSITORY}:{tag}"}}]})
    (layout / "index.json").write_bytes(index)
    (layout / "oci-layout").write_bytes(_json({"imageLayoutVersion": "1.0.0"}))
    docker = _json([{"Config": f"blobs/sha256/{config_d}", "RepoTags": [f"{REPOSITORY}:{tag}"],
                     "Layers": [f"blobs/sha256/{layer_d}"]}])
    with tarfile.open(tarball, "w", format=tarfile.PAX_FORMAT) as tar:
        members = [("oci-layout", (layout / "oci-layout").read_bytes()), ("index.json", index),
                   ("manifest.json", docker),
                   *((f"blobs/sha256/{d}", (layout / "blobs" / "sha256" / d).read_bytes())
                     for d in sorted((config_d, layer_d, manifest_d)))]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), epoch, 0o644
            tar.addfile(info, io.BytesIO(data))
    return f"sha256:{manifest_d}"


# ---------------------------------------------------------------------------------------------


def build(*, force: bool = False, log: bool = True) -> Image:
    """Build the image if its inputs changed (else return the cached one)."""
    tag = version()
    pins, epoch = constraints(), source_date_epoch()
    out = cache_root() / input_key(pins, epoch)
    if not (out / "image.json").exists() or force:
        _build(out, pins, epoch, tag, log)
    meta = json.loads((out / "image.json").read_text())
    return Image(out / "oci", out / f"healer-{tag}.oci.tar", tag, meta["digest"],
                 meta["size"], out / "packages.txt")


def _build(out: Path, pins: str, epoch: int, tag: str, log: bool) -> None:
    for tool in ("mmdebstrap", "chroot"):
        if shutil.which(tool) is None:
            raise ImageBuildError(f"{tool} is missing: run `make deps` "
                                  "(hack/install-system-deps.sh installs it)")
    if os.geteuid() != 0:
        raise ImageBuildError("the image build runs mmdebstrap in root mode: run it as root")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="healer-image-", dir=out.parent) as tmp:
        work = Path(tmp)
        if log:
            print(f"[image] wheels (pinned to {sys.prefix}'s versions)", file=sys.stderr)
        wheels(work, pins)
        if log:
            print(f"[image] root filesystem: mmdebstrap {SUITE} + {', '.join(PACKAGES)}",
                  file=sys.stderr)
        target = rootfs(work, epoch)
        stage = work / "out"
        stage.mkdir()
        (stage / "packages.txt").write_text(package_list(target))
        (stage / "wheels.txt").write_text("".join(
            p.name + "\n" for p in sorted((work / "wheels").glob("*.whl"))))
        if log:
            print("[image] packing the OCI layout", file=sys.stderr)
        tarball = stage / f"healer-{tag}.oci.tar"
        digest = pack(target, stage / "oci", tarball, epoch, tag)
        size = sum(p.stat().st_size for p in (stage / "oci" / "blobs").rglob("*") if p.is_file())
        (stage / "image.json").write_text(json.dumps({"digest": digest, "size": size,
                                                      "epoch": epoch, "tag": tag}))
        if out.exists():
            shutil.rmtree(out)
        stage.rename(out)
    _prune(out.parent, keep=out)


#: how many built images the cache keeps (each ~110 MB: the layout and its tarball)
KEEP = 3


def _prune(cache: Path, keep: Path) -> None:
    """Drop all but the newest :data:`KEEP` builds (never ``keep``, the one just made)."""
    built = sorted((d for d in cache.iterdir() if (d / "image.json").exists() and d != keep),
                   key=lambda d: (d / "image.json").stat().st_mtime, reverse=True)
    for d in built[KEEP - 1:]:
        shutil.rmtree(d, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m healer_dev.image", description=__doc__)
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--out", type=Path, help="also copy the layout and tarball here")
    args = parser.parse_args(argv)
    try:
        img = build(force=args.force)
    except ImageBuildError as exc:
        print(f"make image: {exc}", file=sys.stderr)
        return 1
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(args.out / "oci", ignore_errors=True)
        shutil.copytree(img.layout, args.out / "oci")
        shutil.copy2(img.tarball, args.out / img.tarball.name)
    where = args.out or img.layout.parent
    print(f"{img.ref}  {img.digest}  {img.size / 1e6:.1f} MB compressed\n"
          f"  OCI layout: {where / 'oci'}:{img.tag}\n  tarball:    {where / img.tarball.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
