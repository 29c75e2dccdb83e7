"""One vocabulary: every ``healer.io/`` key is defined once, in healer.core.vocabulary.

The package holds no ``"healer.io/…"`` string literal anywhere else (the CRD's and the
policies' API version ``healer.io/v1alpha1`` is an API group, a different thing), no value is
defined twice, and every ledger step an action names is a :class:`StepName`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from healer.core import vocabulary
from healer.core.actions import ALL_ACTIONS, UndrainSlurm, Validate
from healer.core.vocabulary import StepName

PACKAGE = Path(vocabulary.__file__).resolve().parent.parent
VOCABULARY = Path(vocabulary.__file__).resolve()
#: ``healer.io`` as an API group: the CRD's and the policy files' apiVersion.
API_VERSIONS = {"healer.io/v1alpha1"}


def _literals(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string constant in the module, f-string parts included; docstrings not."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef
                                | ast.AsyncFunctionDef)
                  and n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings]


def test_no_healer_io_literal_outside_the_vocabulary() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.resolve() == VOCABULARY:
            continue
        for line, text in _literals(ast.parse(path.read_text("utf-8"))):
            if text.startswith("healer.io/") and text not in API_VERSIONS:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {text!r}")
    assert not found, ("use the names in healer/core/vocabulary.py, not the strings:\n"
                       + "\n".join(found))


def test_every_name_is_defined_once() -> None:
    values = [v for k, v in vars(vocabulary).items()
              if k.isupper() and isinstance(v, str) and v.startswith("healer.io/")]
    assert len(values) == len(set(values))
    assert all(v.startswith("healer.io/") for v in (
        vocabulary.EXCLUDE_LABEL, vocabulary.CORDONED_BY, vocabulary.REPAIR_RESULT,
        vocabulary.SPARE_TAINT, vocabulary.REMEDIATION_TAINT, vocabulary.ROLE_LABEL))


def test_every_ledger_step_is_a_step_name() -> None:
    names = {StepName(cls.step) for cls in ALL_ACTIONS}
    names |= {StepName(Validate("i", "n", purpose=p).ledger_name)
              for p in ("replacement", "repaired")}
    names |= {StepName(UndrainSlurm("i", "n", purpose=p).ledger_name) for p in ("serve", "undo")}
    assert names == set(StepName)


def test_the_wire_format_is_unchanged() -> None:
    """The strings other systems see: changing one is a breaking change, not a refactor."""
    assert vocabulary.SLURM_REASON_PREFIX == "healer: "
    assert vocabulary.CORDONED_BY == "healer.io/cordoned-by"
    assert (vocabulary.ROLE_LABEL, vocabulary.SPARE_ROLE) == ("healer.io/role", "spare")
    assert vocabulary.SPARE_TAINT == "healer.io/spare"
    assert vocabulary.REMEDIATION_TAINT == "healer.io/remediation"
    assert vocabulary.REPAIR_RESULT == "healer.io/repair-result"
    assert StepName.CLAIM_SPARE == "claim-spare"
