"""A dependency that is gone is visible, not only a log line: what the daemon needs and cannot
use now (Slurm's node states: a NodeSet's cluster unreachable, its slurmrestd token Secret
missing or without its key) is

* a ``degraded`` entry in the bodies of ``/healthz`` and ``/readyz`` with the reason (neither
  fails: restarting or unreadying healer would fix nothing and would stop the webhook acks);
* an Event about healer itself (``SlurmViewUnknown``, Warning, with the reason; and
  ``SlurmViewRestored`` when it is back), emitted when the state or the reason changes, never
  per poll;
* metrics (``healer_slurm_view_known``, ``healer_nodeset_slurm_readable{nodeset,cluster}``)
  behind the alerts HealerSlurmViewUnknown and HealerNodeSetSlurmUnreadable, whose runbooks
  say what to look at.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from healer.obs.http import Health

__all__ = ["SLURM_VIEW", "Dependencies"]

#: The ``degraded`` entry of Slurm's view.
SLURM_VIEW = "slurm-view"

Emit = Callable[..., Awaitable[None]]


class Dependencies:
    """Reports each dependency's state on the daemon (``health``) and as Events (``emit``:
    :meth:`healer.adapters.kube.self_events.SelfEvents.emit`)."""

    def __init__(self, health: Health, emit: Emit) -> None:
        self.health = health
        self.emit = emit
        self._lost: dict[str, str] = {}

    async def slurm_view(self, known: bool, why: str) -> None:
        """The Slurm feed's view changed: known again, or unknown (``why``)."""
        await self._report(SLURM_VIEW, "" if known else (why or "unknown reason"),
                           lost="SlurmViewUnknown", back="SlurmViewRestored",
                           what="Slurm's node states")

    async def _report(self, name: str, why: str, *, lost: str, back: str, what: str) -> None:
        before = self._lost.get(name, "")
        self.health.set_dependency(name, why)
        if why == before:
            return
        if why:
            self._lost[name] = why
            await self.emit(lost, f"healer cannot read {what}: {why}; admissions under "
                                  "maxUnavailable or failure-domain limits are held until it "
                                  "can (runbook HealerSlurmViewUnknown)", type="Warning")
        else:
            self._lost.pop(name, None)
            await self.emit(back, f"healer reads {what} again", type="Normal")
