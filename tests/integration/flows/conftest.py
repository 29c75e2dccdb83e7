"""The real stack for the end-to-end flow tests, as pytest fixtures.

* ``kube_stack`` (session, shared with the other integration tests): kube-apiserver, etcd,
  controller-manager, scheduler and kwok. Each test works in its own namespace and on its own
  Nodes, labelled ``healer-flow=<test id>``, deleted afterwards.
* ``slinky_stack`` (session, :mod:`tests.integration.slinky_fixtures`): SchedMD's real
  slurm-operator (v1.1.0 by default; a test asks for v1.0.0 with an indirect
  ``operator_version`` parameter), a real Slurm 26.05 (its Debian root) with dynamic nodes, its
  real slurmrestd on :6820 (the operator's client and healer's slurmrestd driver both talk to
  it; what they asked is read back from slurmrestd's own log) and the kwok pod runtime (a real
  ``slurmd -Z`` per Running slurmd pod, the pod's preStop on delete). The daemon under test
  finds that Slurm's clients first on its ``PATH`` (its scontrol driver runs them).
  Slurm node names come from the pods, as on a real cluster: ``fs<tid>-0..3`` (StatefulSet
  mode, NodeSet ``fs<tid>``: Slurm name = pod name) or the Nodes' names (DaemonSet mode,
  NodeSet ``fd<tid>``: the scontrol and slurmrestd drivers address Slurm by the Kubernetes
  node's name); a DaemonSet-mode spare becomes a Slurm node when the operator starts a slurmd
  pod on it.
* ``flows`` (function): a factory ``await flows(mode, driver)`` → :class:`Flow`: the fleet
  (4 GPU Nodes in two NVLink domains, a warm spare in each domain and a decoy spare in a third
  domain that shares the bad node's leaf switch; each GPU Node fits exactly one slurmd: 8
  ``nvidia.com/gpu``, requested whole by the NodeSet), the NodeSet, the policy, a token for
  ``driver="slurmrestd"``, recorders of pods, Nodes and Slurm states, and
  :meth:`Flow.start_daemon` for the real daemon process (``daemon_main.py``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from healer.adapters.kube.crd import GROUP, PLURAL, VERSION
from healer.adapters.kube.store import ensure_crd
from healer.adapters.slinky import SlinkyPods, pod_state, slurm_name
from healer.adapters.slurm.parse import parse_node_line
from healer.core.model import GpuRef, Signal, SignalKind
from healer.errors import NotFoundError
from healer.ports import SlurmNodeState
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import fake_node
from healer_dev.devstack.net import free_port
from healer_dev.devstack.operator import nodeset as nodeset_body
from healer_dev.devstack.restd_log import RestdRequest
from healer_dev.devstack.slinky_stack import SlinkyStack
from healer_dev.devstack.slurm import LocalSlurm
from tests.builders import FATAL_XID, policy_steps, policy_yaml
from tests.integration.daemon_process import Daemon
from tests.integration.flows.recorders import NodeLog, PodLog, Recorders, SlurmLog
from tests.integration.waiting import wait_for

DOMAIN = "accelerator.topograph.run/domain"
TIER0 = "fabric.topograph.run/tier-0"
TIER1 = "fabric.topograph.run/tier-1"
TOPOLOGY = "topology.slinky.slurm.net/spec"
TEST_LABEL = "healer-flow"
POOL = "healer-flow/pool"  # the NodeSets' nodeSelector: which Nodes may run this test's slurmd
CLUSTER = "slurm"
SPARE_TAINT = {"key": "healer.io/spare", "value": "true", "effect": "NoSchedule"}

GPU_CAPACITY = {"nvidia.com/gpu": "8"}

TERMINAL = ("Done", "Escalated", "Cancelled")

#: Runs until ``$OUTDIR/release-<id>`` exists (at most 5 min). On USR1 it writes its checkpoint
#: and exits (``checkpointing``) or only notes the signal and carries on. Either way the moment
#: it ended lands in ``$OUTDIR/end-<id>`` (a killed job never writes it).
JOB = """
on_usr1() {{
  echo "USR1 $(date +%s.%N)" >> "$OUTDIR/usr1-$SLURM_JOB_ID"
  if [ {exit_on_usr1} = 1 ]; then
    echo "checkpoint written $(date +%s.%N)" >> "$OUTDIR/ckpt-$SLURM_JOB_ID"
    echo "$(date +%s.%N) checkpointed" >> "$OUTDIR/end-$SLURM_JOB_ID"
    exit 0
  fi
}}
trap on_usr1 USR1
for _ in $(seq 1 1500); do
  if [ -e "$OUTDIR/release-$SLURM_JOB_ID" ]; then
    echo "$(date +%s.%N) released" >> "$OUTDIR/end-$SLURM_JOB_ID"
    exit 0
  fi
  sleep 0.2
