"""The :class:`~healer.ports.SlurmDriver` over Slurm's own CLI (``scontrol``, ``squeue``,
``scancel``), for bare-metal Slurm or a host/pod that has the clients and a slurm.conf.

Every command runs as an argv list through :func:`asyncio.create_subprocess_exec` (never a
shell), with a timeout. Failures become healer errors:

* the command timed out, or slurmctld cannot be reached (``Unable to contact slurm
  controller``, socket timeouts, ...) → :class:`~healer.errors.TransientError`;
* an unknown node → :class:`~healer.errors.NotFoundError`; other refusals (invalid job id,
  permission denied, a missing binary) → :class:`~healer.errors.PermanentError`;
* any other non-zero exit → TransientError (Slurm client errors are overwhelmingly about
  reaching slurmctld; the runtime's retry budget bounds the retries).

One node's state is read with ``scontrol --json show node`` where the client has it (Slurm >=
23.02: the slurmrestd node objects, so a reason with brackets or ``Key=`` in it, the GRES,
the features and the topology string come back exact); a client without it (22.05 says
``unrecognized option '--json'``) is asked ``scontrol show node -o`` from then on.

Ownership of drains (see :class:`~healer.ports.SlurmDriver`): healer's reasons start with
``healer: ``. A node already drained with another reason is left alone (``drain`` returns
False, ``undrain`` never clears it). A node that is not drained gets healer's reason even when
it carries another one (e.g. DOWN with Slurm's ``Not responding``): the drain is what keeps a
broken node out of service when its slurmd comes back (``ReturnToService``). Undrain uses
``state=undrain``, never ``state=resume``: UNDRAIN clears only the DRAIN flag and keeps the
base state, so a node that is DOWN (dead slurmd, an admin's ``state=down``) stays DOWN and
healer never brings a broken node back into service by clearing its own drain; RESUME would
also clear DOWN. This is what Slinky's operator does too (``{"state": ["UNDRAIN"]}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from healer.adapters.calls import timed
from healer.adapters.slurm.parse import (
    SQUEUE_FIELDS,
    parse_node_json,
    parse_node_line,
    parse_nodes,
    parse_squeue,
    scontrol_error_kind,
)
from healer.core.vocabulary import SLURM_REASON_PREFIX
from healer.errors import NotFoundError, PermanentError, TransientError
from healer.ports import SlurmJob, SlurmNodeState, Undrain

__all__ = ["CommandResult", "ScontrolDriver", "normalize_signal"]

_SIGNAL = re.compile(r"^(?:SIG)?([A-Z][A-Z0-9+-]*|\d{1,2})$")
_GONE = ("already completing or completed", "invalid job id", "job has already finished",
         "job is no longer")


def normalize_signal(sig: str) -> str:
    """``"usr1"``, ``"SIGUSR1"``, ``"10"`` → ``"USR1"`` / ``"10"`` (ValueError otherwise)."""
    m = _SIGNAL.match(sig.strip().upper())
    if not m or m.group(1) == "SIG":
        raise ValueError(f"not a signal name or number: {sig!r}")
    return m.group(1)


@dataclass(frozen=True, slots=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def message(self) -> str:
        return (self.stderr.strip() or self.stdout.strip())[-500:]


class ScontrolDriver:
    """SlurmDriver through ``scontrol``/``squeue``/``scancel``.

    ``env`` is the complete environment of the commands (None: this process's; pass
    ``{"SLURM_CONF": ...}`` merged into ``os.environ`` to point at another cluster), ``timeout``
    the seconds one command may take, ``bindir`` where the clients live (None: ``PATH``).
    """

    def __init__(self, env: Mapping[str, str] | None = None, timeout: float = 30.0, *,
                 bindir: str | None = None) -> None:
        self.env = dict(env) if env is not None else None
        self.timeout = timeout
        self.bindir = bindir
        #: whether ``scontrol --json`` works here (None: not tried yet)
        self.json: bool | None = None

    # -- SlurmDriver -----------------------------------------------------------------------

    async def state(self, node: str, *, host: str = "") -> SlurmNodeState:
        found = await self._json_nodes(_node_name(node))
        if found is not None:
            for st in found:
                if st.name == node:
                    return st
            raise NotFoundError(f"Slurm node {node!r} not found (scontrol --json lists none)")
        r = await self._run(["scontrol", "show", "node", _node_name(node), "-o"])
        for line in r.stdout.splitlines():
            if "NodeName=" not in line:
                continue
            st = parse_node_line(line)
            if st.name == node:
                return st
        raise NotFoundError(f"Slurm node {node!r} not found: {r.message!r}")

    async def nodes(self) -> list[SlurmNodeState]:
        """Every Slurm node's state: one ``scontrol show node -o`` (the guardrails' feed; the
        one-line form, about a fifth of the JSON's bytes per node on a large cluster)."""
        r = await self._run(["scontrol", "show", "node", "-o"])
        return parse_nodes(r.stdout)

    async def _json_nodes(self, node: str) -> list[SlurmNodeState] | None:
        """``scontrol --json show node NODE`` parsed; None where the client has no ``--json``
        (remembered)."""
        if self.json is False:
            return None
        r = await self._run(["scontrol", "--json", "show", "node", node], check=False)
        if r.returncode != 0:
            if "unrecognized option" in r.message and "--json" in r.message:
                self.json = False
                return None
            self._raise(r)
        try:
            body = json.loads(r.stdout)
            items = body.get("nodes") if isinstance(body, dict) else None
            if not isinstance(items, list):
                raise ValueError("no nodes list")
            nodes = [parse_node_json(n) for n in items if isinstance(n, dict)]
        except ValueError as e:
            raise TransientError(f"`scontrol --json show node` printed no node list ({e}): "
                                 f"{r.stdout[:200]!r}") from e
        self.json = True
        return nodes

    async def jobs_on(self, node: str) -> list[SlurmJob]:
        r = await self._run(["squeue", "-h", "-w", _node_name(node), "-O", SQUEUE_FIELDS])
        return [j for j in parse_squeue(r.stdout) if node in j.nodes]

    async def recent_jobs_on(self, node: str) -> list[SlurmJob]:
        """Every job slurmctld still knows that ran on ``node``, ended ones (NODE_FAIL) too."""
        r = await self._run(["squeue", "-h", "-t", "all", "-w", _node_name(node),
                             "-O", SQUEUE_FIELDS])
        return [j for j in parse_squeue(r.stdout) if node in j.nodes]

    async def drain(self, node: str, reason: str, incident: str = "", *,
                    host: str = "") -> bool:
        if not reason.startswith(SLURM_REASON_PREFIX):
            raise PermanentError(f"drain reason must start with {SLURM_REASON_PREFIX!r}: "
                                 f"{reason!r}")
        st = await self.state(node)
        if (st.drain or (st.down and st.reason)) and not st.reason_is_ours:
            # someone else's drain, or a DOWN with someone's reason (an admin's, or Slurm's
            # own "Not responding"): keep their reason, do not own it (docs/adr/0016)
            return False
        if st.drain and st.reason == " ".join(reason.split()):
            return True
        await self._run(["scontrol", "update", f"nodename={node}", "state=drain",
                         f"reason={_one_line(reason)}"])
        return True

    async def hold(self, node: str, reason: str) -> None:
        """Drain ``node`` with someone else's ``reason``, word for word (not healer's: healer
        never clears it); nothing if it is drained already."""
        st = await self.state(node)
        if st.drain:
            return
        await self._run(["scontrol", "update", f"nodename={node}", "state=drain",
                         f"reason={_one_line(reason)}"])

    async def delete_node(self, node: str) -> bool:
        """Delete ``node``'s record (``scontrol delete nodename=``, as a slurmd pod's preStop
        does); False if there is none. Slurm refuses while it lists jobs on the node."""
        try:
            await self.state(node)
        except NotFoundError:
            return False
        await self._run(["scontrol", "delete", f"nodename={_node_name(node)}"])
        return True

    async def undrain(self, node: str, incident: str = "", *,
                      host: str = "") -> Undrain:
        st = await self.state(node)
        if not st.drained_by_healer(incident):
            return Undrain.NOT_OURS
        # undrain, not resume: a DOWN node stays DOWN (see the module docstring)
        await self._run(["scontrol", "update", f"nodename={node}", "state=undrain"])
        return Undrain.CLEARED

    async def close(self) -> None:
        """Nothing to release: every call is its own ``scontrol`` process."""

    async def signal_jobs(self, node: str, signal: str, *, batch_only: bool = False) -> list[int]:
        try:
            sig = normalize_signal(signal)
        except ValueError as e:
            raise PermanentError(str(e)) from e
        scope = "--batch" if batch_only else "--full"
        done: list[int] = []
        for job in await self.jobs_on(node):
            if job.state != "RUNNING":
                continue
            r = await self._run(["scancel", f"--signal={sig}", scope, str(job.id)], check=False)
            if r.returncode == 0 and "error" not in r.stderr.lower():
                done.append(job.id)
            elif not _job_gone(r.message):
                self._raise(r)
        return done

    async def requeue_jobs(self, node: str) -> list[int]:
        done: list[int] = []
        for job in await self.jobs_on(node):
            if job.state not in ("RUNNING", "SUSPENDED") or not job.requeue:
                continue
            r = await self._run(["scontrol", "requeue", str(job.id)], check=False)
            if r.returncode == 0:
                done.append(job.id)
            elif not _job_gone(r.message) and "presently disabled" not in r.message.lower():
                self._raise(r)
        return done

    # -- plumbing --------------------------------------------------------------------------

    async def run(self, argv: Sequence[str]) -> CommandResult:
        """Run one Slurm client command (argv, no shell); raise healer errors on failure."""
        return await self._run(argv)

    async def _run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        # operation: the command and its verb (``scontrol update``, ``squeue``), never names
        op = " ".join(a for a in argv[:2] if not a.startswith("-") and "=" not in a)
        with timed("slurm", op):
            return await self._exec(argv, check=check)

    async def _exec(self, argv: Sequence[str], *, check: bool) -> CommandResult:
        args = list(argv)
        if self.bindir:
            args[0] = os.path.join(self.bindir, args[0])
        try:
            proc = await asyncio.create_subprocess_exec(
                *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=self.env)
        except FileNotFoundError as e:
            raise PermanentError(f"{args[0]} is not installed: {e}") from e
        except OSError as e:
            raise TransientError(f"cannot run {args[0]}: {e}") from e
        try:
            # a bound on a process, in real time (not the daemon's clock)
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise TransientError(f"`{' '.join(argv)}` timed out after {self.timeout:g} s "
                                 "(slurmctld slow or unreachable)") from None
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            raise
        r = CommandResult(tuple(argv), proc.returncode if proc.returncode is not None else -1,
                          out.decode(errors="replace"), err.decode(errors="replace"))
        if check and r.returncode != 0:
            self._raise(r)
        return r

    @staticmethod
    def _raise(r: CommandResult) -> None:
        msg = f"`{' '.join(r.argv)}` exited {r.returncode}: {r.message}"
        kind = scontrol_error_kind(r.message)
        if kind == "not_found":
            raise NotFoundError(msg)
        if kind == "permanent":
            raise PermanentError(msg)
        raise TransientError(msg)


def _node_name(node: str) -> str:
    """Refuse what is not one node name (a hostlist or an option would act on other nodes)."""
    if not node or node.startswith("-") or any(c in node for c in ",[]= \t\n"):
        raise PermanentError(f"invalid Slurm node name {node!r}")
    return node


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _job_gone(message: str) -> bool:
    low = message.lower()
    return any(s in low for s in _GONE)
