"""The replacement's registration check (healer.adapters.slurm.registration) and the topology
step's use of it: table-driven, no I/O. The same checks run against the real Slurm 26.05 in
tests/integration/slinky/test_registration.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from healer.adapters.slurm.parse import parse_node_json, parse_node_line
from healer.adapters.slurm.registration import (
    Declared,
    conf_items,
    declared_by_pod,
    gpu_count,
    registration_problems,
)
from healer.adapters.topology_step import KubeTopology
from healer.core.model import NodeView
from healer.core.topology import TOPOLOGY_ANNOTATION
from healer.ports import SlurmNodeState, StepOutcome
from healer_dev.testing import FakeNodes

SPEC = "default:spine1:leaf1"
TIERS = {"fabric.topograph.run/tier-0": "leaf1", "fabric.topograph.run/tier-1": "spine1"}

# what `scontrol show node -o` printed on the real Slurm 26.05.5 and 24.11.5 here (cut)
LINE_2605_INVALID = (
    "NodeName=dyn-2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.70 "
    "AvailableFeatures=a,b ActiveFeatures=a,b Gres=gpu:h100:1 NodeAddr=127.0.0.11 "
    "NodeHostName=vm Version=26.05.5 OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0  "
    "RealMemory=1000 AllocMem=0 FreeMem=21193 Sockets=2 Boards=1 "
    "State=IDLE+DRAIN+DYNAMIC_NORM+INVALID_REG ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
    "MCS_label=N/A Partitions=gpu  BootTime=2026-11-28T03:29:03 "
    "SlurmdStartTime=2026-11-28T03:57:43 LastBusyTime=2026-11-28T03:57:43 "
    "ResumeAfterTime=None SuspendTime=INFINITE CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES= "
    "CurrentWatts=0 AveWatts=0 Reason=Failed to set topology 'CoreSpecCount=1' "
    "[slurm@2026-11-28T03:57:43]")
LINE_2605_TOPO = (
    "NodeName=dyn-1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 "
    "AvailableFeatures=x ActiveFeatures=x Gres=gpu:h100:2 NodeAddr=127.0.0.20 NodeHostName=vm "
    "Version=26.05.5 OS=Linux 6.18.44 #1 SMP @0  RealMemory=1000 State=IDLE+DYNAMIC_NORM "
    "ThreadsPerCore=1 Partitions=gpu  CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES= "
    "CurrentWatts=0 AveWatts=0 Topology=default:nvl-b")
LINE_2411 = (
    "NodeName=dyn-1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.51 "
    "AvailableFeatures=a,b ActiveFeatures=a,b Gres=gpu:h100:1 NodeAddr=127.0.0.10 "
    "NodeHostName=vm Version=24.11.5 OS=Linux 6.18.44 #1 SMP @0  RealMemory=1000 "
    "State=IDLE+DYNAMIC_NORM ThreadsPerCore=1 Partitions=gpu")
LINE_2205 = (
    "NodeName=gpu-1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=2 AvailableFeatures=(null) "
    "ActiveFeatures=(null) Gres=gpu:h100:8 NodeAddr=127.0.0.1 NodeHostName=gpu-1 Port=16901 "
    "Version=22.05.8 OS=Linux 6.1 #1 SMP  RealMemory=1000 State=IDLE+DRAIN ThreadsPerCore=1 "
    "Reason=healer: XID 79 [root@2026-01-02T03:04:05]")


@pytest.mark.parametrize(("line", "flags", "features", "gres", "topology", "reports"), [
    (LINE_2605_INVALID, {"DRAIN", "DYNAMIC_NORM", "INVALID_REG"}, {"a", "b"}, "gpu:h100:1", "",
     True),
    (LINE_2605_TOPO, {"DYNAMIC_NORM"}, {"x"}, "gpu:h100:2", "default:nvl-b", True),
    (LINE_2411, {"DYNAMIC_NORM"}, {"a", "b"}, "gpu:h100:1", "", False),
    (LINE_2205, {"DRAIN"}, set(), "gpu:h100:8", "", False),
])
def test_scontrol_lines_of_every_version(line: str, flags: set[str], features: set[str],
                                         gres: str, topology: str, reports: bool) -> None:
    st = parse_node_line(line)
    assert st.base == "IDLE"
    assert st.flags == flags
    assert st.features == features
    assert st.gres == gres
    assert st.topology == topology
    assert st.reports_topology is reports
    assert st.invalid_registration is ("INVALID_REG" in flags)


def test_the_invalid_26_05_line_keeps_slurms_reason_and_user() -> None:
    st = parse_node_line(LINE_2605_INVALID)
    assert st.reason == "Failed to set topology 'CoreSpecCount=1'"
    assert st.reason_user == "slurm"
    assert st.drain
    assert not st.reason_is_ours


@pytest.mark.parametrize(("obj", "reports", "features"), [
    ({"name": "n", "state": ["IDLE"], "topology": "", "features": ["a"]}, True, {"a"}),
    ({"name": "n", "state": ["IDLE"], "topology": None, "features": []}, False, set()),
    ({"name": "n", "state": "idle", "features": "a,b"}, False, {"a", "b"}),
])
def test_json_nodes_say_whether_topology_is_reported(obj: dict[str, Any], reports: bool,
                                                     features: set[str]) -> None:
    st = parse_node_json(obj)
    assert st.reports_topology is reports
    assert st.features == features


@pytest.mark.parametrize(("gres", "n"), [
    ("gpu:h100:8", 8), ("gpu:8", 8), ("gpu:h100:4(S:0),gpu:a100:2", 6), ("", 0),
    ("gpu:h100:8(S:0-1),nic:2", 8), ("(null)", 0), ("mps:100", 0),
])
def test_gpu_count(gres: str, n: int) -> None:
    assert gpu_count(gres) == n


def test_conf_items_as_the_operator_quotes_them() -> None:
    assert conf_items(["-Z", "--conf", "'Features=a,b Topology= Weight=5'"]) == {
        "Features": "a,b", "Topology": "", "Weight": "5"}
    assert conf_items(["--conf=gres=gpu:h100:8"]) == {"Gres": "gpu:h100:8"}


def slurmd_pod(args: list[str], gpus: str | None = None, *, host: str = "spare",
               conditions: list[dict[str, str]] | None = None) -> dict[str, Any]:
    res = {"limits": {"nvidia.com/gpu": gpus}} if gpus is not None else {}
    return {"metadata": {"name": "worker-0", "namespace": "slurm",
                         "annotations": {TOPOLOGY_ANNOTATION: SPEC},
                         "labels": {"app.kubernetes.io/name": "slurmd"}},
            "spec": {"nodeName": host, "hostname": "worker-0",
                     "containers": [{"name": "slurmd", "args": args, "resources": res}]},
            "status": {"conditions": conditions or []}}


def test_declared_by_pod() -> None:
    assert declared_by_pod(slurmd_pod(["--conf", "'Features=w,rack1'"], "8")) == \
        Declared(frozenset({"w", "rack1"}), 8)
    assert declared_by_pod(slurmd_pod(["--conf", "'Features=w Gres=gpu:h100:4'"], "8")) == \
        Declared(frozenset({"w"}), 4)
    assert declared_by_pod(slurmd_pod([])) == Declared()
    assert declared_by_pod({"spec": {}}) == Declared()


OK = SlurmNodeState("w", "IDLE", frozenset({"DYNAMIC_NORM"}), features=frozenset({"w"}),
                    gres="gpu:h100:8")


@pytest.mark.parametrize(("st", "declared", "expect"), [
    (OK, Declared(frozenset({"w"}), 8), []),
    (OK, Declared(), []),
    (SlurmNodeState("w", "IDLE", frozenset({"DRAIN", "INVALID_REG"}),
                    reason="Failed to set topology 'Weight=5'", features=frozenset({"w"})),
     Declared(frozenset({"w"})), ["INVALID_REG: Failed to set topology 'Weight=5'"]),
    (OK, Declared(frozenset({"w", "ib"}), 8), ["features ib declared"]),
    (OK, Declared(frozenset({"w"}), 4), ["Slurm counts 8 GPUs"]),
    (SlurmNodeState("w", "IDLE", features=frozenset({"w"})), Declared(frozenset({"w"}), 8),
     ["reports no GRES"]),
])
def test_registration_problems(st: SlurmNodeState, declared: Declared,
                               expect: list[str]) -> None:
    problems = registration_problems(st, declared)
    assert len(problems) == len(expect), problems
    for p, e in zip(problems, expect, strict=True):
        assert e in p


@dataclass
class Slurm:
    st: SlurmNodeState

    async def state(self, node: str) -> SlurmNodeState:
        return self.st


@dataclass
class Pods:
    items: list[dict[str, Any]] = field(default_factory=list)

    async def pods(self) -> list[dict[str, Any]]:
        return self.items


def topo_world(st: SlurmNodeState, pod: dict[str, Any],
               copies: bool | None = True) -> KubeTopology:
    nodes = FakeNodes([NodeView("spare", dict(TIERS), {TOPOLOGY_ANNOTATION: SPEC})])

    async def probe() -> bool | None:
        return copies

    return KubeTopology(nodes, pods=Pods([pod]), slurm=Slurm(st), copies_topology=probe)


ARGS = ["-Z", "--conf", "'Features=w'"]


async def test_an_invalid_registration_fails_the_step_and_says_why() -> None:
    st = SlurmNodeState("worker-0", "IDLE", frozenset({"DRAIN", "INVALID_REG"}),
                        reason="Failed to set topology 'Weight=5'", features=frozenset({"w"}),
                        gres="gpu:h100:8", reports_topology=True)
    r = await topo_world(st, slurmd_pod(ARGS, "8")).annotate("i", "spare", "worker-0")
    assert r.outcome is StepOutcome.FAILED
    assert "worker-0 on spare did not register validly" in r.detail
    assert "Failed to set topology 'Weight=5'" in r.detail
    assert "healer does not undrain it" in r.detail


async def test_slurms_refusal_fails_before_the_operator_copied_the_annotation() -> None:
    """Slurm is read right after the placement: a refused registration does not wait for the
    operator's copy of the annotation (nor for the pod to mirror the refusal)."""
    st = SlurmNodeState("worker-0", "IDLE", frozenset({"DRAIN", "INVALID_REG"}),
                        reason="Failed to set topology 'Weight=5'", features=frozenset({"w"}),
                        gres="gpu:h100:8", reports_topology=True)
    pod = slurmd_pod(ARGS, "8")
    pod["metadata"]["annotations"] = {}  # not copied yet
    r = await topo_world(st, pod).annotate("i", "spare", "worker-0")
    assert r.outcome is StepOutcome.FAILED, r.detail
    assert "Failed to set topology 'Weight=5'" in r.detail
    valid = SlurmNodeState("worker-0", "IDLE", features=frozenset({"w"}), gres="gpu:h100:8",
                           reports_topology=True)
    r = await topo_world(valid, pod).annotate("i", "spare", "worker-0")
    assert r.outcome is StepOutcome.PENDING
    assert "has not propagated" in r.detail


