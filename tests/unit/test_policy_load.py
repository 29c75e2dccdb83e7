"""Policy files: shipped ones validate; every kind of mistake names file, line and field;
hostile files (issue 12) are refused fast, in bounded memory, never with a traceback."""

from __future__ import annotations

import math
import os
import pickle
import threading
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healer.cli import main
from healer.core import rules as cp
from healer.core.health import evaluate
from healer.core.model import GpuRef, Severity, Signal, SignalKind
from healer.core.timefmt import MAX_SECONDS, MIN_SECONDS, format_duration, parse_rfc3339, rfc3339
from healer.errors import PolicyError
from healer.policy.checks import MAX_PROMQL_NESTING, MAX_PROMQL_OPERATORS, check_promql
from healer.policy.load import load_policy_set
from healer.policy.schema import parse_duration
from healer.policy.yamlsrc import LIMITS

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


# ---------------------------------------------------------------------------------------------
# Hostile input (issue 12): bounded, total, never a traceback


def _problems(path: Path) -> list[str]:
    with pytest.raises(PolicyError) as err:
        load_policy_set([path])
    return [str(p) for p in err.value.problems]


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)  # no writer: a blocking open would wait for ever
    assert _problems(fifo) == [f"{fifo}: expected a regular file, got a FIFO"]
    assert _problems(tmp_path) == [f"{fifo}: expected a regular file, got a FIFO"]


def test_dev_zero_is_refused_without_reading() -> None:
    assert _problems(Path("/dev/zero")) == [
        "/dev/zero: expected a regular file, got a character device"]


def test_an_oversized_file_is_refused_before_reading(tmp_path: Path) -> None:
    f = tmp_path / "big.yaml"
    with f.open("wb") as out:
        out.truncate(50 * 1024 * 1024)  # 50 MB, sparse: reading it would be the bug
    assert _problems(f) == [f"{f}: expected a policy file of at most {LIMITS.max_file_bytes} "
                            f"bytes, got {50 * 1024 * 1024} bytes"]


def test_a_binary_file_names_the_line_of_its_first_bad_byte(tmp_path: Path) -> None:
    f = tmp_path / "bin.yaml"
    f.write_bytes(b"a: 1\nb: 2\n\xff\xfe\x00garbage")
    assert _problems(f) == [f"{f}:3: expected UTF-8 text, got byte 0xff (is this a binary "
                            "file?)"]


def test_a_recursive_alias_is_a_problem_not_a_recursion_error(tmp_path: Path) -> None:
    f = tmp_path / "a.yaml"
    f.write_text("a: &a [*a]\n")  # the 11 bytes that crash-looped the daemon
    [problem] = _problems(f)
    assert problem.startswith(f"{f}:1: a[0]: invalid YAML: alias *a refers to its own anchor")


def test_an_alias_bomb_is_refused_within_a_bounded_amount_of_memory(tmp_path: Path) -> None:
    f = tmp_path / "lol.yaml"
    f.write_text((Path(__file__).parent / "policy_corpus" / "50-billion-laughs.yaml")
                 .read_text().replace("lol", "lol" * 100))
    tracemalloc.start()
    try:
        problems = _problems(f)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "aliases counted as what they expand to" in problems[0]
    assert peak < 32 * 1024 * 1024, f"peak {peak / 1e6:.0f} MB"


def test_5000_deep_flow_nesting_is_a_problem(tmp_path: Path) -> None:
    f = tmp_path / "deep.yaml"
    f.write_text("[" * 5000 + "]" * 5000)
    [problem] = _problems(f)
    assert problem.startswith(f"{f}:1: invalid YAML:")
    assert "nesting" in problem


