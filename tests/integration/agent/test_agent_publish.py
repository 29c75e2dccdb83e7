"""The real ``healer agent`` process: the fake libnvidia-ml (through pynvml's ctypes path) in,
the real kube-apiserver out (a kwok node per test).

What it must do: an XID 79 makes ``GPUHealthy=False reason=XidFatal`` naming the GPU, within
milliseconds of the event (measured and printed), plus one ``GPUXid`` Event; the heartbeat moves
while the transition time does not; Ready and the other conditions survive; a lost GPU is
``GpuLost``; counters over a threshold are reported per GPU; ``/metrics`` serves the agent's
metrics; SIGTERM stops it promptly; NVML failing to start is exit 2 with one clear line; an API
server outage is logged once and its end once; it runs with deploy/agent's least privilege and
never cordons, taints or labels.
"""

from __future__ import annotations

import asyncio
import inspect
import secrets
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from healer.core.gpu_identity import parse_entries, split_message
from healer_dev.devstack.kube import KubeStack
from tests.integration.agent.agent_harness import (
    N_GPUS,
    ROOT,
    AgentProcess,
    TcpProxy,
    conditions,
    create_gpu_node,
    gpu_condition,
    kubeconfig_via,
    node_events,
    node_raw,
    scenario,
    spawn_agent,
    uuid,
)
from tests.integration.agent.conftest import FakeNvml
from tests.integration.conftest import api_client_for
from tests.integration.kube_tokens import pod_bound_kubeconfig
from tests.integration.waiting import wait_for


def human(message: str) -> str:
    """The condition message without its GPU identity block."""
    return split_message(message)[0]


#: Events about a Node (cluster-scoped) must live in "default": kube-apiserver refuses them in
#: any other namespace ("involvedObject.namespace ... does not match event.namespace").
EVENTS = "default"


@pytest.fixture
async def gpu_node(kube_api: client.ApiClient) -> AsyncIterator[str]:
    """A fresh kwok GPU node, Ready; deleted afterwards."""
    name = f"agent-{secrets.token_hex(3)}"
    await create_gpu_node(kube_api, name)
    yield name
    try:
        await client.CoreV1Api(kube_api).delete_node(name)
    except ApiException as e:
        if e.status != 404:
            raise


class Agents:
    """Starts agents for a test and stops whatever is still running at its end."""

    def __init__(self, fake: FakeNvml, stack: KubeStack, workdir: Path) -> None:
        self.fake, self.stack, self.workdir = fake, stack, workdir
        self.started: list[AgentProcess] = []

    def start(self, node: str, *, kubeconfig: Path | None = None, **kw: Any) -> AgentProcess:
        a = spawn_agent(lib_dir=self.fake.lib_dir, scenario_path=self.fake.scenario_path,
                        kubeconfig=kubeconfig or self.stack.kubeconfig, node=node,
                        workdir=self.workdir, **kw)
        self.started.append(a)
        return a

    def close(self) -> None:
        for a in self.started:
            if a.proc.poll() is None:
                a.terminate()


@pytest.fixture
def agents(fake_nvml: FakeNvml, kube_stack: KubeStack, tmp_path: Path) -> Iterator[Agents]:
    a = Agents(fake_nvml, kube_stack, tmp_path)
    yield a
    a.close()


async def wait_condition(api: client.ApiClient, node: str, agent: AgentProcess, *,
                         status: str, reason: str, deadline: float = 30,
                         interval: float = 0.2) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        agent.alive()
        c = await gpu_condition(api, node)
        return c if c is not None and (c["status"], c["reason"]) == (status, reason) else None

    try:
        return await wait_for(check, timeout=deadline, interval=interval,
                              description=f"GPUHealthy={status} {reason} on {node}")
    except TimeoutError as e:
        raise AssertionError(f"{e}\nagent log:\n{agent.tail()}") from e


