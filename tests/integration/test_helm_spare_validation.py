"""The Helm chart's spare-validation check templates (values ``spareValidation.templates``, off by
default): the ConfigMaps healer-validation-<check> that FleetGuardrails ``spareValidation``
runs, from the chart's copies of deploy/validation/ (``make chart-files``; the first test fails,
naming the file and the fix, when a copy is missing, stale or left over), rendered in the release
namespace and applied with a server-side dry run to the real kube-apiserver. Renders with the
cached helm (the ``helm`` fixture of test_helm.py)."""

from __future__ import annotations

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
)

__all__ = ["helm"]  # the fixture, imported for the tests below

SOURCES = ROOT / "deploy" / "validation"
COPIES = CHART / "files" / "validation"
FIX = "run `make chart-files` (copies deploy/validation/*-job.yaml into " \
      "deploy/helm/healer/files/validation/)"
ON = ("--set", "spareValidation.templates=true")


def check_copies(sources: Path, copies: Path) -> list[str]:
    """What is wrong with the chart's copies, one line per file, each naming the fix."""
    problems = []
    found = sorted(sources.glob("*-job.yaml"))
    if not found:
        problems.append(f"{sources} has no *-job.yaml")
    for src in found:
        copy = copies / src.name
        if not copy.is_file():
            problems.append(f"{copy.name} is missing from the chart (a copy of {src.name}): {FIX}")
        elif copy.read_bytes() != src.read_bytes():
            problems.append(f"the chart's {copy.name} differs from {src.name}: {FIX}")
    for extra in sorted(copies.glob("*-job.yaml")):
        if not (sources / extra.name).is_file():
            problems.append(f"the chart's {extra.name} has no source in deploy/validation: {FIX}")
    return problems


def test_chart_carries_a_current_copy_of_every_check_template() -> None:
    problems = check_copies(SOURCES, COPIES)
    assert not problems, "\n".join(problems)


def test_the_copy_check_names_the_file_and_the_fix(tmp_path: Path) -> None:
    src, copies = tmp_path / "src", tmp_path / "copies"
    src.mkdir()
    copies.mkdir()
    for f in SOURCES.glob("*-job.yaml"):
        (src / f.name).write_bytes(f.read_bytes())
    (copies / "dcgm-diag-job.yaml").write_text("stale")
    (copies / "gone-job.yaml").write_text("x")
    problems = check_copies(src, copies)
    assert problems == [
        f"the chart's dcgm-diag-job.yaml differs from dcgm-diag-job.yaml: {FIX}",
        f"nccl-loopback-job.yaml is missing from the chart (a copy of "
        f"nccl-loopback-job.yaml): {FIX}",
        f"the chart's gone-job.yaml has no source in deploy/validation: {FIX}"]


def _checks(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in by_kind(objs, "ConfigMap")
            if o["metadata"]["name"].startswith("healer-validation-")}


def test_off_by_default_and_on_renders_the_sources_in_the_release_namespace(
        helm: Helm) -> None:
    assert _checks(helm.template()) == {}
    rendered = _checks(helm.template(*ON, namespace="gpu-ops"))
    assert sorted(rendered) == ["healer-validation-dcgm-diag", "healer-validation-nccl-loopback"]
    for name, cm in rendered.items():
        src = yaml.safe_load((SOURCES / f"{name.removeprefix('healer-validation-')}-job.yaml")
                             .read_text())
        assert cm["metadata"]["namespace"] == "gpu-ops"  # where healer reads them
        assert cm["metadata"]["labels"]["app.kubernetes.io/component"] == "spare-validation"
        assert cm["data"]["job.yaml"] == src["data"]["job.yaml"]  # byte for byte


def test_the_switch_is_validated(helm: Helm) -> None:
    r = helm.run("template", "healer", CHART, "--set", "spareValidation.templates=maybe")
    assert r.returncode != 0, "spareValidation.templates=maybe was accepted"
    assert "/spareValidation/templates" in r.stderr, r.stderr
    r = helm.run("template", "healer", CHART, "--set", "spareValidation.jobs=true")
    assert r.returncode != 0, "spareValidation.jobs was accepted"


def test_rendered_templates_apply_to_the_real_api_server(
        helm: Helm, kube_stack: KubeStack, tmp_path: Path) -> None:
    ns = f"t-helm-sv-{secrets.token_hex(3)}"
    ok(kubectl(kube_stack, "apply", "--server-side", "-f",
               _write_docs(tmp_path / "ns.yaml", [_namespace(ns)])))
    objs = list(_checks(helm.template(*ON, namespace=ns)).values())
    r = ok(kubectl(kube_stack, "apply", "--server-side", "--dry-run=server",
                   "--field-manager=helm-test", "-f", _write_docs(tmp_path / "cms.yaml", objs)))
    assert sorted(_applied(r.stdout)) == ["configmap/healer-validation-dcgm-diag",
                                          "configmap/healer-validation-nccl-loopback"]
