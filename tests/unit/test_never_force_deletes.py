"""What healer never does, read from its source (issue 20's "Done when"): it never deletes a pod
itself, let alone with grace period 0 (a dead node's pods are removed by Kubernetes: the taint
eviction and pod garbage collector of kube-controller-manager, after healer's out-of-service
taint), and the only taints it ever takes off a Node are its own: healer's remediation taint,
its spare taint, and the out-of-service taint it set (the adapter checks its provenance).

Scans ``healer/`` (what ships); the development side (``healer_dev``: the local stack's
kwok stages and test clean-up) is not healer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from healer.core import vocabulary as v

ROOT = Path(__file__).resolve().parents[2] / "healer"
SOURCES = sorted(ROOT.rglob("*.py"))

#: the taints healer may remove (its own; out-of-service only with its provenance)
OWN_TAINTS = {"REMEDIATION_TAINT", "SPARE_TAINT", "OUT_OF_SERVICE_TAINT"}


def test_healer_never_deletes_or_force_deletes_a_pod() -> None:
    bad = re.compile(r"delete_namespaced_pod\b|delete_collection_namespaced_pod|"
                     r"grace_?period_?seconds|gracePeriodSeconds", re.IGNORECASE)
    found = [f"{p.relative_to(ROOT.parent)}:{i}: {line.strip()}"
             for p in SOURCES for i, line in enumerate(p.read_text().splitlines(), 1)
             if bad.search(line)]
    assert not found, "healer deletes pods itself:\n" + "\n".join(found)


def _taint_filters(tree: ast.AST) -> list[tuple[int, str]]:
    """Every ``t.get("key") != X`` / ``t.key != X`` comparison (a taint filtered out)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or not isinstance(node.ops[0], ast.NotEq):
            continue
        left = node.left
        is_key = (isinstance(left, ast.Attribute) and left.attr == "key") or (
            isinstance(left, ast.Call) and isinstance(left.func, ast.Attribute)
            and left.func.attr == "get" and left.args
            and isinstance(left.args[0], ast.Constant) and left.args[0].value == "key")
        if is_key:
            right = node.comparators[0]
            out.append((node.lineno, ast.unparse(right)))
    return out


def test_healer_only_ever_removes_its_own_taints() -> None:
    seen: dict[str, list[str]] = {}
    for p in SOURCES:
        if p.name == "nodesets.py":  # a toleration's key, not a Node's taint
            continue
        for line, what in _taint_filters(ast.parse(p.read_text())):
            seen.setdefault(what, []).append(f"{p.relative_to(ROOT.parent)}:{line}")
    assert set(seen) <= OWN_TAINTS, {k: w for k, w in seen.items() if k not in OWN_TAINTS}
    assert {"REMEDIATION_TAINT", "SPARE_TAINT", "OUT_OF_SERVICE_TAINT"} <= set(seen)
    assert v.OUT_OF_SERVICE_TAINT == "node.kubernetes.io/out-of-service"