async def wait_agent(agent: AgentProcess, predicate: Callable[[], Any], *, deadline: float = 30,
                     description: str) -> Any:
    """wait_for, with the agent's log in the failure (and a dead agent failing at once)."""
    async def check() -> Any:
        agent.alive()
        out = predicate()
        return await out if inspect.isawaitable(out) else out

    try:
        return await wait_for(check, timeout=deadline, description=description)
    except TimeoutError as e:
        raise AssertionError(f"{e}\nagent log:\n{agent.tail()}") from e


def metric_lines(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith((name + "{", name + " "))]


def assert_untouched(raw: dict[str, Any]) -> None:
    """The agent never cordons, taints, labels or annotates."""
    spec, meta = raw.get("spec") or {}, raw.get("metadata") or {}
    assert not spec.get("unschedulable"), spec
    assert not spec.get("taints"), spec
    assert not [k for k in (meta.get("labels") or {}) if k.startswith("healer.io/")], meta
    assert not [k for k in (meta.get("annotations") or {}) if k.startswith("healer.io/")], meta


# ---------------------------------------------------------------------------------------------
# the main story: healthy → XID 79 → XidFatal + Event; heartbeats; other conditions; SIGTERM


async def test_xid79_sets_gpuhealthy_false_at_once_with_an_event(
        kube_api: client.ApiClient, fake_nvml: FakeNvml, agents: Agents, gpu_node: str) -> None:
    core = client.CoreV1Api(kube_api)
    # another detector's condition, next to kwok's Ready: both must survive the agent
    other = {"type": "OtherDetector", "status": "False", "reason": "AllGood",
             "message": "written by the test", "lastHeartbeatTime": "2024-01-01T00:00:00Z",
             "lastTransitionTime": "2024-01-01T00:00:00Z"}
    await core.patch_node_status(gpu_node, {"status": {"conditions": [other]}})
    before = conditions(await node_raw(kube_api, gpu_node))
    assert before["Ready"]["status"] == "True"

    fake_nvml.write(scenario())
    agent = agents.start(gpu_node)
    healthy = await wait_condition(kube_api, gpu_node, agent, status="True", reason="Healthy")
    assert human(healthy["message"]) == f"{N_GPUS} GPUs healthy"
    await agent.ready()
    status, body = await agent.get("/healthz")
    assert status == 200, body

    # XID 79 on GPU 2: appended to the scenario file, as the driver would report it
    t0 = fake_nvml.write(scenario(events=[{"gpu": 2, "xid": 79}]))
    fatal = await wait_condition(kube_api, gpu_node, agent, status="False", reason="XidFatal",
                                 interval=0.01)
    latency_ms = (time.time() - t0) * 1e3
    assert human(fatal["message"]) == f"GPU 2 {uuid(2)}: XID 79 GPU_HAS_FALLEN_OFF_THE_BUS"
    # the machine-readable block: every GPU's index, UUID and serial (from NVML), GPU 2 marked
    named = parse_entries(split_message(fatal["message"])[1])
    assert {(g.gpu.index, g.gpu.uuid, g.gpu.serial, g.affected) for g in named} == {
        (i, uuid(i), f"165123{i:07d}", i == 2) for i in range(N_GPUS)}
    text = await agent.metrics()
    (internal,) = metric_lines(text, "healer_agent_event_to_condition_seconds_sum")
    print(f"\nXID 79 appended to the scenario -> GPUHealthy=False visible in the API: "
          f"{latency_ms:.0f} ms (agent: event received -> condition written "
          f"{float(internal.split()[-1]) * 1e3:.0f} ms)")
    assert latency_ms < 5000

    # one GPUXid Event, from healer.io/healer, about this node
    async def one_event() -> list[dict[str, Any]]:
        return await node_events(kube_api, EVENTS, gpu_node, "GPUXid")

    (ev,) = await wait_agent(agent, one_event, description="the GPUXid Event")
    assert ev["type"] == "Warning"
    assert ev["reportingController"] == "healer.io/healer"
    assert ev["regarding"]["kind"] == "Node"
    assert ev["note"].startswith(f"XID 79 GPU_HAS_FALLEN_OFF_THE_BUS on GPU 2 {uuid(2)}")
    assert ev["metadata"]["annotations"]["healer.io/key"].startswith(
        f"agent/{gpu_node}/{uuid(2)}/xid-79/")

    # heartbeats: lastHeartbeatTime moves, lastTransitionTime stays
    async def heartbeat_moved() -> dict[str, Any] | None:
        c = await gpu_condition(kube_api, gpu_node)
        return c if c and c["lastHeartbeatTime"] > fatal["lastHeartbeatTime"] else None

    later = await wait_agent(agent, heartbeat_moved, deadline=15,
                             description="a newer heartbeat")
    assert later["lastTransitionTime"] == fatal["lastTransitionTime"]
    assert (later["status"], later["reason"], later["message"]) == (
        "False", "XidFatal", fatal["message"])
    assert later["lastTransitionTime"] >= healthy["lastTransitionTime"]

    # Ready and the other detector's condition are untouched; nothing else was written
    raw = await node_raw(kube_api, gpu_node)
    after = conditions(raw)
    assert after["OtherDetector"] == before["OtherDetector"]
    assert after["Ready"] == before["Ready"]
    assert set(after) == set(before) | {"GPUHealthy"}
    assert_untouched(raw)
    assert len(await node_events(kube_api, EVENTS, gpu_node, "GPUXid")) == 1

    # /metrics: the agent's own registry, per GPU
    text = await agent.metrics()
    for line in (f'healer_agent_gpu_xid_total{{gpu="2",uuid="{uuid(2)}",xid="79"}} 1.0',
                 f'healer_agent_gpu_healthy{{gpu="2",uuid="{uuid(2)}"}} 0.0',
                 f'healer_agent_gpu_healthy{{gpu="0",uuid="{uuid(0)}"}} 1.0',
                 'healer_agent_healthy{reason="XidFatal"} 0.0',
                 f'healer_agent_gpu_temperature_celsius{{gpu="3",uuid="{uuid(3)}"}} 40.0',
                 f'healer_agent_gpu_nvlink_active_links{{gpu="1",uuid="{uuid(1)}"}} 18.0',
                 'healer_agent_info{driver="550.54.15",node="' + gpu_node + '"} 1.0',
                 'healer_agent_k8s_events_total{reason="GPUXid",result="emitted"} 1.0'):
        assert line in text, f"{line} not in:\n{text}"
    assert "healer_agent_nvml_errors_total" in text
    assert "healer_remediations" not in text  # not the controller's registry

    # SIGTERM: stops promptly and cleanly
    t = time.monotonic()
    agent.signal(signal.SIGTERM)
    rc = await asyncio.to_thread(agent.proc.wait, 20)
    took = time.monotonic() - t
    print(f"SIGTERM -> exit {rc} in {took * 1e3:.0f} ms")
    assert rc == 0, agent.tail()
    assert took < 5
    assert agent.logged("shutting down")
    assert not agent.logged("task failed"), agent.tail()
    # the condition stays as it was: a stale heartbeat is how a dead agent shows
    assert (await gpu_condition(kube_api, gpu_node))["reason"] == "XidFatal"  # type: ignore[index]


