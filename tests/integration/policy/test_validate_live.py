"""``healer validate --kubeconfig`` against the real kube-apiserver of the local stack (issue 22
item 1): per NodeSet, how many nodes and warm spares it selects now; a node that is both a
NodeSet's node and a spare, and a NodeSet that serves nothing, are problems (exit 1) naming
the document. Run as the installed command (``python -m healer``), end to end."""

from __future__ import annotations

import asyncio
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import fake_node

POLICIES = """\
apiVersion: healer.io/v1alpha1
kind: SlurmNodeSet
metadata: {{name: a-{tid}}}
spec:
  cluster: west
  slurm: {{driver: scontrol, slurmConf: /etc/slurm/west.conf}}
  nodeSelector: {{matchLabels: {{v-pool: a-{tid}}}}}
  spareSelector: {{matchLabels: {{healer.io/role: spare, v-spare: "{tid}"}}}}
---
apiVersion: healer.io/v1alpha1
kind: SlurmNodeSet
metadata: {{name: b-{tid}}}
spec:
  cluster: east
  slurm: {{driver: scontrol, slurmConf: /etc/slurm/east.conf}}
  nodeSelector: {{matchLabels: {{v-pool: b-{tid}}}}}
  spareSelector: {{matchLabels: {{healer.io/role: spare, v-spare: "{tid}"}}}}
---
apiVersion: healer.io/v1alpha1
kind: SlurmNodeSet
metadata: {{name: c-{tid}}}
spec:
  cluster: west
  slurm: {{driver: scontrol, slurmConf: /etc/slurm/west.conf}}
  nodeSelector: {{matchLabels: {{v-tier: "{tid}"}}}}
"""


@pytest.fixture
async def nodes(kube_api: client.ApiClient) -> AsyncIterator[tuple[str, list[str]]]:
    tid = secrets.token_hex(3)
    core = client.CoreV1Api(kube_api)
    spare = {"healer.io/role": "spare", "v-spare": tid}
    wanted = {
        f"v-{tid}-a1": {"v-pool": f"a-{tid}"}, f"v-{tid}-a2": {"v-pool": f"a-{tid}"},
        f"v-{tid}-a3": {"v-pool": f"a-{tid}", "v-tier": tid},
        f"v-{tid}-b1": {"v-pool": f"b-{tid}"},
        f"v-{tid}-s1": spare, f"v-{tid}-s2": spare,
        f"v-{tid}-both": {"v-pool": f"a-{tid}", **spare},
    }
    created: list[str] = []
    try:
        for name, labels in wanted.items():
            await core.create_node(fake_node(name, labels=labels))  # type: ignore[arg-type]
            created.append(name)
        yield tid, created
    finally:
        for name in created:
            try:
                await core.delete_node(name)
            except client.exceptions.ApiException as e:
                if e.status != 404:
                    raise


async def _validate(policies: Path, kubeconfig: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "healer", "validate", str(policies), "--kubeconfig",
        str(kubeconfig), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_validate_counts_nodes_and_spares_per_nodeset_on_the_real_api_server(
        kube_stack: KubeStack, kube_api: client.ApiClient, nodes: tuple[str, list[str]],
        tmp_path: Path) -> None:
    tid, _ = nodes
    f = tmp_path / "nodesets.yaml"
    f.write_text(POLICIES.format(tid=tid))
    rc, out, err = await _validate(f, kube_stack.kubeconfig)
    assert rc == 1, (out, err)
    assert f"nodeset a-{tid}" in out
    line = {ln.split()[1]: ln for ln in out.splitlines() if ln.startswith("nodeset ")}
    assert "nodes=4 spares=3" in line[f"a-{tid}"], out  # a1 a2 a3 both; s1 s2 both
    assert "nodes=1 spares=3" in line[f"b-{tid}"], out
    assert "nodes=0" in line[f"c-{tid}"], out
    assert "1 of its selected nodes belong to an earlier" in line[f"c-{tid}"], out
    problems = [ln for ln in err.splitlines() if ln.startswith(f"{f}:")]
    assert any(f"1 node(s) of SlurmNodeSet 'a-{tid}' also match a spare selector "
               f"(v-{tid}-both)" in p and ": spec.nodeSelector: " in p for p in problems), err
    assert any(f"SlurmNodeSet 'c-{tid}' serves no node" in p and f"{f}:19: spec.nodeSelector:" in p
               for p in problems), err
    assert "2 problem(s) on the cluster" in err

    # the labels fixed: no problem, and the counts follow
    core = client.CoreV1Api(kube_api)
    await core.delete_node(f"v-{tid}-both")
    await core.patch_node(f"v-{tid}-b1", {"metadata": {"labels": {"v-tier": tid,
                                                                  "v-pool": None}}})
    rc, out, err = await _validate(f, kube_stack.kubeconfig)
    assert rc == 0, (out, err)
    line = {ln.split()[1]: ln for ln in out.splitlines() if ln.startswith("nodeset ")}
    assert "nodes=3 spares=2" in line[f"a-{tid}"], out
    assert "nodes=0 spares=2" in line[f"b-{tid}"], out  # selects nothing now: said, not refused
    assert "nodes=1" in line[f"c-{tid}"], out


async def test_validate_with_a_kubeconfig_that_is_not_there_says_so_in_one_line(
        tmp_path: Path, kube_stack: KubeStack) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(POLICIES.format(tid="x"))
    rc, _, err = await _validate(f, tmp_path / "missing-kubeconfig")
    assert rc == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "missing-kubeconfig" in err
