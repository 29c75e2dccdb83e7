"""The healer daemon as the ``stack`` and ``promql`` groups run it: ``healer run``, Slurm
stood in for.

``python -m healer_dev.bench.daemon --kubeconfig K --policies DIR --http-port P`` runs
:func:`healer.app.run` (the same code as ``healer run``) against the real kube-apiserver, with
only the Slurm side replaced, as the daemon integration tests do. :class:`MemorySlurm` is a
Slurm in which every node exists, runs no job and accepts a drain at once (so "drain
requested" is the drain step's call, and Slurm reports the node drained on the next look).
The workload move and validation are stand-ins too; the bench offers no spares, so a
remediation stops after the cordon, waiting for a spare (open, as the idle-CPU figure needs).
Everything Kubernetes (the node watch, the NodeRemediation writes, the cordon, Events) and the
telemetry path (Prometheus, with ``--prometheus-url``) is real.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from healer.app import Overrides, run
from healer.core.vocabulary import SLURM_REASON_PREFIX
from healer.ports import HookResult, SlurmJob, SlurmNodeState, StepOutcome, Undrain
from healer.runtime.controller import RuntimeSettings
from healer.settings import (
    HttpSettings,
    KubeSettings,
    LeaderSettings,
    Settings,
    SlurmSettings,
    TelemetrySettings,
)


class MemorySlurm:
    """SlurmDriver over an in-memory Slurm: every node idle, drains accepted at once."""

    def __init__(self) -> None:
        self.reasons: dict[str, str] = {}

    async def drain(self, node: str, reason: str, incident: str = "") -> bool:
        self.reasons[node] = reason
        return True

    async def undrain(self, node: str, incident: str = "") -> Undrain:
        reason = self.reasons.get(node, "")
        if reason.startswith(SLURM_REASON_PREFIX) and (not incident or incident in reason):
            del self.reasons[node]
            return Undrain.CLEARED
        return Undrain.NOT_OURS

    async def close(self) -> None:
        """Nothing to release."""

    async def state(self, node: str) -> SlurmNodeState:
        reason = self.reasons.get(node)
        return SlurmNodeState(node, "IDLE", frozenset({"DRAIN"}) if reason else frozenset(),
                              reason or "")

    async def jobs_on(self, node: str) -> list[SlurmJob]:
        return []

    async def signal_jobs(self, node: str, signal: str, *, batch_only: bool = False) -> list[int]:
        return []

    async def requeue_jobs(self, node: str) -> list[int]:
        return []


class NoMove:
    """Workload stand-in (never reached without spares): the move is done at once."""

    async def move(self, incident: str, slurm_node: str, source: str, spare: str, *,
                   dead: bool = False, carry: bool = False) -> HookResult:
        return HookResult(StepOutcome.DONE)

    async def replacement_ready(self, incident: str, slurm_node: str, spare: str) -> HookResult:
        return HookResult(StepOutcome.DONE)


class NoValidation:
    async def validate(self, incident: str, target: str, image: str, command: Sequence[str],
                       purpose: str) -> HookResult:
        return HookResult(StepOutcome.DONE)


def main() -> int:
    p = argparse.ArgumentParser(prog="healer_dev.bench.daemon")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--policies", required=True)
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--log-file", default="")
    p.add_argument("--log-level", default="info")
    p.add_argument("--prometheus-url", default="")
    p.add_argument("--poll-interval", type=float, default=15.0)
    args = p.parse_args()
    settings = Settings(
        policies=(args.policies,), log_level=args.log_level, log_json=True, shutdown_grace=2,
        log_file=args.log_file,
        kube=KubeSettings(kubeconfig=args.kubeconfig, namespace="healer-system",
                          install_crd=True),
        leader=LeaderSettings(enabled=False),
        slurm=SlurmSettings(driver="scontrol"),
        telemetry=TelemetrySettings(prometheus_url=args.prometheus_url,
                                    poll_interval=args.poll_interval),
        http=HttpSettings(host="127.0.0.1", port=args.http_port))
    overrides = Overrides(slurm=MemorySlurm(), workload=NoMove(), validator=NoValidation(),
                          runtime=RuntimeSettings())
    return asyncio.run(run(settings, overrides))


if __name__ == "__main__":
    raise SystemExit(main())