# ---------------------------------------------------------------------------------------------
# a GPU that falls off the bus; counters over their thresholds


async def test_gpu_lost_is_gpu_lost(kube_api: client.ApiClient, fake_nvml: FakeNvml,
                                    agents: Agents, gpu_node: str) -> None:
    fake_nvml.write(scenario())
    agent = agents.start(gpu_node)
    await wait_condition(kube_api, gpu_node, agent, status="True", reason="Healthy")
    # GPU 1's calls answer GPU_IS_LOST, and so does the event wait once
    t0 = fake_nvml.write(scenario(g1={"lost": 1}, events=[{"gpu": 1, "lost": True}]))
    lost = await wait_condition(kube_api, gpu_node, agent, status="False", reason="GpuLost",
                                interval=0.02)
    print(f"\nGPU_IS_LOST -> GpuLost visible in the API: {(time.time() - t0) * 1e3:.0f} ms")
    assert human(lost["message"]) == f"GPU 1 {uuid(1)}: GPU is lost (NVML_ERROR_GPU_IS_LOST)"

    async def lost_event() -> list[dict[str, Any]]:
        return await node_events(kube_api, EVENTS, gpu_node, "GPULost")

    (ev,) = await wait_agent(agent, lost_event, description="the GPULost Event")
    assert f"GPU 1 {uuid(1)}" in ev["note"]
    text = await agent.metrics()
    assert f'healer_agent_gpu_lost{{gpu="1",uuid="{uuid(1)}"}} 1.0' in text
    assert f'healer_agent_gpu_lost{{gpu="0",uuid="{uuid(0)}"}} 0.0' in text
    assert agent.terminate() == 0


