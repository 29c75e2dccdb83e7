"""Assertions and measurements shared by the flow tests."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tests.integration.flows.conftest import Flow

FLOW_STEPS = ["drain", "cordon", "claim-spare", "move-workload", "await-replacement",
              "annotate-topology", "undrain", "mark-repair"]


def ledger(rec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["step"]: s for s in (rec.get("status") or {}).get("ledger") or []}


def incident_of(rec: dict[str, Any]) -> str:
    return str(rec["spec"]["incident"]["id"])


def print_timeline(label: str, rec: dict[str, Any], t0: float) -> None:
    """Phase and step durations, measured (printed, never asserted)."""
    st = rec.get("status") or {}
    print(f"--- {label}: phases (seconds after the fault was injected)")
    for h in st.get("history") or []:
        print(f"  +{h['at'] - t0:6.1f}s  {h['from']:>15} -> {h['to']:<15} [{h['trigger']}]")
    print(f"--- {label}: steps")
    for s in st.get("ledger") or []:
        took = (s.get("finishedAt") or s["startedAt"]) - s["startedAt"]
        print(f"  {s['step']:<20} {took:6.2f}s  attempts={s.get('attempts')} "
              f"{s.get('detail', '')}")


def assert_ledger_once(rec: dict[str, Any], expected: list[str]) -> None:
    steps = (rec.get("status") or {}).get("ledger") or []
    names = [s["step"] for s in steps]
    assert names == expected, names
    for s in steps:
        assert s.get("outcome") == "ok", s
        assert s.get("finishedAt"), s  # nothing left half-applied
    counts = Counter(names)
    assert all(n == 1 for n in counts.values()), counts


async def assert_no_busy_pod_deleted(f: Flow, job_end: float) -> None:
    """Every slurmd pod deletion happened after the job ended, and once healer had seen the
    node drained and not busy (its Draining → Cordoned transition, a read of Slurm itself) no
    Slurm sample showed it busy before the pod was deleted. (The sampler reads Slurm on its own
    schedule: a sample taken while the job was completing, before healer's read, says nothing
    about the deletion; the job's own end marker and COMPLETED state prove it was not killed.)"""
    for p in f.pods.deleted():
        assert p.deleted_at is not None
        assert p.deleted_at > job_end, (p, job_end)
        samples = f.slurm_history.of(p.slurm)
        assert any(at <= p.deleted_at for at, _ in samples), \
            f"no Slurm sample of {p.slurm} before its pod was deleted"
        history = ((await f.record(p.host)).get("status") or {}).get("history") or []
        idle = [h["at"] for h in history if (h.get("from"), h.get("to")) == ("Draining",
                                                                              "Cordoned")]
        assert idle, (p, history)
        assert idle[0] <= p.deleted_at, (p, history)
        busy = [(at, st) for at, st in samples if idle[0] <= at <= p.deleted_at and st.busy]
        assert not busy, (p, busy)


def spare_untouched(f: Flow, name: str, samples: list[Any]) -> None:
    last = samples[-1]
    assert last.labels.get("healer.io/role") == "spare", last
    assert "healer.io/spare=true:NoSchedule" in last.taints, last
    assert not any(s.annotations.get("healer.io/claimed-by") for s in samples), name
