"""The healer command line, run in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from healer.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_validate_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(ROOT / "policies")]) == 0
    assert "policies valid" in capsys.readouterr().out


def test_validate_reports_problems(capsys: pytest.CaptureFixture[str]) -> None:
    bad = ROOT / "tests" / "unit" / "policy_corpus" / "07-bad-threshold-type.yaml"
    assert main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "07-bad-threshold-type.yaml:12: spec.rules[0].metric.threshold" in err
    assert "nothing loaded" in err


def test_workflow_prints_mermaid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workflow"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("stateDiagram-v2")
    assert "Draining --> Cordoned" in out


def test_xid_explains_what_healer_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["xid", "79", "--policies", str(ROOT / "policies" / "default.yaml")]) == 0
    out = capsys.readouterr().out
    assert "GPU_HAS_FALLEN_OFF_THE_BUS" in out
    assert "policy gpu-fatal (mode observe): rule fatal-xid" in out
    assert "observe-only" in out
    assert main(["xid", "13", "--policies", str(ROOT / "policies" / "default.yaml")]) == 0
    assert "no rule matches" in capsys.readouterr().out
    assert main(["xid", "4242"]) == 1


def test_simulate_demo_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(ROOT / "scenarios" / "xid79-warm-spare.yaml")]) == 0
    out = capsys.readouterr().out
    assert "Draining → Cordoned" in out
    assert "all 2 expectations met" in out


def test_bad_scenario_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("name: x\npolicies: [nope.yaml]\nfleet: {nodes: []}\n")
    assert main(["simulate", str(f)]) == 2
    assert "fleet.nodes" in capsys.readouterr().err