async def test_counters_over_thresholds_are_reported_per_gpu(
        kube_api: client.ApiClient, fake_nvml: FakeNvml, agents: Agents, gpu_node: str) -> None:
    fake_nvml.write(scenario())
    agent = agents.start(gpu_node)
    healthy = await wait_condition(kube_api, gpu_node, agent, status="True", reason="Healthy")
    # a row remap pending on GPU 2 and PCIe replays over the limit on GPU 3, read by polling
    fake_nvml.write(scenario(g2={"remap": {"pending": 1, "uncorrectable": 1}},
                             g3={"pcie": {"replay": 250}}))
    pending = await wait_condition(kube_api, gpu_node, agent, status="False",
                                   reason="RowRemapPending")
    assert human(pending["message"]) == (f"GPU 2 {uuid(2)}: row remap pending (a GPU reset "
                                         f"applies it); GPU 3 {uuid(3)}: 250 PCIe replays "
                                         "(> 100)")
    text = await agent.metrics()
    for line in (f'healer_agent_gpu_row_remap_pending{{gpu="2",uuid="{uuid(2)}"}} 1.0',
                 f'healer_agent_gpu_row_remap_pending{{gpu="1",uuid="{uuid(1)}"}} 0.0',
                 f'healer_agent_gpu_remapped_rows{{gpu="2",kind="uncorrectable",'
                 f'uuid="{uuid(2)}"}} 1.0',
                 f'healer_agent_gpu_pcie_replays{{gpu="3",uuid="{uuid(3)}"}} 250.0',
                 f'healer_agent_gpu_finding{{gpu="3",reason="PcieReplays",severity="degrading",'
                 f'uuid="{uuid(3)}"}} 1.0'):
        assert line in text, f"{line} not in:\n{text}"
    # counters are no Events
    assert await node_events(kube_api, EVENTS, gpu_node) == []
    # the remap is applied (a GPU reset): back to healthy, a new transition
    fake_nvml.write(scenario())
    back = await wait_condition(kube_api, gpu_node, agent, status="True", reason="Healthy")
    assert back["lastTransitionTime"] >= pending["lastTransitionTime"] >= \
        healthy["lastTransitionTime"]
    assert_untouched(await node_raw(kube_api, gpu_node))
    assert agent.terminate() == 0


# ---------------------------------------------------------------------------------------------
# NVML unusable: exit 2, one clear line


