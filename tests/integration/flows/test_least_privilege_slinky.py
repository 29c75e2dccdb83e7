"""The Slinky path under exactly the chart's RBAC (issue 12): the real daemon, as the chart's
ServiceAccount (a TokenRequest token), drives an XID 79 through SchedMD's real operator to
Repair — cordon-reason annotation, cordon, the slurmd pod's eviction in the Slurm namespace, the
NodeSet read, the spare claim, topology — with no request refused; and what the chart does not
grant (pods and evictions elsewhere, Secrets, ConfigMaps, other Nodes' deletion) is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from healer_dev.devstack import binaries
from healer_dev.devstack.kube import KubeStack
from tests.integration.conftest import api_client_for
from tests.integration.daemon_process import ROOT
from tests.integration.flows.checks import incident_of
from tests.integration.flows.conftest import FlowFactory
from tests.integration.kube_tokens import sa_token, token_kubeconfig

CHART = ROOT / "deploy" / "helm" / "healer"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def _run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=90, check=False,
                       **kw)
    assert r.returncode == 0, f"{argv}\n{r.stdout}\n{r.stderr}"
    return r


def chart_rbac(tmp: Path, release: str, namespace: str) -> list[dict[str, Any]]:
    """The chart's RBAC objects for a release in ``namespace`` whose Slurm cluster is there too."""
    helm = binaries.component_dir("helm") / "helm"
    env = {"HELM_CONFIG_HOME": str(tmp / "cfg"), "HELM_CACHE_HOME": str(tmp / "cache"),
           "HELM_DATA_HOME": str(tmp / "data"), "PATH": "/usr/bin:/bin"}
    r = _run([str(helm), "template", release, str(CHART), "--namespace", namespace,
              "--set", f"fullnameOverride={release}", "--set", f"slurm.namespace={namespace}"],
             env=env)
    return [d for d in yaml.safe_load_all(r.stdout) if d and d["kind"] in RBAC_KINDS]


@pytest.mark.timeout(420)
async def test_slinky_flow_runs_with_the_charts_rbac_and_nothing_more(
        flows: FlowFactory, kube_stack: KubeStack, kube_api: client.ApiClient,
        tmp_path: Path) -> None:
    f = await flows("StatefulSet", "slinky")
    release = f"healer-lp-{secrets.token_hex(3)}"
    objs = await asyncio.to_thread(chart_rbac, tmp_path, release, f.namespace)
    manifest = tmp_path / "rbac.yaml"
    manifest.write_text(yaml.safe_dump_all(objs))
    kubectl = [str(kube_stack.binaries.kubectl), "--kubeconfig", str(kube_stack.kubeconfig)]
    await asyncio.to_thread(_run, [*kubectl, "apply", "--server-side", "-f", str(manifest)])
    try:
        token = await sa_token(kube_api, f.namespace, release)
        cfg = await token_kubeconfig(kube_stack, token, tmp_path / "sa.kubeconfig")
        bad = f.lay.gpus[1]
        sn = await f.slurm_name_on(bad)
        d = f.start_daemon("--kubeconfig", str(cfg))  # the last --kubeconfig wins
        await f.ready(d)
        f.xid(bad)
        rec = await f.wait_phase(bad, "Repair", within=240,
                                 also=f.step_done(bad, "mark-repair"))
        assert rec["status"]["spare"] == f.lay.spare_a
        pod = await f.pod_of(sn)
        assert pod is not None
        assert pod["spec"]["nodeName"] == f.lay.spare_a  # evicted in the Slurm namespace
        assert incident_of(rec)
        log = d.tail(600)
        for refused in ("HTTP 403", "Forbidden", "forbidden"):
            assert refused not in log, log
        assert d.terminate() == 0

        sa = await api_client_for(cfg)
        try:
            core = client.CoreV1Api(sa)
            review = await client.AuthenticationV1Api(sa).create_self_subject_review({})  # type: ignore[arg-type]
            assert review.status.user_info.username == \
                f"system:serviceaccount:{f.namespace}:{release}"
            await core.list_namespaced_pod(f.namespace)  # granted: the Slurm namespace
            eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                        "metadata": {"name": "anything", "namespace": "default"}}
            refused = [
                lambda: core.list_namespaced_pod("default"),
                lambda: core.list_pod_for_all_namespaces(),
                lambda: core.create_namespaced_pod_eviction("anything", "default", eviction),
                lambda: core.list_namespaced_secret(f.namespace),
                lambda: core.read_namespaced_config_map("anything", f.namespace),
                lambda: core.delete_node(bad),
            ]
            for attempt in refused:
                with pytest.raises(client.exceptions.ApiException) as e:
                    await attempt()
                assert e.value.status == 403, e.value
        finally:
            await sa.close()
    finally:
        for o in objs:
            if "namespace" not in o["metadata"] or o["metadata"]["namespace"] == "default":
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(
                        subprocess.run, [*kubectl, "delete", "--ignore-not-found",
                                         "--wait=false", "-n",
                                         o["metadata"].get("namespace", "default"),
                                         f"{o['kind'].lower()}/{o['metadata']['name']}"],
                        capture_output=True, timeout=60, check=False)
