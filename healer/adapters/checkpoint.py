"""Checkpoint hooks: ask the jobs on a node to checkpoint, and say when they have.

Three hooks (the policy's ``steps.checkpoint.hook``); the contracts are in
docs/checkpoint-hooks.md:

``slurm-signal``
    Send the policy's signal (USR1 by default, the signal ``sbatch --signal`` uses for the
    same purpose) to every job running on the Slurm node — the batch shell and its steps.
    Which jobs were signalled is recorded on the Node (annotation
    ``healer.io/checkpoint-signalled: <incident>:<job ids>``) so a restarted healer does not
    signal them again. Acknowledged when no signalled job runs any more (each checkpointed and
    exited, or was requeued), or when every running job wrote ``healer-ack:<incident>`` into
    its comment (``scontrol update job=<id> comment=healer-ack:<incident>``).
``webhook``
    See :mod:`healer.adapters.hooks`.
``job``
    See :mod:`healer.adapters.hooks`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from healer.core.vocabulary import CHECKPOINT_ACK_COMMENT_PREFIX, CHECKPOINT_SIGNALLED
from healer.errors import PermanentError
from healer.ports import (
    CheckpointHook,
    HookKind,
    HookResult,
    HookSpec,
    NodeAPI,
    SlurmDriver,
    StepOutcome,
)


def _parse_signalled(value: str, incident: str) -> set[int]:
    prefix = incident + ":"
    if not value.startswith(prefix):
        return set()
    return {int(x) for x in value[len(prefix):].split(",") if x.strip().isdigit()}


class SlurmSignalCheckpoint:
    def __init__(self, slurm: SlurmDriver, nodes: NodeAPI | None = None) -> None:
        self.slurm = slurm
        self.nodes = nodes
        self._signalled: dict[str, set[int]] = {}

    async def _recorded(self, incident: str, node: str) -> set[int]:
        done = self._signalled.setdefault(incident, set())
        while len(self._signalled) > 10_000:  # bounded: a forgotten one is re-read from the Node
            del self._signalled[next(iter(self._signalled))]
        if self.nodes is not None and not done:
            view = await self.nodes.get(node)
            done |= _parse_signalled(view.annotations.get(CHECKPOINT_SIGNALLED, ""), incident)
        return done

    async def checkpoint(self, incident: str, node: str, slurm_node: str,
                         spec: HookSpec) -> HookResult:
        signal = spec.signal
        jobs = [j for j in await self.slurm.jobs_on(slurm_node)
                if j.state in ("RUNNING", "COMPLETING", "SUSPENDED")]
        done = await self._recorded(incident, node)
        fresh = [j for j in jobs if j.id not in done and j.state == "RUNNING"]
        if fresh:
            sent = await self.slurm.signal_jobs(slurm_node, signal)
            done.update(sent or [j.id for j in fresh])
            if self.nodes is not None:  # remember, so a restarted healer does not re-signal
                await self.nodes.patch_metadata(node, annotations={
                    CHECKPOINT_SIGNALLED: f"{incident}:{','.join(str(i) for i in sorted(done))}"})
        ack = f"{CHECKPOINT_ACK_COMMENT_PREFIX}{incident}"
        waiting = [j for j in jobs if not j.comment.startswith(ack)]
        if not waiting:
            return HookResult(StepOutcome.DONE, "", {"jobs": ",".join(
                str(i) for i in sorted(done)), "slurmNode": slurm_node})
        return HookResult(StepOutcome.PENDING,
                          f"waiting for {len(waiting)} job(s) to checkpoint: "
                          + ",".join(str(j.id) for j in waiting[:10]))


class HookRouter:
    """Dispatch to the hook a policy names (slurm-signal | webhook | job)."""

    def __init__(self, hooks: Mapping[HookKind, CheckpointHook],
                 missing: Callable[[HookKind], str] | None = None) -> None:
        self.hooks = dict(hooks)
        self._missing = missing

    async def checkpoint(self, incident: str, node: str, slurm_node: str,
                         spec: HookSpec) -> HookResult:
        h = self.hooks.get(spec.kind)
        if h is None:
            why = (self._missing(spec.kind) if self._missing
                   else f"no {spec.kind.value!r} checkpoint hook is configured")
            raise PermanentError(why)
        return await h.checkpoint(incident, node, slurm_node, spec)