@pytest.mark.parametrize("how", ["driver-not-loaded", "unloadable-library"])
def test_nvml_failing_to_start_exits_2_with_the_reason(fake_nvml: FakeNvml, tmp_path: Path,
                                                       how: str) -> None:
    lib_dir = fake_nvml.lib_dir
    if how == "driver-not-loaded":
        fake_nvml.write({**scenario(), "init.error": "DRIVER_NOT_LOADED"})
        expected = ("NVML initialisation failed: nvmlInit returned NVML_ERROR_DRIVER_NOT_LOADED "
                    "(Driver Not Loaded); is the NVIDIA driver installed")
    else:  # a file that is not a library shadows any real one
        fake_nvml.write(scenario())
        lib_dir = tmp_path / "badlib"
        lib_dir.mkdir()
        (lib_dir / "libnvidia-ml.so.1").write_bytes(b"")
        expected = "NVML initialisation failed: cannot load libnvidia-ml.so.1: "
    agent = spawn_agent(lib_dir=lib_dir, scenario_path=fake_nvml.scenario_path,
                        kubeconfig=tmp_path / "no-kubeconfig-needed", node="gpu-x",
                        workdir=tmp_path)
    try:
        rc = agent.proc.wait(timeout=60)
    finally:
        if agent.proc.poll() is None:
            agent.terminate()
    lines = agent.lines()
    print(f"\n{how}: exit {rc}: {lines}")
    assert rc == 2
    (only,) = lines  # one line, nothing else (no traceback, no retry spam)
    assert (only["event"], only["level"], only["node"]) == ("cannot start", "error", "gpu-x")
    assert only["error"].startswith(expected)
    assert "/dev/nvidia*" in only["error"]


# ---------------------------------------------------------------------------------------------
# the API server away and back: logged once, then once more; nothing lost


async def test_api_server_outage_is_logged_once_and_nothing_is_lost(
        kube_stack: KubeStack, kube_api: client.ApiClient, fake_nvml: FakeNvml,
        agents: Agents, gpu_node: str, tmp_path: Path) -> None:
    proxy = TcpProxy(int(kube_stack.server.rsplit(":", 1)[1]))
    await proxy.start()
    try:
        kubeconfig = kubeconfig_via(kube_stack.kubeconfig, proxy.port, tmp_path / "proxy.kcfg")
        fake_nvml.write(scenario())
        agent = agents.start(gpu_node, kubeconfig=kubeconfig)
        await wait_condition(kube_api, gpu_node, agent, status="True", reason="Healthy")

        await proxy.stop()  # the API server is away for this agent
        fake_nvml.write(scenario(events=[{"gpu": 0, "xid": 48}]))

        async def failing_a_while() -> bool:
            agent.alive()
            text = await agent.metrics()
            errors = sum(float(line.split()[-1])
                         for line in metric_lines(text, "healer_agent_api_errors_total"))
            return errors >= 4 and bool(agent.logged("nvml event", xid=48))

        await wait_agent(agent, failing_a_while, deadline=60,
                         description="several failed writes")
        assert len(agent.logged("outage", what="kube-apiserver")) == 1, agent.tail()
        assert (await gpu_condition(kube_api, gpu_node))["reason"] == "Healthy"  # type: ignore[index]

        await proxy.start()  # back, on the same port
        fatal = await wait_condition(kube_api, gpu_node, agent, status="False",
                                     reason="XidFatal", deadline=60)
        assert human(fatal["message"]) == f"GPU 0 {uuid(0)}: XID 48 GPU_ECC_DBE"

        async def the_event() -> list[dict[str, Any]]:
            return await node_events(kube_api, EVENTS, gpu_node, "GPUXid")

        (ev,) = await wait_agent(agent, the_event, description="the GPUXid Event, late")
        assert "XID 48 GPU_ECC_DBE on GPU 0" in ev["note"]
        await wait_agent(agent, lambda: agent.logged("recovered", what="kube-apiserver"),
                         description="the recovery logged")
        outages = agent.logged("outage")
        print(f"\noutage lines: {outages}\nrecovered: {agent.logged('recovered')}")
        assert len(outages) == 1
        assert len(agent.logged("recovered")) == 1
        assert agent.terminate() == 0
    finally:
        await proxy.stop()


# ---------------------------------------------------------------------------------------------
# deploy/agent: the manifests apply, and the agent works with exactly that RBAC


