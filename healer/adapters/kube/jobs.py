"""Kubernetes Jobs run on one node: the validation gate (and Job-based hooks).

The Job is named after the incident and purpose, so creating it twice is a no-op; its result
is read back from the Job's status. It is pinned to the target node with ``nodeName`` and
tolerates healer's own taints (the node is still a spare or still cordoned when it runs).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from kubernetes_asyncio import client

from healer.adapters.kube.client import call, to_dict
from healer.core.vocabulary import PURPOSE_LABEL, REMEDIATION_TAINT, SPARE_TAINT, TAINT_EFFECT
from healer.errors import ConflictError, NotFoundError
from healer.ports import HookResult, StepOutcome

TOLERATE_ALL_HEALER = [
    {"key": SPARE_TAINT, "operator": "Exists", "effect": TAINT_EFFECT},
    {"key": REMEDIATION_TAINT, "operator": "Exists", "effect": TAINT_EFFECT},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]


def job_name(prefix: str, incident: str, purpose: str) -> str:
    digest = hashlib.sha256(f"{incident}/{purpose}".encode()).hexdigest()[:12]
    return f"{prefix}-{purpose[:20]}-{digest}".lower()


def job_body(name: str, namespace: str, node: str, image: str, command: Sequence[str],
             deadline: int, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline,
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeName": node,
                    "tolerations": TOLERATE_ALL_HEALER,
                    "containers": [{"name": "validate", "image": image,
                                    "command": list(command)}],
                },
            },
        },
    }


async def run_once(api: client.ApiClient, namespace: str, name: str,
                   body: Callable[[], Awaitable[dict[str, Any]]], what: str,
                   where: str = "") -> HookResult:
    """Job ``name`` in ``namespace``: created from ``body()`` the first time (a second create
    is a no-op), then its result read back: DONE when it succeeded, FAILED (with the Job's
    condition messages) when it failed, PENDING while it runs. ``what`` and ``where`` name it
    in the details."""
    batch = client.BatchV1Api(api)
    try:
        raw = to_dict(api, await call(f"read Job {name}",
                                      lambda: batch.read_namespaced_job(name, namespace)))
    except NotFoundError:
        job = await body()
        with contextlib.suppress(ConflictError):
            await call(f"create Job {name}",
                       lambda: batch.create_namespaced_job(namespace, job))  # type: ignore[arg-type]
        return HookResult(StepOutcome.PENDING, f"{what} Job {name} started{where}")
    status = raw.get("status") or {}
    if status.get("succeeded"):
        return HookResult(StepOutcome.DONE, "", {"job": name})
    if status.get("failed"):
        conds = [c.get("message") or c.get("reason") for c in status.get("conditions") or []]
        why = "; ".join(str(c) for c in conds if c)
        detail = f"{what} Job {name} failed" + (f": {why}" if why else "")
        return HookResult(StepOutcome.FAILED, detail)
    return HookResult(StepOutcome.PENDING, f"{what} Job {name} running{where}")


class JobValidator:
    def __init__(self, api: client.ApiClient, *, namespace: str, deadline: int = 1800) -> None:
        self.api = api
        self.namespace = namespace
        self.deadline = deadline

    async def validate(self, incident: str, target: str, image: str, command: Sequence[str],
                       purpose: str) -> HookResult:
        name = job_name("healer-validate", incident, purpose)

        async def body() -> dict[str, Any]:
            return job_body(name, self.namespace, target, image, command, self.deadline,
                            {"app.kubernetes.io/managed-by": "healer",
                             PURPOSE_LABEL: f"validate-{purpose}"})

        return await run_once(self.api, self.namespace, name, body, "validation",
                              f" on {target}")
