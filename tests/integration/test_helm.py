"""The Helm chart (deploy/helm/healer): lint, render, and apply to the real API server.

helm is the v3 binary ``hack/build-k8s.sh`` builds from the Go module proxy into the cache; when
it cannot be built or run every test here FAILS. The rendered objects are checked against what
the plain manifests in deploy/ say (least-privilege RBAC, the CRD, the default policies), then
applied with ``kubectl apply --server-side --dry-run=server`` to the local kube-apiserver, with
the NodeRemediation CRD and minimal prometheus-operator CRDs installed for real first and the
target namespaces created for real (Pod Security "restricted", warn and enforce).
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from healer.cli import add_run_flags
from healer.errors import ConfigError
from healer_dev.devstack import binaries
from healer_dev.devstack.kube import KubeStack

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "healer"
CRD_FILE = "noderemediations.healer.io.yaml"
RULES_SOURCE = ROOT / "deploy" / "prometheus" / "healer-rules.yaml"
RULES_COPY = CHART / "files" / "healer-rules.yaml"
RELEASE = "healer"

Obj = dict[str, Any]

# Every switch on: the agent, the ServiceMonitor, the PrometheusRule, the slurmrestd driver.
# `slurm.namespace` is filled in per test (the token Secret's Role lives there).
ALL_ON: Obj = {
    "dryRun": False,
    "slurm": {
        "driver": "slurmrestd",
        "nodeset": "gpu-nodes",
        "slurmrestd": {
            "url": "http://slurmrestd.slurm.svc:6820",
            "tokenSecret": {"name": "slurm-token-healer", "key": "auth-token"},
        },
    },
    "prometheus": {"url": "http://prometheus-operated.monitoring.svc:9090", "pollInterval": 30},
    "agent": {"enabled": True},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {
        "enabled": True,
        "labels": {"release": "kube-prometheus-stack"},
        "groups": [{"name": "healer-test", "rules": [
            {"alert": "HealerControllerDown", "expr": 'up{job="healer-metrics"} == 0',
             "for": "5m", "labels": {"severity": "critical"},
             "annotations": {"summary": "no healer controller is scraped"}},
        ]}],
    },
}


# ---------------------------------------------------------------------------------------------
# helm and kubectl


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """The cached helm (built first when missing); a failure to build or run it FAILS."""
    error = ""
    try:
        if binaries.missing(["helm"]):
            binaries.build(["helm"], echo=True)
    except ConfigError as e:
        error = str(e)
    if error:
        pytest.fail(f"helm could not be built:\n{error}", pytrace=False)
    h = Helm(binaries.component_dir("helm") / "helm", tmp_path_factory.mktemp("helm-home"))
    r = h.run("version", "--short")
    if r.returncode != 0 or not r.stdout.startswith("v3."):
        pytest.fail(f"helm does not run: rc={r.returncode}\n{r.stdout}{r.stderr}", pytrace=False)
    return h


class Helm:
    def __init__(self, path: Path, home: Path) -> None:
        self.path = path
        self.home = home
        # no user configuration, repositories or kubeconfig leak in; nothing is written outside
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("HELM_") and k != "KUBECONFIG"}
        for var, sub in (("HELM_CONFIG_HOME", "config"), ("HELM_CACHE_HOME", "cache"),
                         ("HELM_DATA_HOME", "data")):
            self.env[var] = str(home / sub)

    def run(self, *args: str | Path, kubeconfig: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
        env = dict(self.env)
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        return subprocess.run([str(self.path), *map(str, args)], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=90, check=False)

    def template(self, *args: str | Path, namespace: str = "healer-system",
                 release: str = RELEASE) -> list[Obj]:
        r = self.run("template", release, CHART, "--namespace", namespace, *args)
        assert r.returncode == 0, r.stderr
        return [d for d in yaml.safe_load_all(r.stdout) if d]


def values_file(tmp_path: Path, values: Obj, name: str = "values.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(values, sort_keys=False))
    return p


def all_on(slurm_namespace: str = "slurm") -> Obj:
    v: Obj = yaml.safe_load(yaml.safe_dump(ALL_ON))  # a deep copy
    v["slurm"]["namespace"] = slurm_namespace
    return v


def kubectl(stack: KubeStack, *args: str | Path, timeout: float = 60
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(stack.binaries.kubectl), "--kubeconfig", str(stack.kubeconfig),
                           *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, check=False)


def ok(r: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert r.returncode == 0, f"{r.args}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


# ---------------------------------------------------------------------------------------------
# the rendered objects


def by_kind(objs: Sequence[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: Sequence[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in by_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} found"
    return found[0]


POD_IP = "10.1.2.3"


def kubelet_expand(args: list[str]) -> list[str]:
    """What the container sees: the kubelet expands $(POD_IP) from the downward-API env."""
    return [a.replace("$(POD_IP)", POD_IP) for a in args]


def parse_run_args(args: list[str]) -> argparse.Namespace:
    """The controller's args through healer's own `healer run` parser: every flag must exist."""
    assert args[0] == "run", args
    p = argparse.ArgumentParser(prog="healer run")
    add_run_flags(p)
    parsed, unknown = p.parse_known_args(kubelet_expand(args[1:]))
    assert unknown == [], f"`healer run` has no such flags: {unknown}"
    return parsed


def parse_agent_args(args: list[str]) -> argparse.Namespace:
    """The agent's args through `healer agent`'s own parser."""
    from healer.agent.main import add_agent_flags

    assert args[0] == "agent", args
    p = argparse.ArgumentParser(prog="healer agent")
    add_agent_flags(p)
    parsed, unknown = p.parse_known_args(kubelet_expand(args[1:]))
    assert unknown == [], f"`healer agent` has no such flags: {unknown}"
    return parsed


def rules_of(objs: Sequence[Obj]) -> list[tuple[str, str, Obj]]:
    return [(o["kind"], o["metadata"]["name"], r)
            for o in objs if o["kind"] in ("Role", "ClusterRole") for r in o.get("rules", [])]


def secret_rules(objs: Sequence[Obj]) -> list[tuple[str, str, Obj]]:
    return [(k, n, r) for k, n, r in rules_of(objs)
            if "secrets" in r.get("resources", []) or "*" in r.get("resources", [])
            or "*" in r.get("apiGroups", [])]


def normalized_rbac(objs: Sequence[Obj], fullname: str) -> dict[tuple[str, str, str], Obj]:
    """RBAC objects keyed by (kind, name without the fullname prefix, namespace role), with
    labels and names of the release taken out: what must equal deploy/rbac.yaml."""
    out: dict[tuple[str, str, str], Obj] = {}
    for o in objs:
        if o["kind"] not in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                             "RoleBinding"):
            continue
        name = o["metadata"]["name"]
        assert name.startswith(fullname), name
        ns = o["metadata"].get("namespace", "")
        ns_role = {"": "", "default": "events", "slurm": "slurm"}.get(ns, "release")
        body: Obj = {k: v for k, v in o.items() if k not in ("metadata", "apiVersion", "kind")}
        if "roleRef" in body:
            body["roleRef"] = {**body["roleRef"],
                               "name": body["roleRef"]["name"].removeprefix(fullname)}
        if "subjects" in body:
            body["subjects"] = [{**s, "name": s["name"].removeprefix(fullname),
                                 "namespace": "release"} for s in body["subjects"]]
        out[(o["kind"], name.removeprefix(fullname), ns_role)] = body
    return out


def assert_restricted_container(c: Obj) -> None:
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False, c["name"]
    assert sc["readOnlyRootFilesystem"] is True, c["name"]
    assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
    assert not sc.get("privileged"), c["name"]


def assert_restricted_pod(spec: Obj) -> None:
    psc = spec["securityContext"]
    assert psc["runAsNonRoot"] is True
    assert psc["runAsUser"] != 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(host), host
    assert all("hostPath" not in v for v in spec.get("volumes", [])), spec["volumes"]
    for c in spec["containers"]:
        assert_restricted_container(c)


def env_of(c: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in c.get("env", [])}


# ---------------------------------------------------------------------------------------------
# lint and files


def test_lint_default_strict_and_all_on(helm: Helm, tmp_path: Path) -> None:
    on = values_file(tmp_path, all_on())
    for args in ((), ("--strict",), ("--strict", "-f", str(on))):
        r = helm.run("lint", CHART, *args)
        assert r.returncode == 0, f"helm lint {' '.join(args)}\n{r.stdout}{r.stderr}"
        assert "1 chart(s) linted, 0 chart(s) failed" in r.stdout, r.stdout
        assert "[ERROR]" not in r.stdout, r.stdout
        assert "[WARNING]" not in r.stdout, r.stdout


def test_crd_is_byte_identical_to_deploy_and_rendered_with_include_crds(helm: Helm) -> None:
    chart_crd = (CHART / "crds" / CRD_FILE).read_bytes()
    assert chart_crd == (ROOT / "deploy" / "crds" / CRD_FILE).read_bytes()
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == [CRD_FILE]
    objs = helm.template("--include-crds")
    crd = one(objs, "CustomResourceDefinition")
    assert crd == yaml.safe_load(chart_crd)
    # without --include-crds (what `helm template` users pipe) no CRD is rendered twice
    assert not by_kind(helm.template(), "CustomResourceDefinition")


def test_prometheus_rules_copy_equals_the_source() -> None:
    assert RULES_SOURCE.is_file(), f"{RULES_SOURCE.relative_to(ROOT)} is missing"
    assert RULES_COPY.read_bytes() == RULES_SOURCE.read_bytes(), (
        f"{RULES_COPY.relative_to(ROOT)} is stale: cp {RULES_SOURCE.relative_to(ROOT)} "
        f"{RULES_COPY.relative_to(ROOT)}")


def test_default_policies_are_policies_default_yaml_observe_only_and_validate(
        helm: Helm, tmp_path: Path) -> None:
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    source = (ROOT / "policies" / "default.yaml").read_text()
    assert chart_values["policies"] == {"default.yaml": source}
    cm = one(helm.template(), "ConfigMap", f"{RELEASE}-policies")
    assert cm["data"] == {"default.yaml": source}
    d = tmp_path / "policies"
    d.mkdir()
    for name, text in cm["data"].items():
        (d / name).write_text(text)
    r = subprocess.run([sys.executable, "-m", "healer", "validate", str(d)], capture_output=True,
                       text=True, cwd=ROOT, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("ok ")]
    assert len(lines) >= 2, r.stdout
    assert all("mode=observe" in ln for ln in lines), r.stdout


# ---------------------------------------------------------------------------------------------
# helm template: default values


def test_template_default_is_observe_only_least_privilege(helm: Helm) -> None:
    objs = helm.template()
    assert Counter(o["kind"] for o in objs) == {
        "ServiceAccount": 1, "ClusterRole": 2, "ClusterRoleBinding": 1, "Role": 2,
        "RoleBinding": 3, "ConfigMap": 1, "Service": 1, "Deployment": 1,
        "PodDisruptionBudget": 1, "NetworkPolicy": 1}
    for o in objs:
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert "namespace" in o["metadata"], o["metadata"]

    dep = one(objs, "Deployment", RELEASE)
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    assert_restricted_pod(spec)
    assert spec["serviceAccountName"] == RELEASE
    [c] = spec["containers"]
    assert c["image"] == "ghcr.io/healer-project/healer:0.1.0"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["resources"]["requests"]
    assert c["resources"]["limits"]["memory"]
    env = env_of(c)
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/etc/healer/policies"]["readOnly"] is True
    assert "/tmp" in mounts  # the one writable place, an emptyDir
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols[mounts["/etc/healer/policies"]["name"]]["configMap"]["name"] == "healer-policies"

    args = parse_run_args(c["args"])
    assert args.dry_run is True  # values dryRun: true → --dry-run
    assert args.policies == ["/etc/healer/policies"]
    assert args.slurm_driver == "slinky"
    assert args.slurm_namespace == "slurm"
    assert args.slurmrestd_url == ""
    assert args.slurmrestd_token_secret == ""
    assert args.lease_name == "healer-leader"
    assert args.http_port == 8080
    assert args.http_host == POD_IP  # the pod's own address, not 0.0.0.0
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert args.debug_state is False  # /debug/state off
    assert args.callback_url == ""  # no webhook hook in the default policies
    assert "--slurmrestd-url" not in str(c["args"])
    assert not any(a.startswith(("--prometheus-url", "--nodeset")) for a in c["args"])

    # the Service and the PDB select exactly the controller pods
    labels = pod["metadata"]["labels"]
    sel = dep["spec"]["selector"]["matchLabels"]
    assert sel.items() <= labels.items()
    assert sel["app.kubernetes.io/component"] == "controller"
    svc = one(objs, "Service", f"{RELEASE}-metrics")
    assert svc["spec"]["selector"] == sel
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http",
                                     "protocol": "TCP"}]
    pdb = one(objs, "PodDisruptionBudget", RELEASE)
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": sel}}

    # no Secret permission at all without the slurmrestd driver
    assert secret_rules(objs) == []
    # RBAC: exactly deploy/rbac.yaml (names prefixed by the release's fullname)
    deploy_rbac = [d for d in yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text())
                   if d]
    assert normalized_rbac(objs, RELEASE) == normalized_rbac(deploy_rbac, RELEASE)

    # the controller pod is deploy/deployment.yaml's (plus --dry-run and explicit defaults)
    ref = yaml.safe_load((ROOT / "deploy" / "deployment.yaml").read_text())
    ref_spec = ref["spec"]["template"]["spec"]
    [ref_c] = ref_spec["containers"]
    assert spec["securityContext"] == ref_spec["securityContext"]
    assert c["securityContext"].items() >= ref_c["securityContext"].items()
    for key in ("image", "env", "resources", "volumeMounts"):
        assert c[key] == ref_c[key], key
    assert [v["name"] for v in spec["volumes"]] == [v["name"] for v in ref_spec["volumes"]]
    assert dep["spec"]["replicas"] == ref["spec"]["replicas"]
    ref_args = parse_run_args(ref_c["args"])
    assert {k: v for k, v in vars(args).items() if k != "dry_run"} == {
        k: v for k, v in vars(ref_args).items() if k != "dry_run"}


def test_template_release_names_and_overrides(helm: Helm, tmp_path: Path) -> None:
    objs = helm.template("--set", "fullnameOverride=gpu-healer", "--set", "dryRun=false",
                         "--set-string", "slurm.nodeset=rack-a", "--set", "extraArgs={--x=1}")
    dep = one(objs, "Deployment", "gpu-healer")
    [c] = dep["spec"]["template"]["spec"]["containers"]
    assert "--dry-run" not in c["args"]
    assert c["args"][-1] == "--x=1"
    args = parse_run_args(c["args"][:-1])
    assert args.dry_run is False
    assert args.nodeset == "rack-a"
    assert args.lease_name == "gpu-healer-leader"
    binding = one(objs, "ClusterRoleBinding", "gpu-healer")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-healer",
                                    "namespace": "healer-system"}]
    assert one(objs, "ConfigMap")["metadata"]["name"] == "gpu-healer-policies"


# ---------------------------------------------------------------------------------------------
# helm template: everything on


def test_template_all_on(helm: Helm, tmp_path: Path) -> None:
    objs = helm.template("-f", str(values_file(tmp_path, all_on("slurm-x"))))
    kinds = Counter(o["kind"] for o in objs)
    assert kinds == {
        "ServiceAccount": 2, "ClusterRole": 3, "ClusterRoleBinding": 2, "Role": 4,
        "RoleBinding": 5, "ConfigMap": 1, "Service": 2, "Deployment": 1,
        "PodDisruptionBudget": 1, "DaemonSet": 1, "ServiceMonitor": 2, "PrometheusRule": 1,
        "NetworkPolicy": 2, "ValidatingAdmissionPolicy": 1,
        "ValidatingAdmissionPolicyBinding": 1}

    # the controller: slurmrestd, Prometheus, no --dry-run
    dep = one(objs, "Deployment", RELEASE)
    [c] = dep["spec"]["template"]["spec"]["containers"]
    assert "--dry-run" not in c["args"]
    args = parse_run_args(c["args"])
    assert args.dry_run is False
    assert args.slurm_driver == "slurmrestd"
    assert args.slurm_namespace == "slurm-x"
    assert args.nodeset == "gpu-nodes"
    assert args.slurmrestd_url == "http://slurmrestd.slurm.svc:6820"
    assert args.slurmrestd_token_secret == "slurm-x/slurm-token-healer:auth-token"
    assert args.prometheus_url == "http://prometheus-operated.monitoring.svc:9090"
    assert args.poll_interval == 30.0

    # Secrets: one Role, in the token's namespace, `get` on exactly that Secret, bound to the
    # controller's ServiceAccount; nothing else anywhere mentions Secrets
    [(kind, name, rule)] = secret_rules(objs)
    assert (kind, name) == ("Role", f"{RELEASE}-slurmrestd-token")
    assert rule == {"apiGroups": [""], "resources": ["secrets"],
                    "resourceNames": ["slurm-token-healer"], "verbs": ["get"]}
    role = one(objs, "Role", f"{RELEASE}-slurmrestd-token")
    assert role["metadata"]["namespace"] == "slurm-x"
    assert role["rules"] == [rule]
    rb = one(objs, "RoleBinding", f"{RELEASE}-slurmrestd-token")
    assert rb["metadata"]["namespace"] == "slurm-x"
    assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                             "name": f"{RELEASE}-slurmrestd-token"}
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE,
                               "namespace": "healer-system"}]

    # the ServiceMonitors scrape the metrics Services' named ports: the controller's Service
    # (its pods only) and the agents' headless Service
    for sm_name, svc_name, port in ((RELEASE, f"{RELEASE}-metrics", "http"),
                                    (f"{RELEASE}-agent", f"{RELEASE}-agent-metrics", "metrics")):
        svc = one(objs, "Service", svc_name)
        sm = one(objs, "ServiceMonitor", sm_name)
        assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        sm_sel = sm["spec"]["selector"]["matchLabels"]
        assert sm_sel.items() <= svc["metadata"]["labels"].items()
        others = [o for o in by_kind(objs, "Service") if o is not svc]
        assert all(not sm_sel.items() <= o["metadata"]["labels"].items() for o in others)
        assert sm["spec"]["namespaceSelector"] == {"matchNames": ["healer-system"]}
        assert [e["port"] for e in sm["spec"]["endpoints"]] == [port]
        assert port in [p["name"] for p in svc["spec"]["ports"]]
        assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    # the PrometheusRule carries the groups from the values
    pr = one(objs, "PrometheusRule", RELEASE)
    assert pr["spec"]["groups"] == ALL_ON["prometheusRule"]["groups"]


def test_agent_mirrors_deploy_agent(helm: Helm, tmp_path: Path) -> None:
    """values agent.enabled renders what deploy/agent/ holds: `healer agent` on GPU nodes with
    NODE_NAME from spec.nodeName, restricted, and its least-privilege RBAC."""
    objs = helm.template("-f", str(values_file(tmp_path, all_on())))
    plain = [d for f in sorted((ROOT / "deploy" / "agent").glob("*.yaml"))
             if f.name != "kustomization.yaml" for d in yaml.safe_load_all(f.read_text()) if d]

    ds = one(objs, "DaemonSet", f"{RELEASE}-agent")
    ref = one(plain, "DaemonSet", f"{RELEASE}-agent")
    spec, ref_spec = ds["spec"]["template"]["spec"], ref["spec"]["template"]["spec"]
    assert_restricted_pod(spec)
    assert spec["serviceAccountName"] == ref_spec["serviceAccountName"] == f"{RELEASE}-agent"
    for key in ("nodeSelector", "tolerations", "securityContext", "terminationGracePeriodSeconds",
                "volumes"):
        assert spec.get(key) == ref_spec.get(key), key
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "runtimeClassName" not in spec  # the node's default runtime, as deploy/agent
    assert ds["spec"]["updateStrategy"] == ref["spec"]["updateStrategy"]
    assert ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "agent"
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations.items() >= ref["spec"]["template"]["metadata"]["annotations"].items()

    [a], [ref_a] = spec["containers"], ref_spec["containers"]
    assert _same_ports(a["ports"], ref_a["ports"]), (a["ports"], ref_a["ports"])
    for key in ("livenessProbe", "readinessProbe", "resources", "volumeMounts"):
        assert a[key] == ref_a[key], (key, a[key], ref_a[key])
    assert a["securityContext"].items() >= ref_a["securityContext"].items()
    assert a["image"] == ref_a["image"]
    env, ref_env = env_of(a), env_of(ref_a)
    assert env == ref_env
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "nvidia.com/gpu" not in str(a["resources"])  # takes no GPU from the jobs
    # every flag deploy/agent sets, the chart sets to the same value (the rest are defaults)
    args, ref_args = parse_agent_args(a["args"]), parse_agent_args(ref_a["args"])
    defaults = parse_agent_args(["agent"])
    for flag, value in vars(ref_args).items():
        if value != getattr(defaults, flag):
            assert getattr(args, flag) == value, flag

    svc = one(objs, "Service", f"{RELEASE}-agent-metrics")
    ref_svc = one(plain, "Service", f"{RELEASE}-agent-metrics")
    assert svc["spec"]["clusterIP"] == ref_svc["spec"]["clusterIP"] == "None"
    assert _same_ports(svc["spec"]["ports"], ref_svc["spec"]["ports"])
    assert svc["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]

    # RBAC: exactly deploy/agent/rbac.yaml: get nodes, patch nodes/status, create events in the
    # events namespace; nothing about Secrets
    agent_objs = [o for o in objs if o["metadata"]["name"].startswith(f"{RELEASE}-agent")]
    assert normalized_rbac(agent_objs, RELEASE) == normalized_rbac(plain, RELEASE)
    assert secret_rules(agent_objs) == []


def _same_ports(ours: list[Obj], theirs: list[Obj]) -> bool:
    """Ports equal up to the default `protocol: TCP`."""
    def norm(ports: list[Obj]) -> list[Obj]:
        return [{"protocol": "TCP", **p} for p in ports]
    return norm(ours) == norm(theirs)


def test_prometheus_rule_defaults_to_the_chart_rules_file(helm: Helm) -> None:
    objs = helm.template("--set", "prometheusRule.enabled=true")
    pr = one(objs, "PrometheusRule", RELEASE)
    groups = yaml.safe_load(RULES_SOURCE.read_text())["groups"]
    assert groups
    assert pr["spec"]["groups"] == groups
    # the same groups as the plain prometheus-operator object deploy/prometheus/ generates
    plain = yaml.safe_load((RULES_SOURCE.parent / "prometheusrule.yaml").read_text())
    assert pr["spec"]["groups"] == plain["spec"]["groups"]


def test_values_are_validated(helm: Helm) -> None:
    cases = {
        ("--set", "slurm.driver=slurmrestd"): "/slurm/slurmrestd/url",
        ("--set", "slurm.driver=slurmrestd",
         "--set", "slurm.slurmrestd.url=http://s:6820"): "/slurm/slurmrestd/tokenSecret/name",
        ("--set", "slurm.driver=sbatch"): "/slurm/driver",
        ("--set", "dryRun=maybe"): "/dryRun",
        ("--set", "agent.enable=true"): "enable",
        ("--set", "policies.notyaml=x"): "'notyaml' does not match",
        ("--set", "replicaCount=0"): "/replicaCount",
    }
    for args, where in cases.items():
        r = helm.run("template", RELEASE, CHART, *args)
        assert r.returncode != 0, f"{args} was accepted"
        assert where in r.stderr, f"{args}: {r.stderr}"


# ---------------------------------------------------------------------------------------------
# policies with hooks (the hardening tests are in test_helm_hardening.py)


def _policies_with_hooks() -> Obj:
    """The shipped webhook examples plus a policy with Job hooks in another namespace."""
    ex = ROOT / "policies" / "examples"
    jobs = {"apiVersion": "healer.io/v1alpha1", "kind": "RemediationPolicy",
            "metadata": {"name": "jobs"},
            "spec": {"mode": "act", "nodeSelector": {"matchLabels": {"a": "b"}},
                     "rules": [{"name": "x", "severity": "failed", "xid": {"groups": ["fatal"]}}],
                     "steps": {"checkpoint": {"enabled": True, "hook": "job",
                                              "jobTemplate": "ops/ckpt-job"},
                               "repair": {"hook": "job",
                                          "jobTemplate": "healer-system/repair-job"}}}}
    return {"default.yaml": (ROOT / "policies" / "default.yaml").read_text(),
            "hooks.yaml": (ex / "checkpoint-webhook.yaml").read_text() + "\n---\n"
            + (ex / "act-with-validation.yaml").read_text() + "\n---\n"
            + yaml.safe_dump(jobs)}


def test_dead_node_fencing_webhook_secret_is_granted(helm: Helm, tmp_path: Path) -> None:
    """A policy whose deadNode fencing sends the webhook gets `get` on exactly its HMAC Secret
    (fencing.secretRef) and the ack callback; with deadNode disabled, nothing."""
    example = (ROOT / "policies" / "examples" / "dead-node-webhook.yaml").read_text()
    objs = helm.template("-f", str(values_file(tmp_path, {"policies": {"dead.yaml": example}},
                                               "dead.yaml")))
    [(kind, name, rule)] = secret_rules(objs)
    assert (kind, name) == ("Role", f"{RELEASE}-hooks")
    assert one(objs, "Role", f"{RELEASE}-hooks")["metadata"]["namespace"] == "healer-system"
    assert rule == {"apiGroups": [""], "resources": ["secrets"],
                    "resourceNames": ["healer-fencing-hmac"], "verbs": ["get"]}
    [c] = one(objs, "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"]
    assert parse_run_args(c["args"]).callback_url != ""

    off = example.replace("  deadNode:\n", "  deadNode:\n    enabled: false\n")
    assert off != example
    objs = helm.template("-f", str(values_file(tmp_path, {"policies": {"dead.yaml": off}},
                                               "off.yaml")))
    assert secret_rules(objs) == []


# ---------------------------------------------------------------------------------------------
# the real API server

# Minimal prometheus-operator CRDs: only the fields the chart's objects use, typed, so that the
# server-side dry run checks them (kubectl's field validation is Strict: unknown fields fail).
_STR = {"type": "string"}
_STRMAP = {"type": "object", "additionalProperties": _STR}
_MONITORING_CRDS: list[tuple[str, str, str, Obj]] = [
    ("ServiceMonitor", "servicemonitors", "servicemonitor", {
        "type": "object", "required": ["selector", "endpoints"],
        "properties": {
            "namespaceSelector": {"type": "object", "properties": {
                "any": {"type": "boolean"},
                "matchNames": {"type": "array", "items": _STR}}},
            "selector": {"type": "object", "properties": {
                "matchLabels": _STRMAP,
                "matchExpressions": {"type": "array", "items": {
                    "type": "object", "required": ["key", "operator"], "properties": {
                        "key": _STR, "operator": _STR,
                        "values": {"type": "array", "items": _STR}}}}}},
            "endpoints": {"type": "array", "items": {"type": "object", "properties": {
                "port": _STR, "path": _STR, "scheme": _STR, "interval": _STR,
                "scrapeTimeout": _STR, "honorLabels": {"type": "boolean"},
                "relabelings": {"type": "array", "items": {"type": "object", "properties": {
                    "sourceLabels": {"type": "array", "items": _STR}, "separator": _STR,
                    "targetLabel": _STR, "regex": _STR, "replacement": _STR,
                    "action": _STR}}}}}},
        }}),
    ("PrometheusRule", "prometheusrules", "prometheusrule", {
        "type": "object",
        "properties": {"groups": {"type": "array", "items": {
            "type": "object", "required": ["name"], "properties": {
                "name": _STR, "interval": _STR, "limit": {"type": "integer"},
                "query_offset": _STR, "labels": _STRMAP,
                "partial_response_strategy": _STR,
                "rules": {"type": "array", "items": {
                    "type": "object", "required": ["expr"], "properties": {
                        "alert": _STR, "record": _STR,
                        "expr": {"x-kubernetes-int-or-string": True},
                        "for": _STR, "keep_firing_for": _STR,
                        "labels": _STRMAP, "annotations": _STRMAP}}}}}}}}),
]


def _monitoring_crd(kind: str, plural: str, singular: str, spec: Obj) -> Obj:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com", "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural,
                      "singular": singular},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                "openAPIV3Schema": {"type": "object", "required": ["spec"], "properties": {
                    "apiVersion": _STR, "kind": _STR, "metadata": {"type": "object"},
                    "spec": spec}}}}],
        },
    }


def _namespace(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
        "healer.io/test": "1",
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/warn": "restricted"}}}


def _write_docs(path: Path, docs: Sequence[Obj]) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def _applied(stdout: str) -> list[str]:
    """`kind.group/name serverside-applied (server dry run)` lines → `kind.group/name`."""
    out = []
    for line in stdout.splitlines():
        assert "serverside-applied (server dry run)" in line, line
        out.append(line.split()[0])
    return out


def test_rendered_manifests_apply_to_the_real_api_server(
        helm: Helm, kube_stack: KubeStack, tmp_path: Path) -> None:
    suffix = secrets.token_hex(3)
    release_ns, slurm_ns = f"t-helm-{suffix}", f"t-helm-slurm-{suffix}"
    # a release name of its own: the cluster-scoped names (ClusterRoles, their bindings) and the
    # bindings in `default` must not collide with deploy/'s objects other tests create for real
    rel = f"healer-{suffix}"
    monitoring = [_monitoring_crd(*m) for m in _MONITORING_CRDS]
    try:
        # for real: the target namespaces, healer's CRD (from the chart's crds/, as Helm would),
        # the prometheus-operator CRDs; each CRD Established before anything uses it
        ok(kubectl(kube_stack, "apply", "--server-side", "-f",
                   _write_docs(tmp_path / "ns.yaml", [_namespace(release_ns),
                                                      _namespace(slurm_ns)])))
        ok(kubectl(kube_stack, "apply", "--server-side", "--force-conflicts", "-f",
                   CHART / "crds" / CRD_FILE))
        ok(kubectl(kube_stack, "apply", "--server-side", "-f",
                   _write_docs(tmp_path / "monitoring-crds.yaml", monitoring)))
        crds = ["crd/noderemediations.healer.io",
                *(f"crd/{m['metadata']['name']}" for m in monitoring)]
        ok(kubectl(kube_stack, "wait", "--for=condition=Established", "--timeout=60s", *crds,
                   timeout=90))

        shipped_rules = all_on(slurm_ns)  # the PrometheusRule from files/healer-rules.yaml
        del shipped_rules["prometheusRule"]["groups"]
        for label, values in (("default", {"slurm": {"namespace": slurm_ns}}),
                              ("all-on", shipped_rules)):
            objs = helm.template("-f", str(values_file(tmp_path, values, f"{label}.yaml")),
                                 namespace=release_ns, release=rel)
            manifest = _write_docs(tmp_path / f"{label}-rendered.yaml", objs)
            r = ok(kubectl(kube_stack, "apply", "--server-side", "--dry-run=server",
                           "--field-manager=helm-test", "-f", manifest))
            applied = _applied(r.stdout)
            assert len(applied) == len(objs), (label, r.stdout)
            # Pod Security "restricted" (warn) has nothing to say about any pod template
            assert "PodSecurity" not in r.stderr, (label, r.stderr)
            assert "Warning" not in r.stderr, (label, r.stderr)
            expected = {f"deployment.apps/{rel}", f"service/{rel}-metrics",
                        f"poddisruptionbudget.policy/{rel}", f"configmap/{rel}-policies",
                        f"serviceaccount/{rel}", f"clusterrole.rbac.authorization.k8s.io/{rel}",
                        f"role.rbac.authorization.k8s.io/{rel}"}
            if label == "all-on":
                expected |= {f"daemonset.apps/{rel}-agent", f"serviceaccount/{rel}-agent",
                             f"service/{rel}-agent-metrics",
                             f"servicemonitor.monitoring.coreos.com/{rel}-agent",
                             f"servicemonitor.monitoring.coreos.com/{rel}",
                             f"prometheusrule.monitoring.coreos.com/{rel}",
                             f"role.rbac.authorization.k8s.io/{rel}-slurmrestd-token",
                             f"rolebinding.rbac.authorization.k8s.io/{rel}-slurmrestd-token",
                             f"networkpolicy.networking.k8s.io/{rel}-agent",
                             "validatingadmissionpolicy.admissionregistration.k8s.io/"
                             f"{rel}-agent-own-node",
                             "validatingadmissionpolicybinding.admissionregistration.k8s.io/"
                             f"{rel}-agent-own-node"}
            expected |= {f"networkpolicy.networking.k8s.io/{rel}",
                         f"role.rbac.authorization.k8s.io/{rel}-slurm"}
            assert expected <= set(applied), (label, sorted(applied))

        # the dry run really validates: a ServiceMonitor with a misspelt field is refused
        bad = one(helm.template("--set", "serviceMonitor.enabled=true", namespace=release_ns,
                                release=rel), "ServiceMonitor")
        bad["spec"]["endpoints"][0]["intervall"] = "30s"
        r = kubectl(kube_stack, "apply", "--server-side", "--dry-run=server", "-f",
                    _write_docs(tmp_path / "bad.yaml", [bad]))
        assert r.returncode != 0, r.stdout
        assert "intervall" in r.stderr, r.stderr

        # nothing above was created: the dry run left the namespace empty of healer's objects
        r = ok(kubectl(kube_stack, "get", "deployments,services,configmaps,serviceaccounts",
                       "-n", release_ns, "-l", f"app.kubernetes.io/instance={rel}", "-o", "name"))
        assert r.stdout.strip() == "", r.stdout
    finally:
        kubectl(kube_stack, "delete", "namespace", release_ns, slurm_ns, "--wait=false",
                "--ignore-not-found")
        kubectl(kube_stack, "delete", "--wait=false", "--ignore-not-found",
                *(f"crd/{m['metadata']['name']}" for m in monitoring))


def test_notes_name_the_safety_ladder(helm: Helm, kube_stack: KubeStack, tmp_path: Path) -> None:
    """NOTES.txt, rendered by `helm install --dry-run` against the real API server."""
    # a release name of its own: helm refuses to "adopt" deploy/'s healer ClusterRole etc. that
    # other tests may have created for real
    rel = f"healer-{secrets.token_hex(3)}"

    def notes(*args: str) -> str:
        r = helm.run("install", rel, CHART, "--namespace", "default", "--dry-run=client",
                     *args, kubeconfig=kube_stack.kubeconfig)
        assert r.returncode == 0, r.stderr
        assert "NOTES:" in r.stdout, r.stdout
        return r.stdout.split("NOTES:", 1)[1]

    safe = notes()
    assert "SAFE MODE: dryRun=true" in safe
    assert "No policy file sets `mode: act`." in safe
    for rung in ("1. mode: observe", "2. mode: dryRun", "3. mode: act  + dryRun=false"):
        assert rung in safe, safe
    assert "HTTP: served on $(POD_IP):8080" in safe, safe
    assert "behind a NetworkPolicy; /debug/state off" in safe, safe
    hooks = notes("-f", str(values_file(tmp_path, {"policies": _policies_with_hooks()},
                                        "hooks.yaml")))
    assert f"acks to http://{rel}-metrics.default.svc:8080/v1/hooks/ack" in hooks, hooks
    assert "(healer-system: checkpoint-hmac, repair-hmac)" in hooks, hooks
    acting = all_on()
    # no prometheus-operator CRDs in the cluster at this point: helm would refuse to map those
    acting["serviceMonitor"]["enabled"] = acting["prometheusRule"]["enabled"] = False
    acting["policies"] = {"act.yaml": (ROOT / "policies" / "default.yaml").read_text()
                          .replace("mode: observe", "mode: act")}
    live = notes("-f", str(values_file(tmp_path, acting)))
    assert "dryRun=false: each policy runs at its own `mode`" in live
    assert "Policy files with `mode: act`: act.yaml." in live
    assert "slurm/slurm-token-healer:auth-token" in live
