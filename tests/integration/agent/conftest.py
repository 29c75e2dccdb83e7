"""Fixtures for the NVML agent tests: the fake libnvidia-ml and a probe subprocess.

pynvml loads ``libnvidia-ml.so.1`` with ctypes, and glibc reads ``LD_LIBRARY_PATH`` only when a
process starts, so the reader under test runs in a subprocess (``python -c PROBE``) started with
the fake's directory on ``LD_LIBRARY_PATH`` and ``FAKENVML_SCENARIO`` set. The probe prints one
JSON object per line; the test sends it commands on stdin (``watch``, ``read``, ``stop``).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.fakenvml.build import build, nvml_env, write_scenario

REPO = Path(__file__).resolve().parents[3]

PROBE = r'''
import asyncio, contextlib, json, sys, threading, time

LOCK = threading.Lock()


def emit(**kw):
    line = json.dumps(kw)
    with LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


async def main():
    timeout_ms, mode = int(sys.argv[1]), sys.argv[2]
    if "--absent-library" in sys.argv:
        # the real loading path, asked for a file name that exists nowhere
        import pynvml
        real_cdll = pynvml.CDLL
        pynvml.CDLL = lambda name, *a, **kw: real_cdll(
            name.replace("libnvidia-ml", "libnvidia-ml-absent"), *a, **kw)
    from healer.agent import NvmlReader, Thresholds, assess
    from healer.errors import ConfigError
    from healer.policy.catalog import default_catalog

    reader = NvmlReader(wait_timeout_ms=timeout_ms)
    try:
        reader.open()
    except ConfigError as e:
        emit(configError=str(e))
        return 3
    emit(opened=[g.to_dict() for g in reader.gpus], driver=reader.driver_version)
    events = []

    def on_event(ev):
        events.append(ev)
        emit(event=ev.to_dict(), received=time.time())

    async def consume():
        async with contextlib.aclosing(reader.events()) as stream:
            async for ev in stream:
                on_event(ev)

    task = None
    loop = asyncio.get_running_loop()
    while True:
        cmd = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if cmd == "watch":
            if mode == "async":
                task = asyncio.create_task(consume())
                while not reader.watching and not task.done():
                    await asyncio.sleep(0.001)
            else:
                reader.start_events(on_event)
            emit(watching=reader.watching, registered=reader.registered)
        elif cmd == "read":
            readings = await asyncio.to_thread(reader.read)
            a = assess(readings, list(events), default_catalog(), Thresholds(), time.time())
            emit(readings=[r.to_dict() for r in readings], assessment=a.to_dict())
        else:  # "stop", or the test closed our stdin
            t = time.monotonic()
            clean = await asyncio.to_thread(reader.stop)
            stop_s = time.monotonic() - t
            if task is not None:
                await task
            emit(stopped=clean, stop_s=stop_s)
            return 0


sys.exit(asyncio.run(main()))
'''


class Probe:
    """The reader under test in a subprocess; messages are parsed JSON lines."""

    def __init__(self, args: list[str], env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROBE, *args], cwd=REPO, env=dict(env),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.messages: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self._taken: set[int] = set()
        self._eof = False
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._pump_out, daemon=True),
                         threading.Thread(target=self._pump_err, daemon=True)]
        for t in self._threads:
            t.start()

    def _pump_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                msg = {"garbage": line}
            with self._cond:
                self.messages.append(msg)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def _diagnose(self) -> str:
        return (f"probe messages: {self.messages}\nprobe stderr:\n{''.join(self.stderr)}")

    def wait_for(self, key: str, timeout: float = 20.0) -> dict[str, Any]:
        """The next not yet taken message that has ``key`` (waiting up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i, msg in enumerate(self.messages):
                    if i not in self._taken and key in msg:
                        self._taken.add(i)
                        return msg
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    why = "exited" if self._eof else f"sent no {key!r} within {timeout} s"
                    raise AssertionError(f"probe {why}\n{self._diagnose()}")
                self._cond.wait(left)

    def request(self, command: str, key: str, timeout: float = 20.0) -> dict[str, Any]:
        self.send(command)
        return self.wait_for(key, timeout)

    def close(self) -> int:
        """Stop the probe (``stop``, then closing stdin); return its exit status."""
        with contextlib.suppress(OSError):  # BrokenPipeError: it has already exited
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(timeout=30)
        for t in self._threads:
            t.join(timeout=30)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(BrokenPipeError):
                    stream.close()
        return rc


class FakeNvml:
    """The built fake library, one scenario file, and the probes started against them."""

    def __init__(self, lib_dir: Path, workdir: Path) -> None:
        self.lib_dir = lib_dir
        self.workdir = workdir
        self.scenario_path = workdir / "scenario.txt"
        self._probes: list[Probe] = []

    def write(self, scenario: Mapping[str, Any]) -> float:
        """Write the scenario atomically; return the wall-clock time just before writing."""
        t0 = time.time()
        write_scenario(self.scenario_path, scenario)
        return t0

    def spawn(self, *, wait_timeout_ms: int = 250, mode: str = "async",
              lib_dir: Path | None = None, extra: tuple[str, ...] = ()) -> Probe:
        env = nvml_env(lib_dir or self.lib_dir, self.scenario_path)
        probe = Probe([str(wait_timeout_ms), mode, *extra], env)
        self._probes.append(probe)
        return probe

    def close(self) -> None:
        for p in self._probes:
            p.close()


@pytest.fixture(scope="session")
def fakenvml_dir() -> Path:
    return build()


@pytest.fixture
def fake_nvml(fakenvml_dir: Path, tmp_path: Path) -> Iterator[FakeNvml]:
    fake = FakeNvml(fakenvml_dir, tmp_path)
    yield fake
    fake.close()
