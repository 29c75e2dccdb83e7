"""The shipped recording rules (deploy/prometheus/healer-recording-rules.yaml, generated from
policies/default.yaml): promtool accepts them, and its rule engine computes what the unit tests
beside them expect (per GPU, per node, GPUs over each rule's threshold)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from healer.core.rules import MetricRule
from healer.docs import recording_rules_yaml
from healer.policy.load import load_policy_set
from tests.unit.test_dashboards import promtool

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "healer-recording-rules.yaml"
TESTS = ROOT / "deploy" / "prometheus" / "healer-recording-rules.test.yaml"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=RULES.parent, capture_output=True,
                          text=True, timeout=120, check=False)


def test_promtool_accepts_the_rules() -> None:
    r = _run("check", "rules", RULES.name)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_rule_engine_computes_what_the_tests_expect() -> None:
    r = _run("test", "rules", TESTS.name)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_metric_rule_of_the_default_policies_is_recorded() -> None:
    policies = load_policy_set([ROOT / "policies" / "default.yaml"])
    doc = yaml.safe_load(recording_rules_yaml())
    counted = {(r["labels"]["policy"], r["labels"]["rule"]) for g in doc["groups"]
               for r in g["rules"] if "labels" in r}
    expected = {(p.name, r.name) for p in policies.policies for r in p.rules
                if isinstance(r, MetricRule)}
    assert expected
    assert counted == expected
