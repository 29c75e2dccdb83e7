"""The session-end check for processes the tests leave running (tests/processes.py, issue 22
item 10): it finds what this session started however it detached (a double fork into a new
session), never a process it did not start, and ends a command's whole process group."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.processes import MARKER, descendants, leftovers, run_in_group, stop

DETACH = ("import os, sys, time\n"
          "pid = os.fork()\n"
          "if pid == 0:\n"
          "    os.setsid()\n"
          "    os.close(1)\n"
          "    os.close(2)\n"
          "    time.sleep(300)\n"
          "else:\n"
          "    print(pid)\n")


def _token() -> str:
    return os.environ[MARKER]  # set by the session fixture in tests/conftest.py


def test_a_double_forked_process_in_a_new_session_is_found_and_stopped() -> None:
    out = subprocess.run([sys.executable, "-c", DETACH], capture_output=True, text=True,
                         timeout=60, check=True)
    orphan = int(out.stdout.strip())
    found = leftovers(os.getpid(), _token())
    assert orphan in [f.pid for f in found], found  # re-parented to us: still in our tree
    mine = [f for f in found if f.pid == orphan]
    assert "time.sleep(300)" in mine[0].command or "python" in mine[0].command
    assert stop(mine) == []
    assert orphan not in [f.pid for f in leftovers(os.getpid(), _token())]


def test_processes_it_did_not_start_are_never_listed() -> None:
    found = {f.pid for f in leftovers(os.getpid(), _token())}
    assert 1 not in found
    assert os.getppid() not in found  # whoever started pytest
    assert os.getpid() not in found
    # another session's token marks nothing of ours, and our tree is ours whatever its token
    assert {f.pid for f in leftovers(os.getpid(), "another-session")} == found
    assert all(pid != 1 for pid in descendants(os.getpid()))


def test_run_in_group_ends_the_whole_group_on_a_timeout() -> None:
    before = set(descendants(os.getpid()))
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_group(["sh", "-c", "sleep 300 & sleep 300 & wait"], timeout=1)
    assert time.monotonic() - started < 120  # a deadline for the test, not a timing claim
    alive = {p for p, state in descendants(os.getpid()).items() if state not in ("Z", "X")}
    assert alive <= before, f"left running: {alive - before}"