async def test_the_pods_mirrored_invalid_reg_fails_without_slurms_api() -> None:
    pod = slurmd_pod(ARGS, "8", conditions=[
        {"type": "SlurmNodeStateIdle", "status": "True"},
        {"type": "SlurmNodeStateInvalidReg", "status": "True"},
        {"type": "SlurmNodeStateDrain", "status": "True", "message": "Failed to set topology"}])
    topo = topo_world(OK, pod)
    topo.slurm = None
    r = await topo.annotate("i", "spare", "worker-0")
    assert r.outcome is StepOutcome.FAILED
    assert "INVALID_REG on pod slurm/worker-0" in r.detail


async def test_a_gpu_count_other_than_declared_fails() -> None:
    st = SlurmNodeState("worker-0", "IDLE", features=frozenset({"w"}), gres="gpu:h100:7",
                        topology=SPEC, reports_topology=True)
    r = await topo_world(st, slurmd_pod(ARGS, "8")).annotate("i", "spare", "worker-0")
    assert r.outcome is StepOutcome.FAILED
    assert "Slurm counts 7 GPUs (GRES gpu:h100:7), the NodeSet declares 8" in r.detail


@pytest.mark.parametrize(("copies", "outcome", "said"), [
    (True, StepOutcome.PENDING, "Slurm has no topology for worker-0 yet"),
    (None, StepOutcome.PENDING, "Slurm has no topology for worker-0 yet"),
    (False, StepOutcome.DONE, "nothing pushes it"),
])
async def test_an_unset_topology_string_is_awaited_where_the_operator_pushes_it(
        copies: bool | None, outcome: StepOutcome, said: str) -> None:
    st = SlurmNodeState("worker-0", "IDLE", features=frozenset({"w"}), gres="gpu:h100:8",
                        reports_topology=True)
    pod = slurmd_pod(ARGS, "8")
    if copies is False:
        pod["metadata"]["annotations"] = {}
    r = await topo_world(st, pod, copies).annotate("i", "spare", "worker-0")
    assert r.outcome is outcome, r.detail
    assert said in r.detail
