"""A healer daemon as a child process of a test: start it, wait for /readyz, read /metrics,
SIGTERM or kill -9 it (its whole process group). Shared by the daemon and flow tests; also
the kill -9 hooks their ``main`` modules install (:func:`crash_hooks`)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from healer.core.actions import Action
from healer.core.machine import Trigger
from healer.core.model import NodeRecord
from healer.ports import StateStore, StoredRecord
from healer.runtime.executor import ActionRunner
from tests.integration.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def spawn(cls, argv: Sequence[str], *, port: int, log: Path,
              env: Mapping[str, str] | None = None) -> Daemon:
        """Start ``argv`` in its own session from the repository root, output to ``log``."""
        env = {**(os.environ if env is None else env), "PYTHONPATH": str(ROOT)}
        with open(log, "ab") as out:
            proc = subprocess.Popen(list(argv), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        return cls(proc, port, log)

    def kill9(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self, timeout: float = 30) -> int:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            return -9

    def tail(self, n: int = 40) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    async def get(self, path: str) -> tuple[int, str]:
        try:
            async with aiohttp.ClientSession() as s, s.get(
                    f"http://127.0.0.1:{self.port}{path}",
                    timeout=aiohttp.ClientTimeout(total=10)) as r:
                return r.status, await r.text()
        except (aiohttp.ClientError, TimeoutError):
            return 0, ""

    async def ready(self, within: float = 90) -> float:
        """Wait for /readyz (failing at once if the daemon exits); returns the seconds since
        it was started."""
        async def ok() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.tail()}")
            return (await self.get("/readyz"))[0] == 200

        try:
            await wait_for(ok, timeout=within, interval=0.2, description="daemon /readyz")
        except TimeoutError as e:
            raise AssertionError(f"{e}; the daemon's log:\n{self.tail()}") from None
        return time.monotonic() - self.started

    async def metric(self, name: str, **labels: str) -> float | None:
        """The value of a series on /metrics: ``name`` with exactly ``labels`` (None when
        absent)."""
        status, text = await self.get("/metrics")
        if status != 200:
            return None
        for m in re.finditer(rf"^{re.escape(name)}(?:{{(.*)}})? (\S+)$", text, re.MULTILINE):
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
            if got == labels:
                return float(m.group(2))
        return None


class _AfterWrite:
    """A state store that calls ``hook`` with the record after every persisted write."""

    def __init__(self, store: StateStore, hook: Callable[[NodeRecord], None]) -> None:
        self.store, self.hook = store, hook

    async def list(self) -> list[StoredRecord]:
        return await self.store.list()

    async def save(self, record: NodeRecord, previous: StoredRecord | None) -> StoredRecord:
        out = await self.store.save(record, previous)
        self.hook(record)
        return out

    async def delete(self, name: str) -> None:
        await self.store.delete(name)


class _AfterAction:
    """An executor that calls ``hook`` with the action after it ran, before the controller
    persists its outcome."""

    def __init__(self, executor: ActionRunner, hook: Callable[[Action], None]) -> None:
        self.executor, self.hook = executor, hook

    async def run(self, action: Action, record: NodeRecord | None) -> list[Trigger]:
        out = await self.executor.run(action, record)
        self.hook(action)
        return out


def crash_hooks(crash_log: Path | None) -> dict[str, Any]:
    """``wrap_store``/``wrap_actions`` overrides for ``healer.app.run`` that kill -9 this very
    process at the first step boundary not yet listed in ``crash_log`` (and list it): right
    after a write that advanced the remediation, or right after a step's action ran, before
    its outcome was persisted. Started again and again, a daemon visits every boundary once.
    With no ``crash_log``: no hooks."""
    if crash_log is None:
        return {}
    log = crash_log

    def crash_once(point: str) -> None:
        seen = set(log.read_text().splitlines()) if log.exists() else set()
        if point in seen:
            return
        with open(log, "a") as f:
            f.write(point + "\n")
        os.kill(os.getpid(), signal.SIGKILL)

    def after_write(record: NodeRecord) -> None:
        steps = ",".join(f"{s.step}:{s.outcome.ledger_word if s.outcome else 'open'}"
                         for s in record.ledger)
        crash_once(f"write {record.phase.value} {steps}")

    def after_action(action: Action) -> None:
        if action.ledgered:
            crash_once(f"action {action.key}")

    return {"wrap_store": lambda store: _AfterWrite(store, after_write),
            "wrap_actions": lambda executor: _AfterAction(executor, after_action)}
