"""The Helm chart as installed, hardened (issue 12): hook Secrets and ConfigMaps granted by name
from the policies, pods and evictions only in the Slurm namespace, the chart refusing a
checkpoint that cannot work, the HTTP bind, /debug/state off, NetworkPolicies, and the agent's
own-Node admission policy. Helpers and the ``helm`` fixture come from test_helm.py."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.integration.test_helm import (
    CHART,
    POD_IP,
    RELEASE,
    ROOT,
    Helm,
    all_on,
    by_kind,
    env_of,
    helm,
    one,
    parse_agent_args,
    parse_run_args,
    rules_of,
    secret_rules,
    values_file,
)
from tests.integration.test_helm import _policies_with_hooks as policies_with_hooks

__all__ = ["helm"]


def test_hook_secrets_and_templates_are_granted_by_name_from_the_policies(
        helm: Helm, tmp_path: Path) -> None:
    objs = helm.template("-f", str(values_file(tmp_path, {"policies": policies_with_hooks()})))
    # exactly the Secrets and ConfigMaps the policies name, `get` only, per namespace
    hooks = {o["metadata"]["namespace"]: o["rules"] for o in by_kind(objs, "Role")
             if o["metadata"]["name"] == f"{RELEASE}-hooks"}
    assert hooks == {
        "healer-system": [
            {"apiGroups": [""], "resources": ["secrets"],
             "resourceNames": ["checkpoint-hmac", "repair-hmac"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["repair-job"],
             "verbs": ["get"]}],
        "ops": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["ckpt-job"],
                 "verbs": ["get"]}]}
    for ns in hooks:
        rb = next(o for o in by_kind(objs, "RoleBinding") if o["metadata"]["name"]
                  == f"{RELEASE}-hooks" and o["metadata"]["namespace"] == ns)
        assert rb["roleRef"]["name"] == f"{RELEASE}-hooks"
        assert rb["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE,
                                   "namespace": "healer-system"}]
    # nothing else grants Secrets or ConfigMaps, but `get` on the two spare-validation check
    # templates by name in healer's own namespace
    grants = [(k, n, r) for k, n, r in rules_of(objs)
              if {"secrets", "configmaps", "*"} & set(r.get("resources", []))]
    assert [(k, n) for k, n, _ in grants] == [("Role", RELEASE)] + \
        [("Role", f"{RELEASE}-hooks")] * 3  # the three rules above
    assert grants[0][2] == {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                            "resourceNames": ["healer-validation-dcgm-diag",
                                              "healer-validation-nccl-loopback"]}
    # the receivers learn where to ack: the metrics Service
    [c] = one(objs, "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"]
    assert parse_run_args(c["args"]).callback_url == \
        f"http://{RELEASE}-metrics.healer-system.svc:8080/v1/hooks/ack"


def test_pods_and_evictions_only_in_the_slurm_namespace(helm: Helm) -> None:
    objs = helm.template("--set", "slurm.namespace=hpc")
    pod_rules = [(k, n, r) for k, n, r in rules_of(objs)
                 if {"pods", "pods/eviction", "nodesets"} & set(r["resources"])]
    assert {(k, n) for k, n, _ in pod_rules} == {("Role", f"{RELEASE}-slurm"), ("Role", RELEASE)}
    # in healer's own namespace only `list pods` (the spare-validation Jobs' pods report there)
    own = [r for k, n, r in pod_rules if n == RELEASE]
    assert own == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    assert one(objs, "Role", RELEASE)["metadata"]["namespace"] == "healer-system"
    role = one(objs, "Role", f"{RELEASE}-slurm")
    assert role["metadata"]["namespace"] == "hpc"
    assert one(objs, "RoleBinding", f"{RELEASE}-slurm")["metadata"]["namespace"] == "hpc"


def test_the_chart_refuses_a_checkpoint_that_cannot_work(helm: Helm, tmp_path: Path) -> None:
    acting = {"policies": {"default.yaml": (ROOT / "policies" / "default.yaml").read_text()
                           .replace("mode: observe", "mode: act")}}
    # Slinky without Slurm's job API: the slurm-signal checkpoint could never signal a job
    r = helm.run("template", RELEASE, CHART, "-f", str(values_file(tmp_path, acting)))
    assert r.returncode != 0
    assert "slurm-signal checkpoint of default.yaml: gpu-degrading" in r.stderr, r.stderr
    assert "slurm.slurmrestd.url" in r.stderr
    # the image has no scontrol: the scontrol driver is refused unless the image carries one
    r = helm.run("template", RELEASE, CHART, "--set", "slurm.driver=scontrol")
    assert r.returncode != 0
    assert "image has no Slurm client" in r.stderr, r.stderr
    # observe-only policies never signal: the default install renders with every driver it can
    assert helm.run("template", RELEASE, CHART).returncode == 0
    # Slinky with slurmrestd: the URL and the token are passed, the token Secret granted by name
    objs = helm.template("-f", str(values_file(tmp_path, acting)), "--set",
                         "slurm.slurmrestd.url=http://slurm-restapi.slurm.svc:6820", "--set",
                         "slurm.slurmrestd.tokenSecret.name=slurm-token-healer")
    [c] = one(objs, "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"]
    args = parse_run_args(c["args"])
    assert args.slurm_driver == "slinky"
    assert args.slurmrestd_url == "http://slurm-restapi.slurm.svc:6820"
    assert args.slurmrestd_token_secret == "slurm/slurm-token-healer:SLURM_JWT"
    [(kind, name, rule)] = secret_rules(objs)
    assert (kind, name, rule["resourceNames"]) == ("Role", f"{RELEASE}-slurmrestd-token",
                                                   ["slurm-token-healer"])
    # scontrol in a custom image with slurm.conf: accepted
    assert helm.run("template", RELEASE, CHART, "--set", "slurm.driver=scontrol", "--set",
                    "slurm.clientInImage=true", "--set",
                    "slurm.slurmConf=/etc/slurm/slurm.conf").returncode == 0


def test_http_bind_debug_state_and_network_policies(helm: Helm, tmp_path: Path) -> None:
    objs = helm.template("-f", str(values_file(tmp_path, all_on())))
    dep = one(objs, "Deployment", RELEASE)
    [c] = dep["spec"]["template"]["spec"]["containers"]
    assert "--debug-state" not in c["args"]
    ds = one(objs, "DaemonSet", f"{RELEASE}-agent")
    [a] = ds["spec"]["template"]["spec"]["containers"]
    agent_args = parse_agent_args(a["args"])
    assert agent_args.http_host == POD_IP
    assert agent_args.debug_state is False
    assert env_of(a)["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    for np_name, pod in ((RELEASE, dep), (f"{RELEASE}-agent", ds)):
        np = one(objs, "NetworkPolicy", np_name)
        labels = pod["spec"]["template"]["metadata"]["labels"]
        assert np["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        assert np["spec"]["podSelector"]["matchLabels"] == pod["spec"]["selector"]["matchLabels"]
        assert np["spec"]["policyTypes"] == ["Ingress"]
        [rule] = np["spec"]["ingress"]
        port = pod["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"]
        assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
        assert rule["from"] == [{"namespaceSelector": {}}]
    on = helm.template("--set", "http.debugState=true", "--set", "http.host=0.0.0.0",
                       "--set", "networkPolicy.enabled=false")
    [c] = one(on, "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"]
    assert parse_run_args(c["args"]).debug_state is True
    assert parse_run_args(c["args"]).http_host == "0.0.0.0"
    assert by_kind(on, "NetworkPolicy") == []
    # the plain manifests carry the same policies, selecting their own workloads' pods
    for np_file, workload in (("networkpolicy.yaml", "deployment.yaml"),
                              ("agent/networkpolicy.yaml", "agent/daemonset.yaml")):
        theirs = yaml.safe_load((ROOT / "deploy" / np_file).read_text())
        pods = yaml.safe_load((ROOT / "deploy" / workload).read_text())
        ours = one(objs, "NetworkPolicy", theirs["metadata"]["name"])
        assert theirs["spec"]["podSelector"]["matchLabels"] == \
            pods["spec"]["selector"]["matchLabels"], np_file
        assert {k: v for k, v in ours["spec"].items() if k != "podSelector"} == \
            {k: v for k, v in theirs["spec"].items() if k != "podSelector"}, np_file


def test_agent_admission_policy_binds_the_agent_to_its_own_node(
        helm: Helm, tmp_path: Path) -> None:
    objs = helm.template("-f", str(values_file(tmp_path, all_on())))
    plain = [d for d in yaml.safe_load_all((ROOT / "deploy" / "agent" / "rbac.yaml").read_text())
             if d]
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        ours, theirs = one(objs, kind), one(plain, kind)
        assert ours["metadata"]["name"] == theirs["metadata"]["name"] == \
            f"{RELEASE}-agent-own-node"
        assert ours["spec"] == theirs["spec"], kind
    vap = one(objs, "ValidatingAdmissionPolicy")
    assert vap["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes/status"]
    assert "system:serviceaccount:healer-system:healer-agent" in \
        vap["spec"]["matchConditions"][0]["expression"]
    assert "authentication.kubernetes.io/node-name" in vap["spec"]["validations"][0]["expression"]
    assert one(objs, "ValidatingAdmissionPolicyBinding")["spec"]["validationActions"] == ["Deny"]