def kubectl(stack: KubeStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(stack.binaries.kubectl), "--kubeconfig", str(stack.kubeconfig),
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          check=False)


async def _sa_kubeconfig(stack: KubeStack, api: client.ApiClient, path: Path,
                         node: str) -> Path:
    """The agent's identity as the kubelet mounts it: a token bound to a Pod on ``node`` (the
    agent's admission policy lets it write that Node's status only)."""
    cfg, _ = await pod_bound_kubeconfig(stack, api, "healer-system", "healer-agent", node, path)
    return cfg


async def test_deploy_agent_applies_and_is_all_the_agent_needs(
        kube_stack: KubeStack, kube_api: client.ApiClient, fake_nvml: FakeNvml,
        agents: Agents, gpu_node: str, tmp_path: Path) -> None:
    r = await asyncio.to_thread(kubectl, kube_stack, "apply", "--server-side", "-f",
                                "deploy/namespace.yaml")
    assert r.returncode == 0, r.stderr
    r = await asyncio.to_thread(kubectl, kube_stack, "apply", "-k", "deploy/agent/",
                                "--server-side", "--dry-run=server")
    assert r.returncode == 0, r.stderr
    for kind in ("serviceaccount/healer-agent", "clusterrole.rbac.authorization.k8s.io/"
                 "healer-agent", "daemonset.apps/healer-agent",
                 "service/healer-agent-metrics", "role.rbac.authorization.k8s.io/"
                 "healer-agent-events"):
        assert kind in r.stdout, r.stdout
    # the RBAC for real (not the DaemonSet: its pods would land on every kwok GPU node)
    r = await asyncio.to_thread(kubectl, kube_stack, "apply", "--server-side", "-f",
                                "deploy/agent/rbac.yaml")
    assert r.returncode == 0, r.stderr

    kubeconfig = await _sa_kubeconfig(kube_stack, kube_api, tmp_path / "agent.kubeconfig",
                                      gpu_node)
    fake_nvml.write(scenario())
    agent = agents.start(gpu_node, kubeconfig=kubeconfig)
    await wait_condition(kube_api, gpu_node, agent, status="True", reason="Healthy")
    fake_nvml.write(scenario(events=[{"gpu": 3, "xid": 79}]))
    await wait_condition(kube_api, gpu_node, agent, status="False", reason="XidFatal")

    async def the_event() -> list[dict[str, Any]]:
        return await node_events(kube_api, EVENTS, gpu_node, "GPUXid")

    await wait_agent(agent, the_event, description="the GPUXid Event as the agent's SA")
    assert "403" not in agent.text(), agent.tail()
    assert not agent.logged("outage"), agent.tail()
    assert agent.terminate() == 0

    # what the agent must not do is refused: cordon, taint, label, delete, other namespaces
    sa = await api_client_for(kubeconfig)
    try:
        core = client.CoreV1Api(sa)
        event = {"metadata": {"name": "x"}, "eventTime": "2024-01-01T00:00:00.000000Z",
                 "reportingController": "x", "reportingInstance": "x", "action": "x",
                 "reason": "x", "type": "Normal", "regarding": {"kind": "Node", "name": "x"}}
        attempts: list[Callable[[], Awaitable[Any]]] = [
            lambda: core.patch_node(gpu_node, {"spec": {"unschedulable": True}}),
            lambda: core.patch_node(gpu_node, {"metadata": {"labels": {"healer.io/x": "1"}}}),
            lambda: core.delete_node(gpu_node),
            lambda: core.list_node(),
            lambda: core.list_namespaced_secret("kube-system"),
            lambda: client.EventsV1Api(sa).create_namespaced_event("kube-system", event),
        ]
        for attempt in attempts:
            with pytest.raises(ApiException) as e:
                await attempt()
            assert e.value.status == 403, e.value
    finally:
        await sa.close()
    assert_untouched(await node_raw(kube_api, gpu_node))