done
"""




#: the flows' rules: fatal XIDs and row remapping, failed or degrading
FLOW_RULES = (
    FATAL_XID,
    {"name": "row-remap-failure", "severity": "failed",
     "metric": {"field": "DCGM_FI_DEV_ROW_REMAP_FAILURE", "op": ">", "threshold": 0}},
    {"name": "row-remap-pending", "severity": "degrading",
     "metric": {"field": "DCGM_FI_DEV_ROW_REMAP_PENDING", "op": ">", "threshold": 0}},
)


def flow_policy(tid: str, *, first_rules: Sequence[Mapping[str, Any]] = (),
                swap: Mapping[str, Any] | None = None) -> str:
    """The flows' policy: a USR1 checkpoint for degrading nodes, swaps (``swap``: the swap
    block instead of ``{enabled: true}``), no repair hook; ``first_rules`` come before the
    flows' own rules."""
    steps = policy_steps(
        checkpoint={"enabled": True, "hook": "slurm-signal", "signal": "USR1",
                    "deadline": "5m", "onTimeout": "continue", "severities": ["degrading"]},
        swap=True, repair_hook="none")
    if swap is not None:
        steps["swap"] = dict(swap)
    return policy_yaml(tid, name=f"flow-{tid}", label=TEST_LABEL,
                       rules=[*first_rules, *FLOW_RULES], steps=steps)


# ------------------------------------------------------------------------------- daemon


# ------------------------------------------------------------------------------- the rig


@dataclass
class Layout:
    gpus: list[str]  # gpus[0], gpus[1] in nvl-a (leaf-1); gpus[2], gpus[3] in nvl-b (leaf-2)
    spare_a: str  # nvl-a
    spare_b: str  # nvl-b
    decoy: str  # nvl-c, on leaf-1 like gpus[0..1]: a leaf-first or name-first choice takes it

    @property
    def spares(self) -> list[str]:
        return [self.spare_a, self.spare_b, self.decoy]


def layout(mode: str, tid: str) -> Layout:
    # no dots: in DaemonSet mode the Slurm name is the Node's name up to its first dot
    return Layout([f"f{tid}-n{i}" for i in range(4)], f"f{tid}-sa", f"f{tid}-sb",
                  f"f{tid}-s0")


@dataclass
class RestdView:
    """What one test's daemon asked of the shared, real slurmrestd, from the moment the test
    started, as slurmrestd logged it: healer's drivers send ``X-SLURM-USER-NAME: root``, the
    operator sends none. (The log names method and path; what a POST carried is read from
    Slurm itself, a signal from the job's own trap file.)"""

    slurm: LocalSlurm
    url: str
    first: int  # requests served before the test started
    user: str = "root"

    def requests(self, method: str = "") -> list[RestdRequest]:
        return [r for r in self.slurm.restd_requests()[self.first:]
                if r.user_name == self.user and (not method or r.method == method)]

    def updates_of(self, node: str) -> list[RestdRequest]:
        """healer's POSTs to Slurm node ``node`` (drain or undrain)."""
        return [r for r in self.requests("POST") if r.path.endswith(f"/node/{node}")]

    def job_deletes(self, job: int | None = None) -> list[RestdRequest]:
        """healer's DELETEs of jobs (its signals: the driver never sends one without a
        signal)."""
        return [r for r in self.requests("DELETE")
                if "/job/" in r.path and (job is None or r.path.endswith(f"/job/{job}"))]


