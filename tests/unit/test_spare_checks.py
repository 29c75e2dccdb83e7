"""Judging a spare-validation check's output (core.spare_checks) and decoding a dcgm-diag report
(adapters.kube.check_jobs.decode_dcgm_json), on recorded-style outputs in data/spare_checks."""

from __future__ import annotations

import base64
import gzip
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from healer.adapters.kube.check_jobs import (
    MAX_JSON,
    decode_dcgm_json,
    parse_template,
    pinned_job,
)
from healer.core.spare_checks import (
    bus_bandwidth,
    dcgm_failures,
    judge,
    judge_dcgm,
    judge_nccl,
    parse_report,
)
from healer.core.spare_validation import SpareCheck, SpareValidation, bandwidth_table
from healer.errors import PermanentError

DATA = Path(__file__).parent / "data" / "spare_checks"
ALL_REDUCE = (DATA / "all_reduce_perf_h100x8.txt").read_text()
DCGM_PASS = (DATA / "dcgm_diag_r2_pass.json").read_text()
DCGM_FAIL = (DATA / "dcgm_diag_r2_fail.json").read_text()
POLICY = SpareValidation(enabled=True, checks=(SpareCheck.DCGM_DIAG, SpareCheck.NCCL_LOOPBACK),
                         bus_bandwidth_gbps=bandwidth_table({"NVIDIA H100 80GB HBM3": 350.0,
                                                             "NVIDIA H200": 380.0,
                                                             "default": 100.0}))


def test_all_reduce_perf_average_bus_bandwidth() -> None:
    assert bus_bandwidth(ALL_REDUCE) == pytest.approx(422.931)
    assert bus_bandwidth("no summary line") is None


def test_dcgm_diag_json_failures_name_test_gpu_and_warning() -> None:
    assert dcgm_failures(DCGM_PASS) == []  # Skip is not a failure
    assert dcgm_failures(DCGM_FAIL) == [
        "GPU Memory (GPU 3): Detected a DBE error on GPU 3",
        "PCIe (GPU 3): PCIe link width is x8, expected x16"]
    for not_it in ("", "{", "[]", '{"DCGM GPU Diagnostic": 1}', '{"x": {}}'):
        assert dcgm_failures(not_it) is None


@pytest.mark.parametrize(("exit_code", "text", "passed", "says"), [
    (0, DCGM_PASS, True, "passed"),
    (0, None, True, "no readable JSON"),
    (226, DCGM_FAIL, False, "GPU Memory (GPU 3): Detected a DBE"),
    (0, DCGM_FAIL, False, "PCIe (GPU 3)"),  # the JSON says failed even if the exit code does not
    (1, None, False, "exited 1 (no readable JSON"),
    (1, DCGM_PASS, False, "exited 1"),
])
def test_judge_dcgm(exit_code: int, text: str | None, passed: bool, says: str) -> None:
    out = judge_dcgm(exit_code, text)
    assert out.passed is passed
    assert says in out.detail
    assert out.check == "dcgm-diag"


@pytest.mark.parametrize(("exit_code", "model", "passed", "says"), [
    (0, "NVIDIA-H100-80GB-HBM3", True, "422.931 GB/s, at least the 350 GB/s threshold"),
    (0, "nvidia_h200", True, "at least the 380 GB/s threshold for nvidia_h200"),
    (0, "NVIDIA-A100-SXM4-80GB", True, "the 100 GB/s threshold for NVIDIA-A100-SXM4-80GB"),
    (3, "NVIDIA-H100-80GB-HBM3", False, "exited 3 (bus bandwidth 422.931 GB/s)"),
])
def test_judge_nccl_against_the_model_threshold(exit_code: int, model: str, passed: bool,
                                               says: str) -> None:
    out = judge_nccl(exit_code, ALL_REDUCE, model, POLICY)
    assert out.passed is passed
    assert says in out.detail
    if exit_code == 0:
        assert out.figure == "422.931 GB/s"


def test_judge_nccl_below_threshold_and_without_one() -> None:
    slow = ALL_REDUCE.replace("422.931", "312.5")
    out = judge_nccl(0, slow, "NVIDIA-H100-80GB-HBM3", POLICY)
    assert not out.passed
    assert out.detail == ("bus bandwidth 312.5 GB/s, below the 350 GB/s threshold for "
                          "NVIDIA-H100-80GB-HBM3")
    no_default = SpareValidation(enabled=True, bus_bandwidth_gbps=bandwidth_table({"x": 1.0}))
    out = judge_nccl(0, ALL_REDUCE, "NVIDIA-B200", no_default)
    assert not out.passed
    assert "no threshold for NVIDIA-B200" in out.detail
    assert not judge_nccl(0, "", "NVIDIA-B200", POLICY).passed


