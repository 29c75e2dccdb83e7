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
import contextvars
import json
import re
import signal
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from healer.app import Overrides, run
from healer.core import actions as a
from healer.core.machine import Trigger
from healer.core.model import NodeRecord
from healer.core.slurm_drivers import SlurmDriverKind
from healer.core.vocabulary import SLURM_REASON_PREFIX
from healer.ports import (
    HookResult,
    SlurmHandles,
    SlurmJob,
    SlurmNodeState,
    StateStore,
    StepOutcome,
    StoredRecord,
    Undrain,
)
from healer.runtime.controller import RuntimeSettings
from healer.runtime.executor import ActionRunner
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

    async def drain(self, node: str, reason: str, incident: str = "", *,
                    host: str = "") -> bool:
        self.reasons[node] = reason
        return True

    async def undrain(self, node: str, incident: str = "", *,
                      host: str = "") -> Undrain:
        reason = self.reasons.get(node, "")
        if reason.startswith(SLURM_REASON_PREFIX) and (not incident or incident in reason):
            del self.reasons[node]
            return Undrain.CLEARED
        return Undrain.NOT_OURS

    async def close(self) -> None:
        """Nothing to release."""

    async def state(self, node: str, *, host: str = "") -> SlurmNodeState:
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


# -- counting the API requests, by what the daemon was doing -----------------------------------

#: what the daemon is doing when it sends a request (a record's write, an action)
DOING: contextvars.ContextVar[str] = contextvars.ContextVar("doing", default="other")
#: (what, verb, resource) → requests sent
REQUESTS: Counter[tuple[str, str, str]] = Counter()
_RESOURCE = re.compile(r"/(nodes|noderemediations|events|leases|configmaps|pods|jobs)"
                       r"(?:/[^/?]+)?(/status)?")


def _count(method: str, url: Any) -> None:
    m = _RESOURCE.search(str(url).split("?", 1)[0])
    resource = (m.group(1) + (m.group(2) or "")) if m else "other"
    doing = "events (background queue)" if resource == "events" else DOING.get()
    REQUESTS[(doing, method.upper(), resource)] += 1


def count_requests() -> None:
    """Count every HTTP request the daemon's aiohttp sessions send (the bench's own view of
    the daemon's API traffic; healer's metrics time calls, not what each step wrote)."""
    send = aiohttp.ClientSession._request

    async def request(self: aiohttp.ClientSession, method: str, url: Any, *args: Any,
                      **kwargs: Any) -> Any:
        _count(method, url)
        return await send(self, method, url, *args, **kwargs)

    aiohttp.ClientSession._request = request  # type: ignore[method-assign,assignment]


def dump_requests(path: Path) -> None:
    doc = [{"doing": d, "verb": v, "resource": r, "count": n}
           for (d, v, r), n in sorted(REQUESTS.items())]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


class CountingStore:
    """The state store, each write attributed to the record it writes."""

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner

    async def list(self) -> list[StoredRecord]:
        return await self.inner.list()

    async def delete(self, name: str) -> None:
        await self.inner.delete(name)

    async def save(self, record: NodeRecord, previous: StoredRecord | None) -> StoredRecord:
        open_steps = [s.step for s in record.ledger if not s.done]
        what = ("record: opened (create, then status)" if previous is None else
                f"record: {record.phase.value}" + (f", {open_steps[-1]} intent"
                                                   if open_steps else ""))
        token = DOING.set(what)
        try:
            return await self.inner.save(record, previous)
        finally:
            DOING.reset(token)


class CountingActions:
    """The executor, each action's requests attributed to its step."""

    def __init__(self, inner: ActionRunner) -> None:
        self.inner = inner

    async def run(self, action: a.Action, record: NodeRecord | None) -> list[Trigger]:
        token = DOING.set(f"action: {action.ledger_name}")
        try:
            return await self.inner.run(action, record)
        finally:
            DOING.reset(token)


def main() -> int:
    p = argparse.ArgumentParser(prog="healer_dev.bench.daemon")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--policies", required=True)
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--log-file", default="")
    p.add_argument("--log-level", default="info")
    p.add_argument("--prometheus-url", default="")
    p.add_argument("--poll-interval", type=float, default=15.0)
    p.add_argument("--requests-file", default="",
                   help="on SIGUSR1, write the API requests counted so far here (JSON)")
    p.add_argument("--kube-api-qps", type=float, default=0.0)
    p.add_argument("--kube-api-burst", type=int, default=1000)
    args = p.parse_args()
    if args.requests_file:
        count_requests()
        path = Path(args.requests_file)
        signal.signal(signal.SIGUSR1, lambda *_: dump_requests(path))
    settings = Settings(
        policies=(args.policies,), log_level=args.log_level, log_json=True, shutdown_grace=2,
        log_file=args.log_file,
        kube=KubeSettings(kubeconfig=args.kubeconfig, namespace="healer-system",
                          install_crd=True, api_qps=args.kube_api_qps,
                          api_burst=args.kube_api_burst),
        leader=LeaderSettings(enabled=False),
        slurm=SlurmSettings(driver=SlurmDriverKind.SCONTROL),
        telemetry=TelemetrySettings(prometheus_url=args.prometheus_url,
                                    poll_interval=args.poll_interval),
        http=HttpSettings(host="127.0.0.1", port=args.http_port))
    # MemorySlurm drains and undrains only: no optional capability
    overrides = Overrides(slurm=SlurmHandles(MemorySlurm()), workload=NoMove(),
                          validator=NoValidation(), runtime=RuntimeSettings(),
                          wrap_store=CountingStore if args.requests_file else None,
                          wrap_actions=CountingActions if args.requests_file else None)
    return asyncio.run(run(settings, overrides))


if __name__ == "__main__":
    raise SystemExit(main())