@dataclass
class Flow:
    """One test's world: namespace, Nodes, NodeSet, the real operator, daemons, recorders."""

    stack: KubeStack
    api: client.ApiClient
    sstack: SlinkyStack
    namespace: str
    mode: str
    driver: str
    tid: str
    dir: Path
    lay: Layout
    slurm_lock: threading.Lock
    bridge: RestdView | None = None
    nodeset_options: dict[str, Any] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    daemons: list[Daemon] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)  # every Node this test created
    recorders: Recorders = field(default_factory=Recorders)
    pods_log: PodLog | None = None
    nodes_log: NodeLog | None = None
    slurm_log: SlurmLog | None = None
    ctld_offset: int = 0
    #: where the daemon writes Events: Events about a Node (cluster-scoped) are only accepted
    #: in "default"
    events_namespace: str = "default"

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def co(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def slurm(self) -> LocalSlurm:
        return self.sstack.slurm

    @property
    def version(self) -> str:
        return self.sstack.version

    @property
    def nodeset(self) -> str:
        return f"fs{self.tid}" if self.mode == "StatefulSet" else f"fd{self.tid}"

    @property
    def slurm_names(self) -> list[str]:
        """Every Slurm node name this test's NodeSet can have."""
        if self.mode == "StatefulSet" and not self.nodeset_options.get("host_network"):
            return [f"{self.nodeset}-{i}" for i in range(len(self.lay.gpus))]
        return self.lay.gpus + self.lay.spares  # named after their Nodes

    @property
    def gate(self) -> threading.Event:
        """Cleared: the pod runtime holds every slurmd start (as a slow image pull would)."""
        assert self.sstack.runtime is not None
        return self.sstack.runtime.start_gate

    @property
    def slurmd_calls(self) -> list[tuple[str, bool, float]]:
        """(Slurm name, started?, when) of every slurmd the pod runtime started or stopped."""
        assert self.sstack.runtime is not None
        return [(h.slurm_name, h.event == "registered", h.time)
                for h in self.sstack.runtime.history
                if h.event in ("registered", "stopped") and h.time >= self.started_at]

    def ctld_state_changes(self, node: str) -> list[tuple[float, str]]:
        """(when, what) of every state or reason slurmctld set on ``node`` during this test,
        from its log: ``reason set to: …``, ``state set to IDLE``, ``state set to DRAINING``
        (whoever asked: the operator, healer, an admin)."""
        pat = re.compile(rf"^\[(?P<at>[^\]]+)\] update_node: node {re.escape(node)} "
                         r"(?P<what>(?:state|reason) set to:? .*)$", re.MULTILINE)
        out = []
        for m in pat.finditer(self.ctld_log()):  # UTC: the root has no /etc/localtime
            at = datetime.strptime(m.group("at"), "%Y-%m-%dT%H:%M:%S.%f").replace(
                tzinfo=UTC).timestamp()
            out.append((at, m.group("what")))
        return out

    @property
    def signals(self) -> Path:
        return self.dir / "signals.jsonl"

    @property
    def policies(self) -> Path:
        return self.dir / "policies"

    @property
    def pods(self) -> PodLog:
        assert self.pods_log is not None
        return self.pods_log

    @property
    def node_history(self) -> NodeLog:
        assert self.nodes_log is not None
        return self.nodes_log

    @property
    def slurm_history(self) -> SlurmLog:
        assert self.slurm_log is not None
        return self.slurm_log

    # -- setup -----------------------------------------------------------------------------

    async def setup(self, *, spares: bool) -> None:
        t0 = time.monotonic()
        await ensure_crd(self.api, install=True)
        self.ctld_offset = len(self.slurm.log())
        await self._wait_names_free(self.lay.gpus + self.lay.spares)
        self.policies.mkdir(parents=True, exist_ok=True)
        (self.policies / "policy.yaml").write_text(flow_policy(self.tid))
        self.signals.touch()
        self.nodes_log = NodeLog(self.api, set(self.lay.gpus + self.lay.spares))
        self.pods_log = PodLog(self.api, self.namespace)
        self.slurm_log = SlurmLog(self.slurm.env(), set(self.slurm_names))
        self.recorders.start(self.nodes_log, self.pods_log, self.slurm_log)
        for i, n in enumerate(self.lay.gpus):
            dom, leaf = ("nvl-a", "leaf-1") if i < 2 else ("nvl-b", "leaf-2")
            await self.create_node(n, dom, leaf, spare=False)
        if spares:
            await self.create_node(self.lay.spare_a, "nvl-a", "leaf-1", spare=True)
            await self.create_node(self.lay.spare_b, "nvl-b", "leaf-2", spare=True)
            await self.create_node(self.lay.decoy, "nvl-c", "leaf-1", spare=True)
        if self.driver == "slurmrestd":
            self.bridge = RestdView(self.slurm, self.sstack.restd_url,
                                    len(self.slurm.restd_requests()))
            token = self.sstack.token("root")
            await self.core.create_namespaced_secret(self.namespace, {  # type: ignore[arg-type]
                "metadata": {"name": "slurm-token"},
                "data": {"SLURM_JWT": base64.b64encode(token.encode()).decode()}})
        self.gate.set()
        await self._wait_nodes_ready(self.nodes)
        await self._create_nodeset(**self.nodeset_options)
        await self.wait_pods_idle(self.lay.gpus)
        print(f"\n[{self.mode}/{self.driver} on slurm-operator {self.version}] fleet ready in "
              f"{time.monotonic() - t0:.1f}s (namespace {self.namespace})")

    async def _wait_nodes_ready(self, names: list[str]) -> None:
        """Nodes join before the NodeSet, as on a cluster: each Ready (kwok) and without the
        node lifecycle controller's not-ready taint. (A DaemonSet-mode NodeSet created while a
        Node was still NotReady got no pod there once it turned Ready: the operator requeues a
        NodeSet on changes of Nodes that run its pods, and that Node ran none.)"""
        async def ready() -> bool:
            for n in names:
                node = await self.core.read_node(n)
                conds = {c.type: c.status for c in node.status.conditions or []}
                if conds.get("Ready") != "True" or any(
                        t.key.startswith("node.kubernetes.io/") for t in node.spec.taints or []):
                    return False
            return True

        await wait_for(ready, timeout=60, description=f"Nodes {names} Ready")

    async def _wait_names_free(self, names: list[str]) -> None:
        async def free() -> bool:
            got = {n.metadata.name for n in (await self.core.list_node()).items}
            return not (got & set(names))

        await wait_for(free, timeout=60, description=f"Nodes {names} gone from an earlier test")

    async def create_node(self, name: str, domain: str, leaf: str, *, spare: bool,
                          pool: bool = True) -> None:
        """A kwok GPU Node: a warm spare (labelled and tainted), or a worker that may run this
        test's slurmd (``pool``), or neither."""
        labels = {"nvidia.com/gpu.present": "true", TEST_LABEL: self.tid, DOMAIN: domain,
                  TIER0: leaf, TIER1: "spine-1"}
        taints: list[dict[str, str]] = []
        if spare:
            labels["healer.io/role"] = "spare"
            taints.append(SPARE_TAINT)
        elif pool:
            labels[POOL] = self.tid
        self.nodes.append(name)
        self.node_history.names.add(name)
        await self.core.create_node(fake_node(name, labels=labels,  # type: ignore[arg-type]
                                              taints=taints, capacity=GPU_CAPACITY))

    async def _create_nodeset(self, **overrides: Any) -> None:
        v10 = self.version.startswith("v1.0.")
        if self.mode == "DaemonSet" and v10:
            pytest.fail("slurm-operator v1.0 has no DaemonSet scaling mode", pytrace=False)
        body = nodeset_body(self.namespace, self.nodeset, CLUSTER, replicas=len(self.lay.gpus),
                            node_selector={POOL: self.tid}, gpus=8,
                            scaling_mode=None if v10 else self.mode, **overrides)
        await client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            "slinky.slurm.net", "v1beta1", self.namespace, "nodesets", body)

    async def live_pods(self) -> list[dict[str, Any]]:
        return await SlinkyPods(self.api, self.namespace).pods()

    async def wait_pods_idle(self, hosts: list[str], within: float = 120) -> dict[str, str]:
        """Wait until a slurmd pod runs on each of ``hosts`` with Slurm idle; host → name."""
        async def ready() -> dict[str, str] | None:
            on: dict[str, str] = {}
            for p in await self.live_pods():
                st = pod_state(p)
                host = (p.get("spec") or {}).get("nodeName")
                if host and (p.get("status") or {}).get("phase") == "Running" and \
                        st.base == "IDLE" and st.registered and not st.drain:
                    on[host] = slurm_name(p)
            return on if all(h in on for h in hosts) else None

        try:
            got = await wait_for(ready, timeout=within, interval=0.3,
                                 description=f"slurmd pods idle on {hosts}")
        except TimeoutError as e:  # say what the pods, the runtime and Slurm show
            pods = [(slurm_name(p), (p.get("spec") or {}).get("nodeName"),
                     (p.get("status") or {}).get("phase"), pod_state(p))
                    for p in await self.live_pods()]
            r = await asyncio.to_thread(self.slurm.run, ["scontrol", "show", "node", "-o"],
                                        check=False)
            rt, op = self.sstack.runtime, self.sstack.operator
            oplog = op.log("manager", 30, without="ServiceMonitor") if op else "?"
            raise AssertionError(
                f"{e}\npods: {pods}\nruntime errors: {list(rt.errors)[-5:] if rt else '?'}\n"
                f"slurm:\n{r.stdout[-3000:]}\noperator:\n"
                f"{oplog}"
            ) from None
        assert got is not None
        return got

    async def slurm_name_on(self, host: str) -> str:
        for p in await self.live_pods():
            if (p.get("spec") or {}).get("nodeName") == host:
                return slurm_name(p)
        raise NotFoundError(f"no slurmd pod on {host}")

    async def pod_of(self, slurm_node: str) -> dict[str, Any] | None:
        with contextlib.suppress(NotFoundError):
            return await SlinkyPods(self.api, self.namespace).by_slurm_name(slurm_node)
        return None

    async def wait_pod(self, slurm_node: str, check: Callable[[SlurmNodeState], bool],
                       within: float = 120) -> None:
        """Wait until the Slurm state the operator mirrored into the pod passes ``check`` (it
        mirrors on its 30 s re-list of Slurm; on a loaded machine a sync can take as long)."""
        async def probe() -> bool:
            pod = await self.pod_of(slurm_node)
            return pod is not None and check(pod_state(pod))

        await wait_for(probe, timeout=within, description=f"pod conditions of {slurm_node}")

    # -- the daemon ------------------------------------------------------------------------

    def start_daemon(self, *extra: str, crash_log: Path | None = None,
                     leader_election: bool = False) -> Daemon:
        """The real daemon; with ``leader_election``, it leads only while it holds this
        test's Lease (5 s), so another one can take over when it dies."""
        port = free_port()
        n = len(self.daemons)
        log = self.dir / f"daemon-{n}.log"
        election = (["--lease-name", f"healer-{self.tid}", "--lease-duration", "5",
                     "--renew-deadline", "3", "--retry-period", "1"] if leader_election
                    else ["--no-leader-election"])
        argv = [sys.executable, "-m", "tests.integration.flows.daemon_main",
                "--kubeconfig", str(self.stack.kubeconfig), "--install-crd",
                "--policies", str(self.policies), "--signals", str(self.signals),
                "--http-host", "127.0.0.1", "--http-port", str(port),
                "--namespace", self.namespace,
                *election, "--identity", f"flow-{self.tid}-{n}",
                "--log-format", "json", "--shutdown-grace", "2",
                "--slurm-driver", self.driver, "--slurm-namespace", self.namespace,
                "--nodeset", self.nodeset]
        if self.driver in ("slinky", "scontrol"):
            argv += ["--slurm-conf", str(self.slurm.conf)]
        if self.driver == "slurmrestd":
            assert self.bridge is not None
            argv += ["--slurmrestd-url", self.bridge.url, "--slurmrestd-token-secret",
                     f"{self.namespace}/slurm-token:SLURM_JWT"]
        if crash_log is not None:
            argv += ["--crash-log", str(crash_log)]
        argv += list(extra)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMRESTD_"))}
        # the Slurm clients of the stack's Slurm (26.05) first, as on a host with that Slurm
        env["PATH"] = f"{self.slurm.client_bindir}{os.pathsep}{env.get('PATH', '')}"
        d = Daemon.spawn(argv, port=port, log=log, env=env)
        self.daemons.append(d)
        return d

    async def ready(self, d: Daemon, within: float = 90) -> float:
        """Wait for /readyz; returns the seconds since the daemon was started."""
        return await d.ready(within)

    # -- telemetry -------------------------------------------------------------------------

    def gpu(self, node: str, index: int = 3) -> GpuRef:
        return GpuRef(index, f"GPU-{self.tid}-{node}-{index}", f"SN-{self.tid}-{node}-{index}")

    def _signal(self, sig: Signal) -> None:
        with open(self.signals, "a") as f:
            f.write(json.dumps({"node": sig.node, **sig.to_dict()}) + "\n")

    def xid(self, node: str, code: int = 79, gpu: int = 3) -> None:
        self._signal(Signal(node, "file", SignalKind.XID, "DCGM_FI_DEV_XID_ERRORS",
                            float(code), time.time(), self.gpu(node, gpu)))

    def metric(self, node: str, field_name: str, value: float, gpu: int = 3) -> None:
        self._signal(Signal(node, "file", SignalKind.METRIC, field_name, value, time.time(),
                            self.gpu(node, gpu)))

    # -- jobs ------------------------------------------------------------------------------

    async def submit(self, slurm_node: str, *, exit_on_usr1: bool) -> int:
        script = JOB.format(exit_on_usr1=1 if exit_on_usr1 else 0)
        job = await asyncio.to_thread(self.slurm.submit, script, slurm_node,
                                      name=f"train-{self.tid}")
        await asyncio.to_thread(self.slurm.wait_job, job, ("RUNNING",), 60)
        await self.wait_slurm(slurm_node, lambda s: s.busy, what="busy with the job")
        return job

    def release(self, job: int) -> None:
        (self.slurm.jobdir / f"release-{job}").touch()

    def job_file(self, kind: str, job: int) -> str:
        p = self.slurm.jobdir / f"{kind}-{job}"
        return p.read_text() if p.exists() else ""

    def job_end(self, job: int) -> float | None:
        text = self.job_file("end", job).strip()
        return float(text.split()[0]) if text else None

    async def job_state(self, job: int) -> str:
        return await asyncio.to_thread(self.slurm.job_state, job)

    async def job_completed(self, job: int, within: float = 60) -> None:
        """Wait until Slurm reports the job COMPLETED (it passes through COMPLETING while
        slurmctld hears back from the node: on a loaded machine, for a few seconds)."""
        async def done() -> bool:
            return await self.job_state(job) == "COMPLETED"

        try:
            await wait_for(done, timeout=within, description=f"job {job} COMPLETED")
        except TimeoutError:
            raise AssertionError(f"job {job} is {await self.job_state(job)}, "
                                 f"not COMPLETED after {within:.0f}s") from None

    # -- Slurm -----------------------------------------------------------------------------

    async def slurm_state(self, node: str) -> SlurmNodeState | None:
        r = await asyncio.to_thread(self.slurm.run, ["scontrol", "show", "node", node, "-o"],
                                    check=False)
        if r.returncode != 0 or "NodeName=" not in r.stdout:
            return None
        return parse_node_line(r.stdout.strip().splitlines()[0])

    async def wait_slurm(self, node: str, check: Callable[[SlurmNodeState], bool], *,
                         within: float = 60, what: str = "",
                         remediated: str = "") -> SlurmNodeState:
        """Wait until Slurm node ``node`` passes ``check``; with ``remediated`` (a Kubernetes
        node), fail at once when that node's remediation ends (Escalated, Cancelled)."""
        async def probe() -> SlurmNodeState | None:
            if remediated:
                await self.not_ended(remediated)
            st = await self.slurm_state(node)
            return st if st is not None and check(st) else None

        got = await wait_for(probe, timeout=within, interval=0.2,
                             description=f"Slurm node {node} {what}".strip())
        assert got is not None
        return got

    async def sinfo(self, node: str) -> str:
        r = await asyncio.to_thread(self.slurm.run, ["sinfo", "-h", "-N", "-n", node, "-o",
                                                     "%N %T"], check=False)
        return r.stdout.strip()

    def ctld_log(self) -> str:
        return self.slurm.log()[self.ctld_offset:]

    def ctld_reasons(self, node: str) -> list[str]:
        """Every reason slurmctld set on ``node`` during this test (its log)."""
        pat = re.compile(rf"update_node: node {re.escape(node)} reason set to: (.*)$",
                         re.MULTILINE)
        return pat.findall(self.ctld_log())

    def healer_drains(self, node: str) -> list[str]:
        return [r for r in self.ctld_reasons(node) if "healer: " in r]

    def ctld_returns_to_service(self, node: str) -> list[str]:
        """slurmctld's log lines that put ``node`` back in service after healer drained it
        (an undrain or resume shows as ``state set to IDLE/ALLOCATED/MIXED``)."""
        log = self.ctld_log()
        drained = re.search(rf"update_node: node {re.escape(node)} reason set to: .*healer: ",
                            log)
        if drained is None:
            return []
        pat = re.compile(rf"update_node: node {re.escape(node)} state set to "
                         r"(?:IDLE|ALLOCATED|MIXED)\b.*$", re.MULTILINE)
        return pat.findall(log, drained.end())

    # -- remediations ----------------------------------------------------------------------

    async def remediations(self, node: str) -> list[dict[str, Any]]:
        co = client.CustomObjectsApi(self.api)
        raw = await co.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        items = [i for i in raw["items"] if i["spec"]["node"] == node]
        return sorted(items, key=lambda i: i["spec"]["incident"]["openedAt"])

    async def record(self, node: str) -> dict[str, Any]:
        items = await self.remediations(node)
        assert items, f"no NodeRemediation for {node}"
        return items[-1]

    async def phase(self, node: str) -> str:
        items = await self.remediations(node)
        return str((items[-1].get("status") or {}).get("phase", "")) if items else "Healthy"

    async def not_ended(self, node: str, ok: tuple[str, ...] = ()) -> None:
        """Fail at once (with the story) when ``node``'s remediation ended unexpectedly."""
        phase = await self.phase(node)
        if phase in TERMINAL and phase not in ok:
            raise AssertionError(f"{node} ended {phase}:\n{await self.diagnose(node)}")

    async def wait_job_end(self, job: int, node: str, within: float = 120,
                           ok: tuple[str, ...] = ()) -> float:
        """Wait until the job wrote its end marker (checkpointed or released); fails at once
        when ``node``'s remediation ends in a terminal phase not in ``ok``."""
        async def ended() -> float | None:
            await self.not_ended(node, ok)
            return self.job_end(job)

        try:
            got = await wait_for(ended, timeout=within, description=f"job {job} ended")
        except TimeoutError as e:
            raise AssertionError(f"{e}\n{await self.diagnose(node)}") from None
        assert got is not None
        return got

    async def diagnose(self, node: str) -> str:
        parts = []
        with contextlib.suppress(Exception):
            for item in await self.remediations(node):
                st = item.get("status") or {}
                parts.append(f"remediation {item['metadata']['name']}: phase {st.get('phase')}"
                             f" blocked={st.get('blocked')}")
                parts += [f"  {h['from']} -> {h['to']} [{h['trigger']}]"
                          for h in st.get("history") or []]
                parts += [f"  step {s['step']}: {s.get('outcome')} attempts="
                          f"{s.get('attempts')} {s.get('detail', '')} {s.get('error', '')}"
                          for s in st.get("ledger") or []]
        with contextlib.suppress(Exception):
            parts += [f"  event {e.get('reason')}: {e.get('note')}"
                      for e in await self.events(node)]
        with contextlib.suppress(Exception):
            parts += await self._describe_placement()
        if self.sstack.runtime is not None and self.sstack.runtime.errors:
            parts.append("pod runtime errors: " + " | ".join(
                list(self.sstack.runtime.errors)[-5:]))
        if self.sstack.operator is not None:
            parts.append("--- slurm-operator log ---\n" + self.sstack.operator.log(
                "manager", 8))
        for d in self.daemons[-1:]:
            parts.append(f"--- daemon log ({d.log.name}) ---\n{d.tail(25)}")
        return "\n".join(parts)

    async def _describe_placement(self) -> list[str]:
        """Where the NodeSet's pods are and what this test's Nodes offer them (taints, the
        pool label, Ready): what the operator decides a pod's placement on."""
        out = ["slurmd pods: " + ", ".join(
            f"{(p.get('metadata') or {}).get('name')}@{(p.get('spec') or {}).get('nodeName')}"
            f"/{(p.get('status') or {}).get('phase')}"
            f"{'/deleting' if (p.get('metadata') or {}).get('deletionTimestamp') else ''}"
            for p in await self.live_pods())]
        for name in self.nodes:
            n = await self.core.read_node(name)
            ready = {c.type: c.status for c in n.status.conditions or []}.get("Ready")
            taints = [f"{t.key}:{t.effect}" for t in n.spec.taints or []]
            out.append(f"  node {name}: ready={ready} unschedulable={bool(n.spec.unschedulable)}"
                       f" pool={(n.metadata.labels or {}).get(POOL)!r} taints={taints}")
        if self.sstack.runtime is not None:
            out += [f"  runtime {h.event} {h.slurm_name} {h.pod} on {h.node}"
                    for h in self.sstack.runtime.events()[-12:]]
        return out

    def step_done(self, node: str, step: str) -> Callable[[], Awaitable[bool]]:
        """A predicate: ``step`` of ``node``'s remediation has its outcome persisted."""
        async def done() -> bool:
            rec = await self.record(node)
            return any(s["step"] == step and s.get("finishedAt")
                       for s in (rec.get("status") or {}).get("ledger") or [])
        return done

    async def wait_phase(self, node: str, *phases: str, within: float = 120,
                         also: Callable[[], Awaitable[bool]] | None = None) -> dict[str, Any]:
        """Wait until ``node``'s remediation is in one of ``phases`` (and ``also()``); fails
        at once when it ends in another terminal phase."""
        async def probe() -> dict[str, Any] | None:
            items = await self.remediations(node)
            if not items:
                return None
            rec = items[-1]
            phase = (rec.get("status") or {}).get("phase", "")
            if phase in phases:
                if also is None:
                    return rec
                if await also():  # read again: ``also`` saw a newer version than ``rec``
                    fresh = await self.record(node)
                    if (fresh.get("status") or {}).get("phase") in phases:
                        return fresh
                return None
            if phase in TERMINAL:
                raise AssertionError(f"{node} ended {phase}, expected {phases}:\n"
                                     f"{await self.diagnose(node)}")
            return None

        try:
            got = await wait_for(probe, timeout=within, interval=0.25,
                                 description=f"{node} in {phases}")
        except TimeoutError as e:
            raise AssertionError(f"{e}\n{await self.diagnose(node)}") from None
        assert got is not None
        return got

    async def play_repair(self, node: str) -> bool:
        """Report the node repaired once healer handed it over; True once Done."""
        n = await self.core.read_node(node)
        labels = n.metadata.labels or {}
        ann = n.metadata.annotations or {}
        if labels.get("healer.io/repair") == "pending" and "healer.io/repair-result" not in \
                ann and await self.phase(node) == "Repair":
            await self.core.patch_node(node, {"metadata": {"annotations": {
                "healer.io/repair-result": "passed"}}})
        return await self.phase(node) == "Done"

    async def finish_repair(self, node: str, within: float = 60) -> dict[str, Any]:
        async def done() -> bool:
            return await self.play_repair(node)

        try:
            await wait_for(done, timeout=within, description=f"{node} repaired and Done")
        except TimeoutError as e:
            raise AssertionError(f"{e}\n{await self.diagnose(node)}") from None
        return await self.record(node)

    async def events(self, node: str) -> list[dict[str, Any]]:
        """healer's Events about ``node`` from this test's incidents."""
        incidents = {i["spec"]["incident"]["id"] for i in await self.remediations(node)}
        evs = await client.EventsV1Api(self.api).list_namespaced_event(
            self.events_namespace, label_selector=f"healer.io/node={node}")
        out = [self.api.sanitize_for_serialization(e) for e in evs.items]
        return [e for e in out if (e.get("regarding") or {}).get("name") == node
                and _event_key(e).split("/", 1)[0] in incidents]

    async def event_reasons(self, node: str) -> Counter[str]:
        return Counter(str(e.get("reason")) for e in await self.events(node))

    async def event_keys(self, node: str) -> Counter[str]:
        return Counter(_event_key(e) for e in await self.events(node))

    async def claimed_by(self, incident: str) -> list[str]:
        """Nodes that carry (or ever carried) this incident's spare claim."""
        return sorted({s.name for s in self.node_history.samples
                       if s.annotations.get("healer.io/claimed-by") == incident})

    # -- teardown --------------------------------------------------------------------------

    async def teardown(self) -> None:
        for d in self.daemons:
            with contextlib.suppress(Exception):
                d.kill9()
        self.gate.set()
        await self.recorders.stop()
        # this test's jobs go, then its NodeSet: the pods' preStop deletes their Slurm nodes
        await asyncio.to_thread(self.slurm.run, ["scancel", "--name", f"train-{self.tid}"],
                                check=False)
        co = client.CustomObjectsApi(self.api)
        with contextlib.suppress(client.exceptions.ApiException):
            await co.delete_namespaced_custom_object("slinky.slurm.net", "v1beta1",
                                                     self.namespace, "nodesets", self.nodeset)

        async def pods_gone() -> bool:
            return not (await self.core.list_namespaced_pod(
                self.namespace, label_selector="app.kubernetes.io/name=slurmd")).items

        with contextlib.suppress(TimeoutError, client.exceptions.ApiException):
            await wait_for(pods_gone, timeout=60, description="this test's slurmd pods gone")
        with contextlib.suppress(Exception):
            raw = await co.list_cluster_custom_object(GROUP, VERSION, PLURAL)
            for item in raw["items"]:
                if item["spec"]["node"] in self.nodes:
                    with contextlib.suppress(client.exceptions.ApiException):
                        await co.delete_cluster_custom_object(GROUP, VERSION, PLURAL,
                                                              item["metadata"]["name"])
        for n in self.nodes:
            with contextlib.suppress(client.exceptions.ApiException):
                await self.core.delete_node(n)


def _event_key(e: dict[str, Any]) -> str:
    return str(((e.get("metadata") or {}).get("annotations") or {}).get("healer.io/key", ""))


FlowFactory = Callable[..., Awaitable[Flow]]


@pytest.fixture
async def flows(kube_stack: KubeStack, kube_api: client.ApiClient, namespace: str,
                slinky_cluster: SlinkyStack, tmp_path: Path) -> AsyncIterator[FlowFactory]:
    made: list[Flow] = []
    lock = threading.Lock()  # one LocalSlurm daemon operation at a time (they run in threads)

    async def make(mode: str, driver: str, *, spares: bool = True,
                   nodeset: dict[str, Any] | None = None) -> Flow:
        """``nodeset``: options for :func:`healer_dev.devstack.operator.nodeset` (e.g.
        ``host_network=True``, ``update_strategy={...}``)."""
        assert not made, "one flow per test"
        tid = secrets.token_hex(3)
        f = Flow(kube_stack, kube_api, slinky_cluster, namespace, mode, driver, tid, tmp_path,
                 layout(mode, tid), lock, nodeset_options=dict(nodeset or {}))
        made.append(f)
        await f.setup(spares=spares)
        return f

    try:
        yield make
    finally:
        for f in made:
            await f.teardown()