def test_report_header_and_judge_from_a_termination_message() -> None:
    msg = "healer-check nccl-loopback exit=0\n" + ALL_REDUCE[-200:]
    rep = parse_report(msg)
    assert rep is not None
    assert rep.check == "nccl-loopback"
    assert rep.exit_code == 0
    assert judge("nccl-loopback", 0, msg, None, "NVIDIA-H100-80GB-HBM3", POLICY).passed
    # the header's exit code is the tool's, not the shell's
    msg = "healer-check nccl-loopback exit=2\n" + ALL_REDUCE[-200:]
    assert not judge("nccl-loopback", 0, msg, None, "NVIDIA-H100-80GB-HBM3", POLICY).passed
    assert parse_report("no header\nbody") is None
    assert judge("dcgm-diag", 0, None, DCGM_PASS, "", POLICY).passed
    assert not judge("dcgm-diag", 0, "healer-check dcgm-diag exit=1\n", None, "", POLICY).passed


def _pack(text: str) -> str:
    return base64.b64encode(gzip.compress(text.encode())).decode()


def test_dcgm_report_body_decodes_and_fits_a_termination_message() -> None:
    body = _pack(DCGM_FAIL)
    assert decode_dcgm_json(body) == DCGM_FAIL
    wrapped = "\n".join(body[i:i + 76] for i in range(0, len(body), 76))  # base64 -w 76
    assert decode_dcgm_json(wrapped) == DCGM_FAIL
    assert len("healer-check dcgm-diag exit=0\n" + body) < 4096
    for bad in ("", "not base64!", base64.b64encode(b"not gzip").decode()):
        assert decode_dcgm_json(bad) in (None, "")


def test_a_decompression_bomb_is_not_read() -> None:
    bomb = base64.b64encode(gzip.compress(b"{" + b" " * (MAX_JSON + 10))).decode()
    assert decode_dcgm_json(bomb) is None


@given(st.text(max_size=300))
def test_judging_never_raises(text: str) -> None:
    for check in ("dcgm-diag", "nccl-loopback", "other"):
        out = judge(check, 0, text, text, text[:20], POLICY)
        assert isinstance(out.passed, bool)
    decode_dcgm_json(text)


SHIPPED = Path(__file__).parents[2] / "deploy" / "validation"


@pytest.mark.parametrize("check", ["dcgm-diag", "nccl-loopback"])
def test_shipped_templates_parse_and_are_pinned_to_the_spare(check: str) -> None:
    cm = yaml.safe_load((SHIPPED / f"{check}-job.yaml").read_text())
    assert cm["metadata"]["name"] == f"healer-validation-{check}"
    job = pinned_job(parse_template("cm", cm["data"]["job.yaml"]), name="j", namespace="ns",
                     node="spare-1", run="r1", check=check, model="NVIDIA-H200", deadline=600)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeName"] == "spare-1"
    assert job["spec"]["activeDeadlineSeconds"] == 600
    assert job["spec"]["backoffLimit"] == 0
    assert {t["key"] for t in pod["tolerations"]} >= {"healer.io/spare", "healer.io/remediation"}
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env == {"HEALER_NODE": "spare-1", "HEALER_CHECK": check, "HEALER_RUN": "r1",
                   "HEALER_GPU_MODEL": "NVIDIA-H200"}
    # PodSecurity "restricted" (healer's namespace)
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = pod["containers"][0]["securityContext"]
    assert sc == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    script = pod["containers"][0]["args"][0]
    assert f"healer-check {check} exit=$rc" in script
    assert "/dev/termination-log" in script


@pytest.mark.parametrize(("text", "says"), [
    (None, "has no job.yaml"),
    ("", "has no job.yaml"),
    ("kind: Job\nspec: [", "job.yaml is not YAML"),
    ("kind: Pod", "is not a Job manifest"),
    ("- 1", "is not a Job manifest"),
    ("kind: Job\nspec: []", "field spec: expected a mapping"),
    ("kind: Job\nspec: {template: {spec: {containers: {}}}}",
     "field spec.template.spec.containers: expected a list"),
    ("kind: Job\nspec: {template: {spec: {}}}", "expected a list of containers"),
    ("kind: Job\nspec: {template: {spec: {containers: [1]}}}", "expected a list of containers"),
])
def test_a_bad_template_is_a_clear_error(text: str | None, says: str) -> None:
    with pytest.raises(PermanentError, match="ConfigMap ns/healer-validation-x") as err:
        parse_template("ConfigMap ns/healer-validation-x", text)
    assert says in str(err.value)


def test_a_template_of_an_unexpected_shape_fails_pinning_with_a_type_error() -> None:
    job = parse_template("cm", "kind: Job\nspec: {template: {spec: {containers: [{env: 1}]}}}")
    with pytest.raises((AttributeError, TypeError)):  # run() turns it into a PermanentError
        pinned_job(job, name="j", namespace="ns", node="n", run="r", check="c", model="",
                   deadline=60)
