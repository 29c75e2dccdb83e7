"""dryRun in the running daemon: the whole flow is recorded in the ledger, and nothing else is
written — no Node label, annotation, taint or cordon, no Slurm drain, move or undrain."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client

from tests.integration.daemon.conftest import Fleet
from tests.integration.waiting import wait_for

#: the steps a fatal XID runs through in act mode (tests/integration/daemon/test_daemon.py)
FLOW = ["drain", "cordon", "claim-spare", "move-workload"]


async def _nodes(f: Fleet) -> dict[str, dict[str, Any]]:
    """What healer could write on a Node, for every node of the fleet (spares included): the
    ``healer.io/*`` and topology keys, taints other than the node lifecycle's own, the cordon,
    and which field managers ever wrote the object (healer's is ``healer``)."""
    core = client.CoreV1Api(f.api)
    out = {}

    def ours(k: str) -> bool:
        return not k.startswith(("kubernetes.io/", "beta.kubernetes.io/", "node.alpha.",
                                 "node.kubernetes.io/", "kwok.x-k8s.io/"))

    for n in (await core.list_node(label_selector=f"healer-test={f.tid}")).items:
        out[n.metadata.name] = {
            "labels": {k: v for k, v in (n.metadata.labels or {}).items() if ours(k)},
            "annotations": {k: v for k, v in (n.metadata.annotations or {}).items() if ours(k)},
            "taints": sorted((t.key, t.value or "", t.effect) for t in n.spec.taints or []
                             if ours(t.key)),
            "unschedulable": bool(n.spec.unschedulable),
            "healer-wrote": any(m.manager == "healer" for m in n.metadata.managed_fields or []),
        }
    return out


@pytest.mark.timeout(180)
async def test_dry_run_daemon_records_the_whole_flow_and_writes_nothing(fleet: Fleet) -> None:
    before = await _nodes(fleet)
    d = fleet.start("--dry-run")  # caps the policy's `mode: act` at dryRun
    await fleet.ready(d)
    bad = fleet.gpus[1]
    fleet.xid(bad)

    async def whole_flow() -> bool:
        items = await fleet.remediations(bad)
        if not items:
            return False
        steps = [s["step"] for s in (items[0].get("status") or {}).get("ledger", [])
                 if s.get("finishedAt")]
        return steps[:len(FLOW)] == FLOW

    await wait_for(whole_flow, timeout=90, description="the dry-run ledger through the move")
    items = await fleet.remediations(bad)
    assert len(items) == 1
    status = items[0]["status"]
    assert items[0]["spec"]["mode"] == "dryRun" or status.get("mode") == "dryRun", items[0]
    ledger = status["ledger"]
    assert [s["step"] for s in ledger][:len(FLOW)] == FLOW
    assert all(s.get("outcome") for s in ledger if s.get("finishedAt")), ledger
    # zero writes: Slurm untouched, every Node exactly as it was
    assert [e for e in fleet.slurm.log if e[0] in ("drain", "move", "undrain")] == []
    after = await _nodes(fleet)
    assert after == before
    assert not any(n["healer-wrote"] for n in after.values())
    evs = await client.EventsV1Api(fleet.api).list_namespaced_event(
        "default", label_selector=f"healer.io/node={bad}")
    assert {e.reason for e in evs.items} >= {"IncidentOpened", "DryRun"}
    assert d.terminate() == 0
