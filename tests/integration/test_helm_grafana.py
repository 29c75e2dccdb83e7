"""The Helm chart's Grafana ConfigMaps: dashboards and alerting provisioning for the sidecar.

kube-prometheus-stack and the grafana chart run k8s-sidecar next to Grafana; it loads every
ConfigMap labelled ``grafana_dashboard: "1"`` as a dashboard and every one labelled
``grafana_alert: "1"`` as alerting provisioning. The chart ships healer's dashboards and alert
rules that way, both OFF by default (``grafana.dashboards.enabled``,
``grafana.alerting.enabled``). Helm reads no file outside the chart, so the chart carries
copies under ``files/``; the first test fails, naming the file and ``make chart-files``, when a
copy is missing, stale or left over. The rest render with the cached helm (the ``helm`` fixture
of test_helm.py: built when missing, FAILS when it cannot run) and apply the rendered objects
with a server-side dry run to the real kube-apiserver.

Every expression those ConfigMaps carry is evaluated against a real Prometheus in
tests/integration/observability/test_grafana_expressions.py.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import yaml

from healer_dev.devstack.kube import KubeStack
from tests.integration.test_helm import (
    CHART,
    ROOT,
    Helm,
    _applied,
    _namespace,
    _write_docs,
    by_kind,
    helm,
    kubectl,
    ok,
    one,
    values_file,
)

__all__ = ["helm"]  # the fixture, imported for the tests below

Obj = dict[str, Any]

DASHBOARDS = ROOT / "dashboards"
DASHBOARD_COPIES = CHART / "files" / "dashboards"
ALERTING_SOURCE = ROOT / "deploy" / "grafana" / "alerting.yaml"
ALERTING_COPY = CHART / "files" / "grafana-alerting.yaml"
FIX = "run `make chart-files` (copies dashboards/*.json and deploy/grafana/alerting.yaml into " \
      "deploy/helm/healer/files/)"
BOTH_ON = ("--set", "grafana.dashboards.enabled=true", "--set", "grafana.alerting.enabled=true")


def _rel(p: Path) -> str:
    """A path as the repository names it (a path outside it, in a test's tmp dir, as it is)."""
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def _sources() -> list[Path]:
    found = sorted(DASHBOARDS.glob("*.json"))
    assert found, f"{_rel(DASHBOARDS)} has no dashboards"
    return found


def _grafana_maps(objs: list[Obj]) -> list[Obj]:
    return [o for o in by_kind(objs, "ConfigMap")
            if not o["metadata"]["name"].endswith("-policies")]


def _dashboard_maps(objs: list[Obj]) -> dict[str, Obj]:
    """dashboards/<file> → its rendered ConfigMap (one data key each, healer-<file>)."""
    out = {}
    for cm in _grafana_maps(objs):
        if "-dashboard-" in cm["metadata"]["name"]:
            [key] = cm["data"]
            assert key.startswith("healer-"), key
            out[key.removeprefix("healer-")] = cm
    return out


# ---------------------------------------------------------------------------------------------
# the chart's copies


def check_copies(sources: list[Path], copies_dir: Path, alerting_source: Path,
                 alerting_copy: Path) -> list[str]:
    """What is wrong with the chart's copies, one line per file, each naming the fix."""
    problems = []
    for src in sources:
        copy = copies_dir / src.name
        if not copy.is_file():
            problems.append(f"{_rel(copy)} is missing (a copy of {_rel(src)}): {FIX}")
        elif copy.read_bytes() != src.read_bytes():
            problems.append(f"{_rel(copy)} differs from {_rel(src)}: {FIX}")
    names = {s.name for s in sources}
    for extra in sorted(copies_dir.glob("*.json")):
        if extra.name not in names:
            problems.append(f"{_rel(extra)} has no source {_rel(DASHBOARDS / extra.name)}: {FIX}")
    if not alerting_copy.is_file() or alerting_copy.read_bytes() != alerting_source.read_bytes():
        problems.append(f"{_rel(alerting_copy)} is missing or differs from "
                        f"{_rel(alerting_source)}: {FIX}")
    return problems


def test_chart_carries_a_current_copy_of_every_dashboard_and_the_alerting() -> None:
    problems = check_copies(_sources(), DASHBOARD_COPIES, ALERTING_SOURCE, ALERTING_COPY)
    assert not problems, "\n".join(problems)


def test_the_copy_check_names_the_file_and_the_fix(tmp_path: Path) -> None:
    """The check above can fail, and says which file and what to run."""
    copies = tmp_path / "copies"
    copies.mkdir()
    sources = _sources()
    for src in sources[1:]:
        (copies / src.name).write_bytes(src.read_bytes())
    (copies / sources[1].name).write_text("{}")
    (copies / "gone.json").write_text("{}")
    alerting = tmp_path / "alerting.yaml"
    alerting.write_text("apiVersion: 1\n")
    problems = check_copies(sources, copies, ALERTING_SOURCE, alerting)
    assert len(problems) == 4, problems
    assert f"copies/{sources[0].name} is missing" in problems[0]
    assert f"copies/{sources[1].name} differs from dashboards/{sources[1].name}" in problems[1]
    assert "copies/gone.json has no source dashboards/gone.json" in problems[2]
    assert "alerting.yaml is missing or differs from deploy/grafana/alerting.yaml" in problems[3]
    assert all("make chart-files" in p for p in problems), problems


# ---------------------------------------------------------------------------------------------
# rendering


def test_off_by_default_and_each_switch_alone(helm: Helm) -> None:
    assert _grafana_maps(helm.template()) == []
    only_dash = helm.template("--set", "grafana.dashboards.enabled=true")
    assert len(_grafana_maps(only_dash)) == len(_sources())
    assert all("-dashboard-" in cm["metadata"]["name"] for cm in _grafana_maps(only_dash))
    only_alerts = _grafana_maps(helm.template("--set", "grafana.alerting.enabled=true"))
    assert [cm["metadata"]["name"] for cm in only_alerts] == ["healer-grafana-alerting"]


def test_lint_strict_with_both_on(helm: Helm) -> None:
    r = helm.run("lint", CHART, "--strict", *BOTH_ON)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[WARNING]" not in r.stdout, r.stdout


def test_dashboards_render_for_the_sidecar_equal_to_the_sources(helm: Helm) -> None:
    objs = helm.template(*BOTH_ON, namespace="monitoring")
    maps = _dashboard_maps(objs)
    assert sorted(maps) == [s.name for s in _sources()]
    for src in _sources():
        cm = maps[src.name]
        md = cm["metadata"]
        assert md["name"] == f"healer-dashboard-{src.stem}"
        assert md["namespace"] == "monitoring"
        assert md["labels"]["grafana_dashboard"] == "1"
        assert md["labels"]["app.kubernetes.io/instance"] == "healer"
        assert md["annotations"] == {"grafana_folder": "healer"}
        text = cm["data"][f"healer-{src.name}"]
        assert json.loads(text) == json.loads(src.read_text()), src.name
        assert text == src.read_text(), f"{src.name}: not byte-identical"


def test_dashboard_label_folder_and_namespace_are_configurable(helm: Helm, tmp_path: Path) -> None:
    values = {"grafana": {
        "namespace": "grafana",
        "dashboards": {"enabled": True, "label": "example.com/dashboard", "labelValue": "yes",
                       "folderAnnotation": "k8s-sidecar-target-directory", "folder": "GPU/healer",
                       "labels": {"team": "gpu"}, "annotations": {"owner": "platform"}}}}
    objs = helm.template("-f", str(values_file(tmp_path, values)))
    for cm in _dashboard_maps(objs).values():
        md = cm["metadata"]
        assert md["namespace"] == "grafana"
        assert md["labels"]["example.com/dashboard"] == "yes"
        assert md["labels"]["team"] == "gpu"
        assert "grafana_dashboard" not in md["labels"]
        assert md["annotations"] == {"owner": "platform",
                                     "k8s-sidecar-target-directory": "GPU/healer"}
    no_folder = helm.template("--set", "grafana.dashboards.enabled=true",
                              "--set", "grafana.dashboards.folder=")
    assert all("annotations" not in cm["metadata"]
               for cm in _dashboard_maps(no_folder).values())


def _datasource_uids(node: Any) -> list[str]:
    """Every data source UID the provisioning names (``datasourceUid`` and ``datasource.uid``)."""
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "datasourceUid" and isinstance(v, str):
                out.append(v)
            elif k == "datasource" and isinstance(v, dict) and "uid" in v:
                out.append(v["uid"])
            out += _datasource_uids(v)
    elif isinstance(node, list):
        for v in node:
            out += _datasource_uids(v)
    return out


def test_alerting_renders_for_the_sidecar_on_the_chosen_data_source(helm: Helm) -> None:
    source = ALERTING_SOURCE.read_text()
    cm = one(helm.template("--set", "grafana.alerting.enabled=true"), "ConfigMap",
             "healer-grafana-alerting")
    assert cm["metadata"]["labels"]["grafana_alert"] == "1"
    assert cm["data"] == {"healer-alerting.yaml": source}
    provisioning = yaml.safe_load(source)
    assert set(_datasource_uids(provisioning)) == {"prometheus", "__expr__"}

    cm = one(helm.template("--set", "grafana.alerting.enabled=true",
                           "--set", "grafana.alerting.datasourceUid=mimir-eu_1",
                           "--set", "grafana.alerting.label=alerts",
                           "--set", "grafana.alerting.labelValue=healer"),
             "ConfigMap", "healer-grafana-alerting")
    assert cm["metadata"]["labels"]["alerts"] == "healer"
    assert "grafana_alert" not in cm["metadata"]["labels"]
    rendered = yaml.safe_load(cm["data"]["healer-alerting.yaml"])
    assert set(_datasource_uids(rendered)) == {"mimir-eu_1", "__expr__"}
    queries = [q for g in rendered["groups"] for r in g["rules"] for q in r["data"]
               if q["datasourceUid"] != "__expr__"]
    assert queries
    assert all(q["datasourceUid"] == q["model"]["datasource"]["uid"] == "mimir-eu_1"
               for q in queries)

    # nothing but the data source changed
    def without_uids(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: without_uids(v) for k, v in node.items()
                    if k != "datasourceUid" and not (k == "uid" and v in ("prometheus",
                                                                          "mimir-eu_1"))}
        if isinstance(node, list):
            return [without_uids(v) for v in node]
        return node

    assert without_uids(rendered) == without_uids(provisioning)


def test_bad_grafana_values_are_refused_with_the_field(helm: Helm) -> None:
    cases = {
        ("--set", "grafana.dashboards.label=not a label"): "/grafana/dashboards/label",
        ("--set", "grafana.dashboards.labelValue=-x-"): "/grafana/dashboards/labelValue",
        ("--set", "grafana.alerting.datasourceUid=a: b"): "/grafana/alerting/datasourceUid",
        ("--set", "grafana.alerting.enable=true"): "enable",
        ("--set", "grafana.namespace=Not_A_Namespace"): "/grafana/namespace",
    }
    for args, where in cases.items():
        r = helm.run("template", "healer", CHART, *BOTH_ON, *args)
        assert r.returncode != 0, f"{args} was accepted"
        assert where in r.stderr, f"{args}: {r.stderr}"


# ---------------------------------------------------------------------------------------------
# the real API server


def test_grafana_configmaps_apply_to_the_real_api_server(
        helm: Helm, kube_stack: KubeStack, tmp_path: Path) -> None:
    suffix = secrets.token_hex(3)
    release_ns, grafana_ns = f"t-helm-gr-{suffix}", f"t-helm-grafana-{suffix}"
    rel = f"healer-{suffix}"
    try:
        ok(kubectl(kube_stack, "apply", "--server-side", "-f",
                   _write_docs(tmp_path / "ns.yaml", [_namespace(release_ns),
                                                      _namespace(grafana_ns)])))
        objs = _grafana_maps(helm.template(*BOTH_ON, "--set", f"grafana.namespace={grafana_ns}",
                                           namespace=release_ns, release=rel))
        assert len(objs) == len(_sources()) + 1
        manifest = _write_docs(tmp_path / "grafana.yaml", objs)
        r = ok(kubectl(kube_stack, "apply", "--server-side", "--dry-run=server",
                       "--field-manager=helm-test", "-f", manifest))
        applied = _applied(r.stdout)
        assert sorted(applied) == sorted(f"configmap/{o['metadata']['name']}" for o in objs)
        assert "Warning" not in r.stderr, r.stderr
        # the dry run really validates: a label value the API server refuses
        bad = dict(objs[0], metadata={**objs[0]["metadata"],
                                      "labels": {"grafana_dashboard": "not valid!"}})
        r = kubectl(kube_stack, "apply", "--server-side", "--dry-run=server", "-f",
                    _write_docs(tmp_path / "bad.yaml", [bad]))
        assert r.returncode != 0, r.stdout
        assert "not valid!" in r.stderr, r.stderr
        r = ok(kubectl(kube_stack, "get", "configmaps", "-n", grafana_ns,
                       "-l", f"app.kubernetes.io/instance={rel}", "-o", "name"))
        assert r.stdout.strip() == "", r.stdout
    finally:
        kubectl(kube_stack, "delete", "namespace", release_ns, grafana_ns, "--wait=false",
                "--ignore-not-found")
