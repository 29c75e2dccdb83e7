"""One daemon, two Slurm clusters, two NodeSets (issue 14 item 4), on the real stack.

Two real Slurm 22.05 clusters (``west``: three nodes, ``east``: two), each its own slurmctld,
slurm.conf and munge; kwok Nodes of both on the real kube-apiserver; the real daemon process
with two ``kind: SlurmNodeSet`` documents naming each cluster's slurm.conf (scontrol driver)
and NodeSet ``west`` limited to ``maxUnavailable: 1``. Telemetry is file-backed (an XID line).

Before the daemon starts, an admin drains one west node in west's Slurm. Then both a west and
an east node get a fatal XID:

* the east node is drained in *east's* Slurm with healer's reason (the NodeSet's driver), and
  west's Slurm is left alone;
* the west node is held by NodeSet west's own limit, counted from west's Slurm (the admin's
  drain), though the policy and the fleet would allow it; it is never drained;
* the daemon counts the admin's drain in NodeSet west's scope (``nodeset:west``) from the
  merged Slurm feed of both clusters.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from healer.adapters.kube.crd import GROUP, PLURAL, VERSION
from healer.adapters.kube.store import ensure_crd
from healer.core.model import GpuRef, Signal, SignalKind
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import fake_node
from healer_dev.devstack.net import free_port
from healer_dev.devstack.slurm import LocalSlurm
from tests.builders import policy_steps, remediation_policy, slurm_nodeset, yaml_documents
from tests.integration.daemon_process import Daemon
from tests.integration.slurm_fixtures import running_slurm
from tests.integration.waiting import wait_for


def policies(tid: str, west_conf: str, east_conf: str) -> str:
    """Two NodeSets (west at most 1 unavailable), each on its own Slurm cluster through
    scontrol, and one policy over both, without swaps."""
    return yaml_documents(
        slurm_nodeset("west", cluster="west",
                      slurm={"driver": "scontrol", "slurmConf": west_conf},
                      node_selector={"healer-test": tid, "pool": "west"},
                      guardrails={"maxUnavailable": 1}),
        slurm_nodeset("east", cluster="east",
                      slurm={"driver": "scontrol", "slurmConf": east_conf},
                      node_selector={"healer-test": tid, "pool": "east"}),
        remediation_policy(tid, name=f"fatal-{tid}", steps=policy_steps(swap=False)))

SCOPE = re.compile(r'^healer_unavailable_nodes\{cause="([^"]+)",scope="nodeset:west"\} (\S+)$',
                   re.M)


@dataclass
class TwoClusters:
    api: client.ApiClient
    stack: KubeStack
    tid: str
    dir: Path
    west: LocalSlurm
    east: LocalSlurm
    daemons: list[Daemon] = field(default_factory=list)

    @property
    def signals(self) -> Path:
        return self.dir / "signals.jsonl"

    def xid(self, node: str) -> None:
        sig = Signal(node, "file", SignalKind.XID, "DCGM_FI_DEV_XID_ERRORS", 79.0, time.time(),
                     GpuRef(3, f"GPU-{node}-3", f"SN-{node}-3"))
        with open(self.signals, "a") as f:
            f.write(json.dumps({"node": node, **sig.to_dict()}) + "\n")

    def start(self) -> Daemon:
        port = free_port()
        argv = [sys.executable, "-m", "tests.integration.daemon.main", "--real-slurm",
                "--kubeconfig", str(self.stack.kubeconfig), "--policies", str(self.dir / "p"),
                "--signals", str(self.signals), "--http-host", "127.0.0.1",
                "--http-port", str(port), "--namespace", "healer-system",
                "--log-format", "json", "--identity", f"d-{self.tid}",
                "--slurm-driver", "scontrol", "--slurm-state-interval", "1",
                "--no-leader-election", "--shutdown-grace", "2", "--debug-state"]
        d = Daemon.spawn(argv, port=port, log=self.dir / "daemon.log")
        self.daemons.append(d)
        return d

    async def record(self, node: str) -> dict[str, Any] | None:
        raw = await client.CustomObjectsApi(self.api).list_cluster_custom_object(
            GROUP, VERSION, PLURAL)
        items = [i for i in raw["items"] if i["spec"]["node"] == node]
        return items[-1] if items else None


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[tuple[str, LocalSlurm, LocalSlurm]]:
    tid = secrets.token_hex(2)
    with running_slurm(tmp_path / "west", nodes=[f"w{tid}-{i}" for i in range(3)]) as west, \
            running_slurm(tmp_path / "east", nodes=[f"e{tid}-{i}" for i in range(2)]) as east:
        yield tid, west, east


@pytest.fixture
async def world(kube_stack: KubeStack, kube_api: client.ApiClient, tmp_path: Path,
                clusters: tuple[str, LocalSlurm, LocalSlurm]) -> AsyncIterator[TwoClusters]:
    tid, west, east = clusters
    await ensure_crd(kube_api, install=True)
    core = client.CoreV1Api(kube_api)
    with contextlib.suppress(client.exceptions.ApiException):
        await core.create_namespace({"metadata": {"name": "healer-system"}})  # type: ignore[arg-type]
    names = {**dict.fromkeys(west.nodes, "west"), **dict.fromkeys(east.nodes, "east")}
    for name, pool in names.items():
        await core.create_node(fake_node(name, labels={  # type: ignore[arg-type]
            "nvidia.com/gpu.present": "true", "healer-test": tid, "pool": pool}))

    async def ready() -> bool:
        got = (await core.list_node(label_selector=f"healer-test={tid}")).items
        return len(got) == len(names) and all(
            any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            for n in got)

    await wait_for(ready, timeout=60, description="kwok nodes Ready")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "policies.yaml").write_text(policies(
        tid, str(west.conf), str(east.conf)))
    w = TwoClusters(kube_api, kube_stack, tid, tmp_path, west, east)
    try:
        yield w
    finally:
        for d in w.daemons:
            d.kill9()
        co = client.CustomObjectsApi(kube_api)
        for name in names:
            rec = await w.record(name)
            if rec is not None:
                with contextlib.suppress(client.exceptions.ApiException):
                    await co.delete_cluster_custom_object(GROUP, VERSION, PLURAL,
                                                          rec["metadata"]["name"])
            with contextlib.suppress(client.exceptions.ApiException):
                await core.delete_node(name)


@pytest.mark.timeout(300)
async def test_each_nodeset_acts_on_its_own_cluster_under_its_own_limit(
        world: TwoClusters) -> None:
    west0, west1 = world.west.nodes[:2]
    east0 = world.east.nodes[0]
    admin = "admin: bad DIMM, ticket 7"
    await asyncio.to_thread(world.west.run, ["scontrol", "update", f"nodename={west0}",
                                             "state=drain", f"reason={admin}"])
    d = world.start()
    await d.ready(120)

    async def counted() -> bool:
        _, text = await d.get("/metrics")
        return dict(SCOPE.findall(text)).get("slurm-drain") == "1.0"

    try:
        await wait_for(counted, timeout=60, description="NodeSet west counts the admin's drain")
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{d.tail(30)}") from None

    # /debug/state shows the merged Slurm feed: both clusters read, west's drain counted
    _, text = await d.get("/debug/state")
    feed = json.loads(text)["slurmFeed"]
    assert feed["known"] is True, feed
    assert feed["unavailable"] == {west0: "slurm-drain"}, feed

    world.xid(west1)
    world.xid(east0)

    async def east_drained() -> bool:
        st = await asyncio.to_thread(world.east.node_state, east0)
        return st.drain and st.reason_is_ours

    try:
        await wait_for(east_drained, timeout=90, description=f"{east0} drained in east's Slurm")
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{await world.record(east0)}\n{d.tail(30)}") from None
    st = await asyncio.to_thread(world.east.node_state, east0)
    assert st.reason.startswith("healer: "), st

    async def west_held() -> dict[str, Any] | None:
        rec = await world.record(west1)
        block = ((rec or {}).get("status") or {}).get("blocked")
        return block if block and block.get("guardrail") == "max-unavailable" else None

    block = await wait_for(west_held, timeout=60, description=f"{west1} held by NodeSet west")
    assert block is not None
    assert block["message"].startswith("NodeSet west: 1 of 3 nodes unavailable (1 slurm-drain)"), \
        block
    # west's Slurm: the admin's drain is theirs, the held node was never drained
    w0 = await asyncio.to_thread(world.west.node_state, west0)
    assert w0.drain
    assert w0.reason == admin
    w1 = await asyncio.to_thread(world.west.node_state, west1)
    assert not w1.drain, w1


def gone_nodeset(tid: str) -> dict[str, Any]:
    """A NodeSet whose slurmrestd token Secret does not exist."""
    return slurm_nodeset(f"gone-{tid}", cluster="gone",
                         slurm={"driver": "slurmrestd", "slurmrestdUrl": "http://127.0.0.1:9",
                                "tokenSecret": f"healer-system/missing-{tid}:token"},
                         node_selector={"healer-test": tid, "pool": "gone"})


@pytest.mark.timeout(300)
async def test_a_nodeset_whose_token_secret_is_missing_is_visible(world: TwoClusters) -> None:
    """Issue 22 item 9: a NodeSet whose slurmrestd token Secret does not exist turns Slurm's
    view unknown, and says so on the daemon (/readyz's degraded, still ready), in an Event
    about healer and in the per-NodeSet metric the alert reads; the other NodeSets are read."""
    path = world.dir / "p" / "policies.yaml"
    text = await asyncio.to_thread(path.read_text)
    await asyncio.to_thread(path.write_text,
                            text + "---\n" + yaml_documents(gone_nodeset(world.tid)))
    d = world.start()
    await d.ready(120)
    secret = f"healer-system/missing-{world.tid}"

    async def degraded() -> str:
        status, text = await d.get("/readyz")
        assert status == 200, text  # still ready: restarting healer would fix nothing
        return str(json.loads(text).get("degraded", {}).get("slurm-view", ""))

    try:
        why = await wait_for(degraded, timeout=60, description="/readyz says Slurm is unknown")
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{d.tail(30)}") from None
    assert f"SlurmNodeSet 'gone-{world.tid}' (cluster gone)" in why, why
    assert secret in why, why
    _, text = await d.get("/metrics")
    readable = dict(re.findall(r'^healer_nodeset_slurm_readable\{cluster="(\w+)",'
                               r'nodeset="[^"]+"\} (\S+)$', text, re.M))
    assert readable == {"east": "1.0", "west": "1.0", "gone": "0.0"}, readable
    assert "healer_slurm_view_known 0.0" in text

    async def event() -> str:
        got = await client.EventsV1Api(world.api).list_namespaced_event("healer-system")
        notes = [e.note or "" for e in got.items
                 if e.reason == "SlurmViewUnknown" and secret in (e.note or "")]
        return notes[0] if notes else ""

    note = await wait_for(event, timeout=30, description="a SlurmViewUnknown Event")
    assert f"gone-{world.tid}" in note
    assert "Traceback" not in d.tail(500)
