"""The processes this test session started, found and stopped (issue 22 item 10).

Every process a test starts must be stopped when the test ends, on failure too; the session
ends with a check (``tests/conftest.py``) that fails the suite when one is still running.
"Started by this session" is decided without names, so other test runs on a shared machine
(another worktree's daemons, stacks, agents) can never be mistaken for ours:

* the pytest process makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``):
  a process whose parent exits is re-parented to pytest instead of to init, so everything the
  session starts stays in its process tree, however it detaches (a new session, a double
  fork, ``unshare --fork``, ``chroot``);
* every process inherits :data:`MARKER` with a token unique to the session, which catches a
  process that left the tree anyway (a test that handed its children a copy of the
  environment keeps it; one that gave an explicit environment is still in the tree).

:func:`leftovers` lists the session's processes that are still alive (zombies are exited:
they do not count), :func:`stop` ends them (SIGTERM to each, then SIGKILL past a deadline)
and reaps what is ours to reap. :func:`run_in_group` runs a command that starts processes of
its own in a process group of its own and ends the whole group, also on a timeout.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MARKER", "Leftover", "become_subreaper", "descendants", "end_group", "group_members",
           "leftovers", "run_in_group", "stop"]

#: The environment variable that carries the session's token to every process it starts.
MARKER = "HEALER_TEST_SESSION"
_PR_SET_CHILD_SUBREAPER = 36
_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class Leftover:
    pid: int
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid}: {self.command}"


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False if it cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid``; None when it is gone or unreadable."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()  # the command name may hold spaces and ')'
    return (fields[0], int(fields[1])) if len(fields) > 1 else None


def _pids() -> list[int]:
    return [int(p.name) for p in _PROC.iterdir() if p.name.isdigit()]


def _command(pid: int) -> str:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:300] or "?"


def _marked(pid: int, token: str) -> bool:
    try:
        env = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:  # another user's process, or gone
        return False
    return f"{MARKER}={token}".encode() in env.split(b"\0")


def descendants(root: int) -> dict[int, str]:
    """Every process below ``root`` in the process tree, with its state letter."""
    children: dict[int, list[tuple[int, str]]] = {}
    for pid in _pids():
        st = _stat(pid)
        if st is not None:
            children.setdefault(st[1], []).append((pid, st[0]))
    out: dict[int, str] = {}
    todo = [root]
    while todo:
        for pid, state in children.get(todo.pop(), []):
            if pid not in out:
                out[pid] = state
                todo.append(pid)
    return out


def leftovers(root: int, token: str, ignore: Iterable[int] = ()) -> list[Leftover]:
    """The session's processes still running: below ``root`` (the pytest process) or carrying
    ``token``; not ``root`` itself, not zombies, not ``ignore`` (pytest's own helpers)."""
    skip = {root, *ignore}
    alive = {pid for pid, state in descendants(root).items() if state not in ("Z", "X")}
    for pid in _pids():
        if pid not in skip and pid not in alive and _marked(pid, token):
            st = _stat(pid)
            if st is not None and st[0] not in ("Z", "X"):
                alive.add(pid)
    return [Leftover(pid, _command(pid)) for pid in sorted(alive - skip)]


def _reap(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def stop(found: Sequence[Leftover], deadline: float = 10.0) -> list[Leftover]:
    """SIGTERM each of ``found``, SIGKILL what is still running after ``deadline`` seconds;
    reap the ones that were re-parented to this process. Returns those that survived."""
    pids = [f.pid for f in found]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + deadline
    me = os.getpid()
    while True:
        _reap(p for p in pids if (_stat(p) or ("", 0))[1] == me)
        running = [p for p in pids if (_stat(p) or ("Z", 0))[0] not in ("Z", "X")]
        if not running:
            return []
        if time.monotonic() >= end:
            break
        time.sleep(0.05)
    for pid in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        _reap(p for p in running if (_stat(p) or ("", 0))[1] == me)
        running = [p for p in running if (_stat(p) or ("Z", 0))[0] not in ("Z", "X")]
        if not running:
            return []
        time.sleep(0.05)
    return [f for f in found if f.pid in running]


def end_group(proc: subprocess.Popen[bytes] | subprocess.Popen[str],
              grace: float = 20.0) -> None:
    """End ``proc``'s whole process group (it was started with ``start_new_session``):
    SIGTERM, then SIGKILL past ``grace`` seconds, until every member is gone."""
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    end = time.monotonic() + grace
    while group_members(pgid) and time.monotonic() < end:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    end = time.monotonic() + grace
    while group_members(pgid) and time.monotonic() < end:
        time.sleep(0.05)


def group_members(pgid: int) -> list[int]:
    """The living members of process group ``pgid``."""
    out = []
    for pid in _pids():
        try:
            raw = (_PROC / str(pid) / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(pid)
    return out


def run_in_group(argv: Sequence[str], *, timeout: float, cwd: Path | None = None,
                 env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True)`` in a process group of its
    own; on a timeout (or any exception) the whole group is ended, not only ``argv[0]``
    (``subprocess.run`` kills only its direct child: its children would run on)."""
    proc = subprocess.Popen(list(argv), cwd=cwd, env=None if env is None else dict(env),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        end_group(proc)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
