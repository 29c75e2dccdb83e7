"""The policies the bench runs: the shipped ``policies/default.yaml`` switched to ``mode: act``,
optionally with permissive guardrails (so a burst of faults is not held by the limits the bench
does not measure), and a small condition-only policy for the stack group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from healer.core.rules import PolicySet
from healer.policy.load import load_policy_set

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_POLICIES = ROOT / "policies" / "default.yaml"
#: the label the stack group puts on its GPU nodes; only they are governed
BENCH_LABEL = "healer.io/bench"

PERMISSIVE: dict[str, Any] = {"maxConcurrent": 1_000_000, "maxUnavailable": "100%"}

STACK_POLICY = """\
apiVersion: healer.io/v1alpha1
kind: FleetGuardrails
metadata: {{name: fleet}}
spec:
  spareSelector:
    matchLabels: {{healer.io/role: spare, {label}: "{run}"}}
  guardrails: {{maxConcurrent: 1000000, maxUnavailable: "100%"}}
---
apiVersion: healer.io/v1alpha1
kind: RemediationPolicy
metadata: {{name: bench-gpu-unhealthy}}
spec:
  mode: act
  nodeSelector:
    matchLabels: {{nvidia.com/gpu.present: "true", {label}: "{run}"}}
  rules:
    - name: gpu-unhealthy-agent
      severity: failed
      condition:
        type: GPUHealthy
        status: ["False"]
        reason: "^(GpuLost|XidFatal|EccUncorrectable|RowRemapFailure)"
  steps:
    pollInterval: {poll}
    drain: {{deadline: 2h}}
  guardrails: {{maxConcurrent: 1000000, maxUnavailable: "100%"}}
"""


def default_docs(*, permissive: bool, poll_interval: str | None = None) -> list[dict[str, Any]]:
    """policies/default.yaml as documents, every policy in act mode."""
    docs = [d for d in yaml.safe_load_all(DEFAULT_POLICIES.read_text()) if d]
    for doc in docs:
        spec = doc.setdefault("spec", {})
        if doc.get("kind") == "RemediationPolicy":
            spec["mode"] = "act"
            if poll_interval:
                spec.setdefault("steps", {})["pollInterval"] = poll_interval
        if permissive:
            g = spec.setdefault("guardrails", {})
            g.update(PERMISSIVE)
            g.pop("breaker", None)
            g.pop("failureDomains", None)
            g.pop("retryBudget", None)
    return docs


def write_default(dest: Path, *, permissive: bool, poll_interval: str | None = None) -> Path:
    """Write the act-mode defaults into directory ``dest``; returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    docs = default_docs(permissive=permissive, poll_interval=poll_interval)
    (dest / "default.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return dest


def load_default(tmp: Path, *, permissive: bool) -> PolicySet:
    return load_policy_set([write_default(tmp, permissive=permissive)])


def write_stack_policy(dest: Path, run: str, poll: str = "1s") -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "bench.yaml").write_text(STACK_POLICY.format(label=BENCH_LABEL, run=run, poll=poll))
    return dest
