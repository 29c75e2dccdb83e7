"""Single-value checks of policy fields that used to be found only in the middle of an
incident (issue 22 item 4) or that meant something else than they said (item 3): table-driven,
each refusal says what was expected."""

from __future__ import annotations

import typing

import pytest

from healer import flags
from healer.core.model import TelemetrySourceName
from healer.policy import schema as s
from healer.policy.checks import (
    check_configmap_ref,
    check_image_ref,
    check_repeats,
    check_secret_ref,
    compile_regex,
)


@pytest.mark.parametrize("ref", [
    "busybox", "busybox:1.36", "nvcr.io/nvidia/cloud-native/dcgm:3.3.5-3.4.0-ubuntu22.04",
    "localhost:5000/team/diag", "registry.example.com/a/b_c/d__e/f-g:v1.2",
    "[::1]:5000/x:1", "ghcr.io/x/y@sha256:" + "0" * 64, "x/y:t@sha256:" + "a" * 64])
def test_image_references_that_a_kubelet_pulls(ref: str) -> None:
    assert check_image_ref(ref) == ref


@pytest.mark.parametrize("ref", [
    "", "NVIDIA DCGM latest", "Upper/Case", "dcgm:", "a//b", "-x", "x:tag\n", "x:-tag",
    "x@sha256:short", "x:" + "t" * 129, "a" * 256, "host:99999999/x"])
def test_image_references_refused_at_load(ref: str) -> None:
    with pytest.raises(ValueError, match=r"expected a container image reference|at most 255"):
        check_image_ref(ref)


@pytest.mark.parametrize(("ref", "ok"), [
    ("ns/name", True), ("ns/name:key", True), ("ns/a.b-c:k_e.y-1", True),
    ("ns/name:..", False), ("ns/name:.", False), ("ns/name:..data", False),
    ("ns/name:", False), ("Ns/name", False), ("ns/Name", False), ("ns/-name", False),
    ("ns/name-", False), ("ns", False), ("/name", False), ("a" * 64 + "/x", False),
    ("ns/" + "a" * 254, False), ("ns/name:" + "k" * 254, False), ("ns/na me", False),
    ("ns/name:k/ey", False)])
def test_secret_refs_as_kubernetes_can_hold_them(ref: str, ok: bool) -> None:
    if ok:
        assert check_secret_ref(ref) == ref
        assert flags.secret_ref(ref) == ref
    else:
        with pytest.raises(ValueError, match="expected NAMESPACE/NAME"):
            check_secret_ref(ref)


@pytest.mark.parametrize("ref", ["checkpoint-template", "ops/repair/v2", "ops/", "/x",
                                 "ops/x:key", "OPS/x"])
def test_job_templates_are_namespace_slash_name(ref: str) -> None:
    with pytest.raises(ValueError, match="expected NAMESPACE/NAME of a ConfigMap"):
        check_configmap_ref(ref)
    assert check_configmap_ref("ops/repair-v2.job") == "ops/repair-v2.job"


def test_staleness_sources_are_the_sources_that_exist() -> None:
    field = s.StalenessMatch.model_fields["sources"]
    (literal,) = typing.get_args(field.annotation)
    assert set(typing.get_args(literal)) == {m.value for m in TelemetrySourceName}


@pytest.mark.parametrize(("pattern", "ok"), [
    ("a{3}", True), ("a{0}", True), ("a{3,}", True), ("a{2,1000}", True), ("a\\{1,99999}", True),
    ("[{]", True), ("[a{1,99999}]", True), ("[]{]", True), ("[^]{]x", True),
    ("[[:alpha:]{]x{2}", True), ("\\Qa{,5}\\E", True), ("\\p{Greek}{2}", True),
    ("\\x{41}{2}", True), ("(?i)^nhc:.{1,80}$", True),
    ("a{1,4294967296}", False), ("x{1000}y{4294967296}", False), ("a{,5}", False),
    ("a{ 3}", False), ("a{3 }", False), ("a{01}", False), ("a{1,02}", False), ("{", False),
    ("a{", False), ("a{1,", False), ("a{1001}", False), ("a{2,1001}", False),
    ("[x]{,2}", False), ("\\Qx\\E{,2}", False), ("a{999999999999}", False)])
def test_every_brace_is_a_repeat_re2_reads_as_one(pattern: str, ok: bool) -> None:
    if ok:
        check_repeats(pattern)
        compile_regex(pattern)
    else:
        with pytest.raises(ValueError, match=r"to be a repeat|repeat counts of at most 1000"):
            check_repeats(pattern)
