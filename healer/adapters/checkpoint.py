"""Checkpoint hooks: ask the jobs on a node to checkpoint, and say when they have.

``slurm-signal``: send the policy's signal (USR1 by default, the signal ``sbatch --signal``
uses for the same purpose) to every job running on the Slurm node — the batch shell and all
its steps — once per incident; the checkpoint is acknowledged when no job runs on the node any
more (each job checkpointed and exited, or was requeued) or when every job wrote an
acknowledgement into its comment: ``scontrol update job=<id> comment=healer-ack:<incident>``
(the contract is documented in docs/checkpoint-hooks.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from healer.errors import PermanentError
from healer.ports import CheckpointHook, HookResult, SlurmDriver, StepOutcome

ACK_PREFIX = "healer-ack:"


class SlurmSignalCheckpoint:
    def __init__(self, slurm: SlurmDriver) -> None:
        self.slurm = slurm
        self._signalled: dict[str, set[int]] = {}

    async def checkpoint(self, incident: str, node: str, slurm_node: str, hook: str,
                         signal: str) -> HookResult:
        jobs = [j for j in await self.slurm.jobs_on(slurm_node)
                if j.state in ("RUNNING", "COMPLETING", "SUSPENDED")]
        done = self._signalled.setdefault(incident, set())
        fresh = [j for j in jobs if j.id not in done and j.state == "RUNNING"]
        if fresh:
            sent = await self.slurm.signal_jobs(slurm_node, signal)
            done.update(sent or [j.id for j in fresh])
        waiting = [j for j in jobs if not j.comment.startswith(f"{ACK_PREFIX}{incident}")]
        if not waiting:
            return HookResult(StepOutcome.DONE, "", {"jobs": ",".join(
                str(i) for i in sorted(done)), "slurmNode": slurm_node})
        return HookResult(StepOutcome.PENDING,
                          f"waiting for {len(waiting)} job(s) to checkpoint: "
                          + ",".join(str(j.id) for j in waiting[:10]))


class HookRouter:
    """Dispatch to the hook a policy names (slurm-signal | webhook | job)."""

    def __init__(self, hooks: Mapping[str, CheckpointHook],
                 missing: Callable[[str], str] | None = None) -> None:
        self.hooks = dict(hooks)
        self._missing = missing

    async def checkpoint(self, incident: str, node: str, slurm_node: str, hook: str,
                         signal: str) -> HookResult:
        h = self.hooks.get(hook)
        if h is None:
            why = self._missing(hook) if self._missing else f"no {hook!r} checkpoint hook"
            raise PermanentError(why)
        return await h.checkpoint(incident, node, slurm_node, hook, signal)
