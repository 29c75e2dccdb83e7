"""The local stack's child processes: each started in its own session (so its process group
can be stopped as a whole), logging to its own file, and recognised again after a restart of
the caller by pid and start time (a reused pid is not ours); stopped with SIGTERM, then SIGKILL.

Used by :class:`~healer_dev.devstack.kube.KubeStack` and
:class:`~healer_dev.devstack.operator.SlinkyOperator`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from healer.errors import ConfigError

__all__ = ["ChildProcess", "log_tail", "process_alive", "process_stat", "stop_all"]

_LOG_TAIL = 20


def log_tail(path: Path, lines: int = _LOG_TAIL) -> str:
    """The last ``lines`` lines of a log file ("" when it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def process_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process, from /proc; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def process_alive(pid: int, start_time: int | None) -> bool:
    """True while ``pid`` runs and is still the process we started (not a reused pid)."""
    st = process_stat(pid)
    if st is None:
        if not Path("/proc/self/stat").exists():  # no procfs: fall back to kill(0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return False
    state, started = st
    if state in ("Z", "X"):
        return False
    return start_time is None or started == start_time


@dataclass
class ChildProcess:
    """One child process: how to start it, where it logs, and (once started) who it is."""

    name: str
    argv: list[str]
    log: Path
    pid: int | None = None
    start_time: int | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    log_offset: int = field(default=0, compare=False)

    def spawn(self, cwd: Path, env: Mapping[str, str]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.log_offset = out.tell()
            out.write(f"---- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {self.name}\n".encode())
            out.flush()
            try:
                self.popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    env=dict(env),
                    start_new_session=True,
                )
            except OSError as e:
                raise ConfigError(f"cannot start {self.name} ({self.argv[0]}): {e}") from e
        self.pid = self.popen.pid
        st = process_stat(self.pid)
        self.start_time = st[1] if st else None

    def output_since_spawn(self) -> str:
        """What this run of the process logged (the log file is appended to across runs)."""
        try:
            with self.log.open("rb") as f:
                f.seek(self.log_offset)
                return f.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            return ""

    def running(self) -> bool:
        if self.pid is None:
            return False
        if self.popen is not None:
            return self.popen.poll() is None
        return process_alive(self.pid, self.start_time)

    def exit_code(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole process group (the child is its session leader)."""
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def wait(self, deadline: float) -> bool:
        """Wait until the process is gone or ``deadline`` (monotonic) passes; True when gone."""
        if self.pid is None:
            return True
        if self.popen is not None:
            try:
                self.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
            return True
        while process_alive(self.pid, self.start_time):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def forget(self) -> None:
        self.pid = None
        self.start_time = None
        self.popen = None

    def to_state(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "start_time": self.start_time,
            "argv": self.argv,
            "log": str(self.log),
        }

    @classmethod
    def from_state(cls, name: str, d: Mapping[str, Any]) -> ChildProcess:
        return cls(
            name=name,
            argv=[str(a) for a in d["argv"]],
            log=Path(d["log"]),
            pid=d.get("pid"),
            start_time=d.get("start_time"),
        )


def stop_all(procs: Sequence[ChildProcess], timeout: float) -> list[str]:
    """SIGTERM every process group, wait (shared deadline), SIGKILL what is left.

    Returns the names that needed SIGKILL.
    """
    live = [p for p in procs if p.running()]
    for p in live:
        p.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    killed = []
    for p in live:
        if not p.wait(deadline):
            killed.append(p.name)
            p.signal(signal.SIGKILL)
            p.wait(time.monotonic() + 10)
        # stragglers the leader may have left in its group
        p.signal(signal.SIGKILL)
    for p in procs:
        p.forget()
    return killed
