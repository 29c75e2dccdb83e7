"""Policy loading that can never harm the daemon: every load (start-up and each reload) runs in
a short-lived child process (``python -m healer.runtime.policy_reload``) with a time budget
(the parent kills it) and a memory budget (``RLIMIT_AS`` in the child), off the event loop.

The child answers with the compiled :class:`~healer.core.rules.PolicySet` or with the
problems; a timeout, an exhausted memory budget, a crash or anything else becomes a
:class:`~healer.errors.PolicyLoadError` naming the files. :class:`PolicyReloader` is the reload
loop of ``healer run``: it loads only when the files changed, keeps the policies in force on
any failure, logs each distinct failure once, emits one Kubernetes Event per failure and feeds
the reload metrics; :func:`switch_policies` installs a reloaded set in every
:class:`FollowsPolicies` and the controller, all or nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from healer.adapters.clock import SYSTEM_CLOCK
from healer.core.rules import Mode, PolicySet
from healer.errors import PolicyError, PolicyLoadError, Problem
from healer.policy.load import policy_files
from healer.ports import Clock

log = structlog.get_logger("healer.policy")

#: How much of the child's stderr a crash report keeps.
_TAIL = 400


@dataclass(frozen=True)
class Budget:
    """What one policy load may take: wall-clock seconds and address space (bytes)."""

    seconds: float = 30.0
    memory_bytes: int = 1 << 30


async def load_isolated(paths: Sequence[str], *, max_mode: Mode | None = None,
                        budget: Budget | None = None) -> PolicySet:
    """Load and compile the policies under ``paths`` in a child process within ``budget``.

    Raises :class:`PolicyError` with the problems when the files are invalid, and
    :class:`PolicyLoadError` when the load ran out of time or memory or crashed."""
    budget = budget or Budget()
    where = ", ".join(str(p) for p in paths) or "(no policy paths)"
    request = json.dumps({"paths": [str(p) for p in paths],
                          "max_mode": max_mode.value if max_mode is not None else None,
                          "memory": budget.memory_bytes}).encode()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "healer.runtime.policy_reload", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    except OSError as e:
        raise PolicyLoadError("crash", where, f"cannot start the policy loader: {e}") from e
    try:
        # the child's budget is real time (it bounds a process), not the daemon's clock
        out, err = await asyncio.wait_for(proc.communicate(request), budget.seconds)
    except TimeoutError:
        raise PolicyLoadError("timeout", where, f"loading the policies took longer than "
                              f"{budget.seconds:g} s (the limit); the loader was "
                              "stopped") from None
    finally:  # also on cancellation: the child never outlives its caller
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return _answer(out, err, proc.returncode or 0, where, budget)


def _answer(out: bytes, err: bytes, code: int, where: str, budget: Budget) -> PolicySet:
    try:
        kind, payload = pickle.loads(out) if out else ("", None)
    except Exception:  # a child cut short mid-answer
        kind, payload = "", None
    if kind == "ok" and isinstance(payload, PolicySet):
        return payload
    if kind == "invalid" and isinstance(payload, list):
        raise PolicyError(payload)
    mib = budget.memory_bytes // (1 << 20)
    if kind == "memory":
        raise PolicyLoadError("memory", where, f"loading the policies needed more than {mib} "
                              "MiB of memory (the limit); the loader was stopped")
    if kind == "crash":
        raise PolicyLoadError("crash", where, f"the policy loader failed: {payload}")
    tail = err.decode("utf-8", "replace").strip().splitlines()
    last = tail[-1][:_TAIL] if tail else ""
    if "MemoryError" in last:
        raise PolicyLoadError("memory", where, f"loading the policies needed more than {mib} "
                              "MiB of memory (the limit); the loader was stopped")
    how = f"signal {-code}" if code < 0 else f"exit code {code}"
    raise PolicyLoadError("crash", where, f"the policy loader died ({how})"
                          + (f": {last}" if last else ""))


def _child() -> None:
    """The loader process: a request (JSON) on stdin, a pickled answer on stdout."""
    out = sys.stdout.buffer
    try:
        req = json.loads(sys.stdin.buffer.read())
        from healer.policy.load import load_policy_set

        if req.get("memory"):
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (int(req["memory"]), int(req["memory"])))
        mode = Mode(req["max_mode"]) if req.get("max_mode") else None
        answer: tuple[str, Any] = ("ok", load_policy_set(req["paths"], max_mode=mode))
    except PolicyError as e:  # the loader reports a MemoryError inside a file as a problem
        answer = (("memory", None) if any("MemoryError" in p.message for p in e.problems)
                  else ("invalid", list(e.problems)))
    except MemoryError:
        answer = ("memory", None)
    except BaseException as e:  # anything at all is an answer, never a traceback
        answer = ("crash", f"{type(e).__name__}: {str(e)[:_TAIL]}")
    try:
        data = pickle.dumps(answer)
    except Exception as e:
        data = pickle.dumps(("crash", f"unpicklable answer: {type(e).__name__}"))
    out.write(data)
    out.flush()


# -- the reload loop ------------------------------------------------------------------------


class FollowsPolicies(Protocol):
    """Anything that derives its work from the policies (a telemetry source re-derives its
    queries; the controller looks at held incidents again). Raising means "cannot switch"."""

    def set_policies(self, policies: PolicySet) -> None: ...


class HoldsPolicies(FollowsPolicies, Protocol):
    """The controller: follows the policies and says which are in force."""

    @property
    def policies(self) -> PolicySet: ...


class PoliciesInForce:
    """The policies in force, for the daemon's readers built before the controller (the spare
    validator, the NodeSets' ports): created first with the policies loaded at start, given to
    each reader's constructor, and moved on by :func:`switch_policies` only once the
    controller took a reloaded set (a failed reload leaves it as it was). Call it to read."""

    __slots__ = ("current",)

    def __init__(self, policies: PolicySet) -> None:
        self.current = policies

    def __call__(self) -> PolicySet:
        return self.current


def switch_policies(new: PolicySet, controller: HoldsPolicies,
                    followers: Sequence[FollowsPolicies],
                    in_force: PoliciesInForce | None = None) -> None:
    """Install reloaded policies: the telemetry sources that follow policies first (each
    re-derives its queries; the composition root says which they are), then the controller,
    then ``in_force``; if any step raises, the followers already switched are switched back
    and the error propagates (the reloader reports it): nothing is half-applied."""
    old, switched = controller.policies, []
    try:
        for src in followers:
            src.set_policies(new)
            switched.append(src)
        controller.set_policies(new)
    except Exception:
        for undo in switched:
            with contextlib.suppress(Exception):
                undo.set_policies(old)
        raise
    if in_force is not None:
        in_force.current = new


class ReloadObserver(Protocol):
    def policies_loaded(self, digest: str, ok: bool, reason: str = ...) -> None: ...


Stamp = tuple[tuple[str, float, int, int], ...]


def stamp(paths: Sequence[str]) -> Stamp:
    """What the policy files look like now (name, mtime, size, inode): a change means reload.
    Never raises: an unreadable path is part of the stamp."""
    out: list[tuple[str, float, int, int]] = []
    try:
        files = policy_files(paths)
    except OSError as e:
        return (("<error>", 0.0, 0, hash(str(e))),)
    for f in files:
        try:
            st = Path(f).stat()
        except OSError:
            out.append((str(f), -1.0, -1, -1))
            continue
        out.append((str(f), st.st_mtime, st.st_size, st.st_ino))
    return tuple(out)


class PolicyReloader:
    """Reloads the policies when their files change; never raises, never blocks the loop.

    ``apply`` installs a new PolicySet; ``emit`` records a Kubernetes Event (reason, note);
    ``observer`` gets every outcome for the metrics. Each distinct failure is logged once and
    emitted once; a success resets that, so the same failure later is reported again."""

    def __init__(self, paths: Sequence[str], *, apply: Callable[[PolicySet], None],
                 observer: ReloadObserver, emit: Callable[[str, str], Awaitable[None]] | None
                 = None, max_mode: Mode | None = None, budget: Budget | None = None,
                 beat: Callable[[], None] | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.paths = tuple(paths)
        self.clock = clock
        self.apply, self.observer, self.emit = apply, observer, emit
        self.max_mode, self.budget = max_mode, budget or Budget()
        self.beat = beat
        self._stamp: Stamp | None = None
        self._last_failure: str | None = None
        self.failures: list[str] = []  # every distinct failure reported (tests, debug)

    async def prime(self) -> None:
        """Remember the files as they are (the start-up load just read them)."""
        self._stamp = await asyncio.to_thread(stamp, self.paths)

    async def check(self) -> bool | None:
        """One tick: None if nothing changed, True if reloaded, False if the reload failed."""
        now = await asyncio.to_thread(stamp, self.paths)
        if now == self._stamp:
            return None
        self._stamp = now
        try:
            new = await load_isolated(self.paths, max_mode=self.max_mode, budget=self.budget)
        except PolicyLoadError as e:
            await self._failed(e.kind, e.problems)
            return False
        except PolicyError as e:
            await self._failed("invalid", e.problems)
            return False
        except Exception as e:  # a reload never takes the daemon down
            await self._failed("crash", [Problem(", ".join(self.paths), 0, "",
                                                 f"{type(e).__name__}: {e}")])
            return False
        try:
            self.apply(new)
        except Exception as e:
            await self._failed("crash", [Problem(", ".join(self.paths), 0, "",
                                                 f"applying the policies failed: "
                                                 f"{type(e).__name__}: {e}")])
            return False
        self._last_failure = None
        self.observer.policies_loaded(new.digest, True)
        log.info("policies reloaded", digest=new.digest,
                 policies=[p.name for p in new.policies])
        return True

    async def _failed(self, kind: str, problems: Sequence[Problem]) -> None:
        self.observer.policies_loaded("", False, kind)
        text = "\n".join(str(p) for p in problems)
        if text == self._last_failure:
            return  # the same failure again: already logged and emitted
        self._last_failure = text
        self.failures.append(text)
        log.error("policy reload failed; keeping the policies in force", reason=kind,
                  problems=[str(p) for p in problems])
        if self.emit is None:
            return
        note = (f"policy reload failed ({kind}); the previous policies stay in force: "
                + "; ".join(str(p) for p in problems))
        try:
            # a bound on an API call, in real time (not the daemon's clock)
            await asyncio.wait_for(self.emit("PolicyReloadFailed", note), 15)
        except Exception as e:  # the Event is best effort; the log has it
            log.warning("could not emit the PolicyReloadFailed event", error=str(e)[:_TAIL])

    async def run(self, every: float) -> None:
        """The loop: look every ``every`` seconds; beats ``beat`` each round."""
        while True:
            if self.beat is not None:
                self.beat()
            await self.clock.sleep(every)
            await self.check()


if __name__ == "__main__":
    _child()
