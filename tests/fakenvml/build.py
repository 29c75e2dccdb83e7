"""Build the fake ``libnvidia-ml.so.1`` and write its scenario files.

``build()`` compiles ``fakenvml.c`` with gcc into ``~/.cache/healer/fakenvml/<hash>/`` (or under
``$XDG_CACHE_HOME``, or a directory you pass), keyed by a hash of the source and the compiler
command, so a changed source is rebuilt and an unchanged one is reused. The build is atomic
(compile to a temporary name, then rename), so concurrent test processes can share the cache.

``write_scenario(path, scenario)`` turns a Python dict into the line format that the C code reads
(see README.md) and replaces the file atomically, so the library never sees half a file.

``nvml_env(lib_dir, scenario)`` returns the environment a subprocess must *start* with for
pynvml's ``CDLL("libnvidia-ml.so.1")`` to load the fake (glibc reads ``LD_LIBRARY_PATH`` at
process start-up only).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("fakenvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra")
LIBS = ("-lpthread",)
SCENARIO_ENV = "FAKENVML_SCENARIO"


class BuildError(RuntimeError):
    pass


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "healer" / "fakenvml"


def source_hash() -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(" ".join((*CFLAGS, *LIBS)).encode())
    return h.hexdigest()[:16]


def build(root: Path | None = None) -> Path:
    """Compile the fake if needed; return the directory that holds ``libnvidia-ml.so.1``."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise BuildError("gcc not found on PATH: the fake NVML library needs a C compiler")
    out_dir = (root or cache_root()) / source_hash()
    lib = out_dir / LIBRARY_NAME
    if lib.is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        cmd = [gcc, *CFLAGS, "-o", str(tmp), str(SOURCE), *LIBS]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BuildError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
        os.replace(tmp, lib)
    finally:
        tmp.unlink(missing_ok=True)
    return out_dir


def _flatten(prefix: str, value: Any) -> Iterator[tuple[str, str]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _flatten(f"{prefix}.{k}" if prefix else str(k), v)
    elif isinstance(value, bool):
        yield prefix, "1" if value else "0"
    elif value is None:
        return
    else:
        text = str(value)
        if "\n" in text:
            raise ValueError(f"{prefix}: a value cannot span lines: {text!r}")
        yield prefix, text


def _event_line(ev: Mapping[str, Any]) -> str:
    what = "lost" if ev.get("lost") else str(int(ev["xid"]))
    parts = ["event", str(int(ev["gpu"])), what]
    delay = ev.get("delay_ms")
    etype = ev.get("type")
    if delay is not None or etype is not None:
        parts.append(str(int(delay or 0)))
    if etype is not None:
        parts.append(hex(int(etype)))
    return " ".join(parts)


def scenario_lines(scenario: Mapping[str, Any]) -> list[str]:
    """The file's lines for a scenario dict.

    ``gpus`` is a list of per-GPU dicts (index = position; nested dicts are joined with dots:
    ``{"ecc": {"volatile": {"uncorrected": 1}}}`` is ``gpu.0.ecc.volatile.uncorrected 1``);
    ``events`` a list of ``{"gpu": i, "xid": n, "delay_ms": d, "type": mask}`` or
    ``{"gpu": i, "lost": True}``; every other key is written as is (``init.error``,
    ``driver``, ``fail: {fn: code}``...). ``gpu_count`` overrides the number of GPUs.
    """
    lines: list[str] = []
    gpus: Sequence[Mapping[str, Any]] = scenario.get("gpus", ())
    for key, value in scenario.items():
        if key in ("gpus", "events"):
            continue
        if key == "gpu_count":
            lines.append(f"gpus {int(value)}")
            continue
        lines.extend(f"{k} {v}" for k, v in _flatten(key, value))
    if "gpu_count" not in scenario:
        lines.append(f"gpus {len(gpus)}")
    for i, gpu in enumerate(gpus):
        lines.extend(f"{k} {v}" for k, v in _flatten(f"gpu.{i}", gpu))
    lines.extend(_event_line(ev) for ev in scenario.get("events", ()))
    return lines


def write_scenario(path: Path, scenario: Mapping[str, Any]) -> None:
    """Write ``scenario`` to ``path`` atomically (temporary file in the same folder + rename)."""
    text = "# fakenvml scenario (written by tests/fakenvml/build.py)\n"
    text += "\n".join(scenario_lines(scenario)) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def nvml_env(lib_dir: Path, scenario: Path | None,
             base: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment whose processes load the fake library (prepended to LD_LIBRARY_PATH)."""
    env = dict(os.environ if base is None else base)
    old = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = f"{lib_dir}{os.pathsep}{old}" if old else str(lib_dir)
    if scenario is None:
        env.pop(SCENARIO_ENV, None)
    else:
        env[SCENARIO_ENV] = str(scenario)
    return env
