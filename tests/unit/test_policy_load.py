"""Policy files: shipped ones validate; every kind of mistake names file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from healer.core import policy as cp
from healer.core.model import Severity
from healer.errors import PolicyError
from healer.policy.load import load_policy_set
from healer.policy.schema import parse_duration

ROOT = Path(__file__).resolve().parents[2]
CORPUS = sorted((Path(__file__).parent / "policy_corpus").glob("*.yaml"))
SHIPPED = [ROOT / "policies" / "default.yaml",
           *sorted((ROOT / "policies" / "examples").glob("*.yaml")),
           *sorted((ROOT / "scenarios").glob("*-policy.yaml"))]


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_policy_validates(path: Path) -> None:
    ps = load_policy_set([path])
    assert ps.policies
    for p in ps.policies:
        assert p.rules


def test_all_shipped_policies_load_together() -> None:
    ps = load_policy_set([ROOT / "policies"])
    names = [p.name for p in ps.policies]
    assert len(names) == len(set(names))
    assert {"gpu-fatal", "gpu-degrading"} <= set(names)


def test_default_policies_are_observe_only() -> None:
    ps = load_policy_set([ROOT / "policies" / "default.yaml"])
    assert {p.mode for p in ps.policies} == {cp.Mode.OBSERVE}
    fatal = ps.get("gpu-fatal")
    assert fatal is not None
    xid = next(r for r in fatal.rules if isinstance(r, cp.XidRule))
    assert {79, 48, 95} <= xid.codes
    assert 13 not in xid.codes  # an application error never replaces a node
    assert not fatal.steps.checkpoint.applies_to(Severity.FAILED)
    degrading = ps.get("gpu-degrading")
    assert degrading is not None
    assert degrading.steps.checkpoint.applies_to(Severity.DEGRADING)
    fields = {r.field for r in degrading.rules if isinstance(r, cp.MetricRule)}
    assert {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_PENDING",
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_GPU_TEMP"} <= fields


def _expectation(path: Path) -> tuple[int, str, str]:
    header = path.read_text().splitlines()[0]
    assert header.startswith("# expect: "), f"{path.name} has no expectation header"
    line, field, message = (x.strip() for x in header[len("# expect: "):].split("|", 2))
    return int(line), field, message


def test_corpus_covers_at_least_fifteen_mistakes() -> None:
    assert len(CORPUS) >= 15


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_broken_policy_fails_with_file_line_and_field(path: Path) -> None:
    line, field, message = _expectation(path)
    with pytest.raises(PolicyError) as err:
        load_policy_set([path])
    problems = err.value.problems
    assert any(p.file == str(path) and p.line == line and p.field == field
               and message in p.message for p in problems), \
        "\n".join(str(p) for p in problems)
    assert str(path) in str(err.value)


def test_one_bad_file_means_nothing_is_loaded(tmp_path: Path) -> None:
    good = (ROOT / "policies" / "default.yaml").read_text()
    (tmp_path / "a.yaml").write_text(good)
    (tmp_path / "b.yaml").write_text(CORPUS[5].read_text())
    with pytest.raises(PolicyError) as err:
        load_policy_set([tmp_path])
    assert all(p.file.endswith("b.yaml") for p in err.value.problems)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    f = tmp_path / "many.yaml"
    f.write_text("""apiVersion: healer.io/v1alpha1
kind: RemediationPolicy
metadata: {name: p}
spec:
  mode: sometimes
  nodeSelector: {matchLabels: {a: b}}
  rules:
    - {name: x, severity: failed, xid: {groups: [nope]}}
  guardrails: {maxConcurrent: many}
""")
    with pytest.raises(PolicyError) as err:
        load_policy_set([f])
    fields = {p.field for p in err.value.problems}
    assert {"spec.mode", "spec.guardrails.maxConcurrent"} <= fields


def test_no_files(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="no policy files"):
        load_policy_set([tmp_path])


def test_configmap_history_dirs_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "..2026_01_01").mkdir()
    (tmp_path / "..2026_01_01" / "old.yaml").write_text("garbage: [")
    (tmp_path / "default.yaml").write_text((ROOT / "policies" / "default.yaml").read_text())
    assert load_policy_set([tmp_path]).policies


def test_max_mode_caps_every_policy() -> None:
    ps = load_policy_set([ROOT / "policies" / "examples"], max_mode=cp.Mode.DRY_RUN)
    assert all(p.mode.rank <= cp.Mode.DRY_RUN.rank for p in ps.policies)


def test_digest_changes_with_content(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text((ROOT / "policies" / "default.yaml").read_text())
    d1 = load_policy_set([f]).digest
    f.write_text(f.read_text().replace("maxConcurrent: 2", "maxConcurrent: 3", 1))
    assert load_policy_set([f]).digest != d1


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30), ("5m", 300), ("1h30m", 5400), ("7d", 604800), ("500ms", 0.5), ("1.5h", 5400)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["5", "5 minutes", "", "m5", 5, True, "-1s"])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(bad)