def test_anchors_aliases_and_merge_keys_still_work(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("""apiVersion: healer.io/v1alpha1
kind: RemediationPolicy
metadata: {name: p}
spec:
  nodeSelector: {matchLabels: &sel {gpu: "true"}}
  rules:
    - &fatal {name: fatal, severity: failed, xid: {codes: [79]}}
    - <<: *fatal
      name: fatal-twice
      xid: {codes: [79], count: 2, within: 1h}
  guardrails: {failureDomains: [{key: topology.kubernetes.io/zone}]}
""")
    p = load_policy_set([f]).policies[0]
    assert dict(p.selector.match_labels) == {"gpu": "true"}
    assert [(r.name, getattr(r, "count", None)) for r in p.rules] == [("fatal", 1),
                                                                      ("fatal-twice", 2)]


def test_an_overlong_key_or_value_is_cut_in_the_message(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(f"apiVersion: {'x' * 60000}\n")
    [problem] = _problems(f)
    assert len(problem) < 300


def test_a_backtracking_prone_reason_runs_in_linear_time(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("""apiVersion: healer.io/v1alpha1
kind: RemediationPolicy
metadata: {name: p}
spec:
  nodeSelector: {matchLabels: {gpu: "true"}}
  rules:
    - {name: r, severity: failed, condition: {type: GPUHealthy, reason: '^(a+)+$'}}
""")
    rule = load_policy_set([f]).policies[0].rules[0]
    assert isinstance(rule, cp.ConditionRule)
    assert rule.reason is not None
    # Python's backtracking re needs ~2**40 steps for this; RE2 is linear (the test would hit
    # the per-test timeout otherwise).
    assert rule.reason.search("a" * 40 + "!") is None
    assert rule.reason.search("a" * 100_000 + "!") is None
    assert rule.reason.search("aaa") is not None


def test_compiled_policies_pickle_for_the_reload_subprocess(tmp_path: Path) -> None:
    ps = load_policy_set([ROOT / "policies"])
    again = pickle.loads(pickle.dumps(ps))
    assert again == ps


def test_promql_at_every_limit_parses_on_a_small_thread_stack() -> None:
    n, ops = MAX_PROMQL_NESTING, MAX_PROMQL_OPERATORS
    worst = ["(" * n + "x" + ")" * n, "abs(" * n + "x" + ")" * n, "x+" * ops + "x",
             "x^" * ops + "x", "-" * ops + "1", "x or " * ops + "x",
             "(" * n + "-" * (ops // 2) + "x" + "+x" * (ops // 2) + ")" * n]
    errors: list[BaseException] = []

    def parse_all() -> None:
        try:
            for q in worst:
                check_promql(q)
        except BaseException as e:  # reported to the test's thread
            errors.append(e)

    old = threading.stack_size(1024 * 1024)  # an eighth of a default thread's stack
    try:
        t = threading.Thread(target=parse_all)
        t.start()
    finally:
        threading.stack_size(old)
    t.join()
    assert errors == []
    for q in ("(" * (n + 1) + "x" + ")" * (n + 1), "x+" * (ops + 1) + "x"):
        with pytest.raises(ValueError, match="expected a PromQL expression"):
            check_promql(q)


@pytest.mark.parametrize(("t", "text"), [
    (0, "1970-01-01T00:00:00Z"), (1714564800.9, "2024-05-01T12:00:00Z"),
    (math.inf, "9999-12-31T23:59:59Z"), (-math.inf, "0001-01-01T00:00:00Z"),
    (math.nan, "1970-01-01T00:00:00Z"), (1e300, "9999-12-31T23:59:59Z"),
    (10**400, "9999-12-31T23:59:59Z"), (-(10**400), "0001-01-01T00:00:00Z")])
def test_the_timestamp_formatter_is_total(t: float, text: str) -> None:
    assert rfc3339(t) == text


@pytest.mark.parametrize("bad", ["x" * 100, 10**400, object(), "2024-13-99T99:99:99Z", "",
                                 "2024-05-01T12:00:00Z!", b"2024-05-01T12:00:00Z"])
def test_the_timestamp_parser_is_total(bad: object) -> None:
    assert parse_rfc3339(bad) is None


@pytest.mark.parametrize(("text", "t"), [
    ("2024-05-01T12:00:00Z", 1714564800.0), ("2024-05-01T12:00:00", 1714564800.0),
    ("2024-05-01T14:00:00.250+02:00", 1714564800.25), (" 2024-05-01T12:00:00Z\n", 1714564800.0)])
def test_the_timestamp_parser_reads_rfc3339_and_no_offset_as_utc(text: str, t: float) -> None:
    assert parse_rfc3339(text) == t


@given(st.floats(MIN_SECONDS, MAX_SECONDS - 1),
       st.sampled_from([{}, {"millis": True}, {"micros": True}]))
def test_a_written_timestamp_reads_back(t: float, how: dict[str, bool]) -> None:
    back = parse_rfc3339(rfc3339(t, **how))
    tolerance = 1e-6 if how.get("micros") else 1e-3 if how else 1.0
    assert back == pytest.approx(t, abs=tolerance, rel=1e-15)


@pytest.mark.parametrize("bad", ["9" * 400 + "s", "367d", "1e400s"])
def test_durations_are_finite_and_at_most_a_year(bad: str) -> None:
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(bad)


def test_validate_prints_file_line_problems_and_exits_1(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    (tmp_path / "a.yaml").write_text("a: &a [*a]\n")
    (tmp_path / "b.yaml").write_bytes(b"\x00\xff" * 100)
    (tmp_path / "c.yaml").write_text("[" * 5000)
    (tmp_path / "d.yaml").write_text('spec: {"\\e[31m": 1}\n')
    assert main(["validate", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "\x1b" not in err
    lines = err.splitlines()
    assert lines[-1] == "4 problem(s); nothing loaded"
    for name, line in (("a", 1), ("b", 1), ("c", 1), ("d", 1)):
        assert any(x.startswith(f"{tmp_path / name}.yaml:{line}: ") for x in lines), err


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (0.4, "0.4s"), (45, "45s"), (90, "1m30s"), (300, "5m"), (5400, "1h30m"),
    (7200, "2h"), (86400 + 7, "1d7s"), (604800, "7d"), (-90, "-1m30s"), (math.inf, "inf"),
    (-math.inf, "-inf"), (math.nan, "nan"), ("x", "?")])
def test_the_duration_formatter_is_total(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(("seconds", "units", "text"), [
    (4 * 86400 + 7200 + 13 * 60 + 7, 2, "4d2h"), (4 * 86400 + 13 * 60, 2, "4d"),
    (750, 2, "12m30s"), (750, 1, "12m"), (59, 1, "59s"), (86399, 1, "23h")])
def test_a_duration_to_so_many_units(seconds: float, units: int, text: str) -> None:
    assert format_duration(seconds, units=units) == text


@given(st.integers(0, 366 * 86400))
def test_a_written_duration_reads_back_as_a_policy_duration(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_the_duration_formatter_takes_the_largest_float() -> None:
    assert format_duration(1.7e308).endswith("s")


def test_an_infinite_window_never_breaks_an_evaluation() -> None:
    """Belt and braces: were a non-finite duration to get past the validator, evaluating the
    rule still answers (it used to raise OverflowError in the duration formatter)."""
    rules: tuple[cp.Rule, ...] = (
        cp.XidRule("x", Severity.FAILED, frozenset({79}), count=2, within=math.inf),
        cp.MetricRule("m", Severity.DEGRADING, "DCGM_FI_DEV_GPU_TEMP", cp.Op.GT, 90.0,
                      hold_for=math.inf))
    p = cp.Policy("p", cp.LabelSelector({"gpu": "true"}), rules)
    gpu = GpuRef(0, "GPU-a", "S0")
    signals = [Signal("n1", "dcgm", SignalKind.XID, "DCGM_FI_DEV_XID_ERRORS", 79.0, 10.0, gpu),
               Signal("n1", "dcgm", SignalKind.METRIC, "DCGM_FI_DEV_GPU_TEMP", 95.0, 10.0, gpu)]
    assert evaluate("n1", signals, p, now=20.0) is not None


def test_many_large_files_are_bounded_together(tmp_path: Path) -> None:
    body = "# " + "x" * (LIMITS.max_file_bytes - 4) + "\n"  # each file just under the limit
    n = LIMITS.max_total_bytes // LIMITS.max_file_bytes + 1
    for i in range(n):
        (tmp_path / f"{i:02d}.yaml").write_text(body)
    problems = _problems(tmp_path)
    assert f"{tmp_path / f'{n - 1:02d}.yaml'}: expected at most {LIMITS.max_total_bytes} bytes " \
           "in all policy files together" in problems


def test_many_files_of_many_values_are_bounded_together(tmp_path: Path) -> None:
    per_file = LIMITS.max_nodes - 100
    for i in range(LIMITS.max_total_nodes // per_file + 1):
        (tmp_path / f"{i:02d}.yaml").write_text("[" + ",".join(["1"] * per_file) + "]\n")
    problems = _problems(tmp_path)
    assert any(f"expected at most {LIMITS.max_total_nodes} values in all policy files" in p
               for p in problems)
