"""Load policy files: YAML → field schema → cross-field rules → one frozen :class:`PolicySet`.

Every problem in every file is collected and reported together (file, line, field, what was
expected); if there is any, :class:`~healer.errors.PolicyError` is raised and nothing from any
file is used, so a reload with a broken file keeps the previous policies in force.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pydantic
import yaml

from healer.core import rules as core
from healer.core.nodesets import NodeSetRules, NodeSets
from healer.core.xid import XidCatalog
from healer.errors import PolicyError, Problem
from healer.policy import schema as s
from healer.policy.catalog import default_catalog
from healer.policy.compile import CompileErrors, compile_fleet, compile_policy
from healer.policy.nodesets import check_nodesets, compile_nodeset
from healer.policy.roles import Located, check_roles
from healer.policy.yamlsrc import (
    LIMITS,
    ReadBudget,
    SourceDoc,
    SourceError,
    load_documents,
    read_source,
)

YAML_SUFFIXES = (".yaml", ".yml")


MAX_FILES = 1000  # policy files under the given paths
MAX_PROBLEMS_PER_FILE = 50


def policy_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The YAML files named by ``paths`` (directories are searched recursively, sorted).

    Anything with a YAML suffix that is not a directory is listed, a FIFO or a device included,
    so that reading it reports what it is instead of skipping it silently.
    """
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if any(part.startswith("..") for part in f.relative_to(p).parts):
                    continue  # ConfigMap mounts keep old versions under ..data/ ..timestamp/
                if f.suffix in YAML_SUFFIXES and not f.is_dir():
                    out.append(f)
                if len(out) > MAX_FILES:
                    return out
        else:
            out.append(p)
    return out


def load_policy_set(paths: Iterable[str | os.PathLike[str]], *,
                    catalog: XidCatalog | None = None,
                    max_mode: core.Mode | None = None) -> core.PolicySet:
    """Load and compile every policy under ``paths``.

    ``max_mode`` caps every policy's mode (``healer run --dry-run`` passes ``Mode.DRY_RUN``).
    """
    catalog = catalog or default_catalog()
    problems: list[Problem] = []
    try:
        files = policy_files(paths)
    except (OSError, ValueError) as e:  # an unreadable directory, a symlink loop, a NUL
        files = []
        problems.append(Problem(", ".join(str(p) for p in paths), 0, "",
                                f"cannot list the policy files: {str(e)[:200]}"))
    if not files and not problems:
        problems.append(Problem(", ".join(str(p) for p in paths), 0, "",
                                "no policy files (*.yaml) found"))
    policies: list[tuple[core.Policy, SourceDoc]] = []
    fleets: list[tuple[core.FleetRules, SourceDoc]] = []
    nodesets: list[tuple[NodeSetRules, SourceDoc]] = []
    digest = hashlib.sha256()
    if len(files) > MAX_FILES:
        problems.append(Problem(", ".join(str(p) for p in paths), 0, "",
                                f"expected at most {MAX_FILES} policy files"))
        files = []
    total = ReadBudget(LIMITS.max_total_bytes, LIMITS.max_total_nodes)
    for f in files:
        found: list[Problem] = []
        try:
            _load_file(f, catalog, found, (policies, fleets, nodesets), digest, total)
        except Exception as e:  # belt and braces: a loader bug is a problem, never a crash
            found.append(Problem(str(f), 0, "", f"internal error while loading this file "
                                                f"({type(e).__name__}); please report it"))
        if len(found) > MAX_PROBLEMS_PER_FILE:
            more = len(found) - MAX_PROBLEMS_PER_FILE
            found = [*found[:MAX_PROBLEMS_PER_FILE],
                     Problem(str(f), 0, "", f"... and {more} more problem(s)")]
        problems.extend(found)
    _cross_file_checks(policies, fleets, problems)
    check_nodesets([(n, doc.file, doc.line_of) for n, doc in nodesets], problems)
    check_roles([(p, _located(doc)) for p, doc in policies],
                (fleets[0][0], _located(fleets[0][1])) if fleets else None,
                [(n, _located(doc)) for n, doc in nodesets], problems)
    if problems:
        raise PolicyError(problems)
    plist = [p for p, _ in policies]
    if max_mode is not None:
        plist = [replace(p, mode=max_mode) if p.mode.rank > max_mode.rank else p for p in plist]
    fleet = fleets[0][0] if fleets else core.FleetRules()
    return core.PolicySet(policies=tuple(sorted(plist, key=lambda p: p.name)), fleet=fleet,
                          digest=digest.hexdigest()[:16],
                          nodesets=NodeSets(tuple(n for n, _ in nodesets)))


_Found = tuple[list[tuple[core.Policy, SourceDoc]], list[tuple[core.FleetRules, SourceDoc]],
               list[tuple[NodeSetRules, SourceDoc]]]


def _load_file(f: Path, catalog: XidCatalog, problems: list[Problem], found: _Found,
               digest: Any, total: ReadBudget) -> None:
    policies, fleets, nodesets = found
    try:
        text = read_source(f, total=total)
    except SourceError as e:
        problems.append(Problem(str(f), e.line, "", e.message))
        return
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        problems.append(Problem(str(f), 0, "", f"cannot read: {getattr(e, 'strerror', '') or e}"))
        return
    digest.update(str(f.name).encode() + b"\0" + text.encode() + b"\0")
    docs: list[SourceDoc] = []
    try:
        docs.extend(load_documents(text, str(f), total=total))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        if isinstance(e, yaml.reader.ReaderError):  # a control character: offset in UTF-8 bytes
            line = text.encode("utf-8", "replace").count(b"\n", 0, max(e.position, 0)) + 1
        line = min(line, max(text.count("\n"), 1))  # "<stream end>" is past the last line
        field = _dotted(getattr(e, "path", ()))  # the value being read, when known
        problems.append(Problem(str(f), line, field, f"invalid YAML: {_yaml_reason(e)}"))
        return
    if not docs:
        problems.append(Problem(str(f), 0, "", "the file holds no YAML document"))
    for doc in docs:
        compiled = _load_doc(doc, catalog, problems)
        if isinstance(compiled, core.Policy):
            policies.append((compiled, doc))
        elif isinstance(compiled, core.FleetRules):
            fleets.append((compiled, doc))
        elif isinstance(compiled, NodeSetRules):
            nodesets.append((compiled, doc))


def _yaml_reason(e: yaml.YAMLError) -> str:
    problem = getattr(e, "problem", None)
    context = getattr(e, "context", None)
    parts = [str(x) for x in (context, problem) if x]
    return "; ".join(parts) if parts else str(e).splitlines()[0]


def _where(doc: SourceDoc) -> str:
    return f"{doc.file}:{doc.start_line}"


def _located(doc: SourceDoc) -> Located:
    return Located(doc.file, _where(doc), doc.line_of)


def _load_doc(doc: SourceDoc, catalog: XidCatalog,
              problems: list[Problem]) -> core.Policy | core.FleetRules | NodeSetRules | None:
    data = doc.data
    if not isinstance(data, dict):
        problems.append(Problem(doc.file, doc.start_line, "",
                                f"expected a mapping (a policy document), got {_kind_of(data)}"))
        return None
    api = data.get("apiVersion")
    if api != s.API_VERSION:
        problems.append(Problem(doc.file, doc.line_of(("apiVersion",)), "apiVersion",
                                f"expected {s.API_VERSION!r}, got {_short(api)}"))
        return None
    kind = data.get("kind")
    if kind not in s.KINDS:
        problems.append(Problem(doc.file, doc.line_of(("kind",)), "kind",
                                f"expected one of {', '.join(s.KINDS)}, got {_short(kind)}"))
        return None
    try:
        model = s.DOCUMENT.validate_python(data)
    except pydantic.ValidationError as e:
        for err in e.errors(include_url=False):
            loc = tuple(err["loc"])
            if loc and loc[0] in s.KINDS:
                loc = loc[1:]
            problems.append(Problem(doc.file, doc.line_of(loc), _dotted(loc),
                                    _explain(err, loc, kind)))
        return None
    try:
        if isinstance(model, s.RemediationPolicy):
            return compile_policy(model, catalog, source=_where(doc))
        if isinstance(model, s.SlurmNodeSet):
            return compile_nodeset(model, source=_where(doc))
        return compile_fleet(model, source=_where(doc))
    except CompileErrors as ce:
        for issue in ce.issues:
            problems.append(Problem(doc.file, doc.line_of(issue.path), _dotted(issue.path),
                                    issue.message))
        return None


def _cross_file_checks(policies: Sequence[tuple[core.Policy, SourceDoc]],
                       fleets: Sequence[tuple[core.FleetRules, SourceDoc]],
                       problems: list[Problem]) -> None:
    seen: dict[str, SourceDoc] = {}
    for p, doc in policies:
        if p.name in seen:
            problems.append(Problem(doc.file, doc.line_of(("metadata", "name")), "metadata.name",
                                    f"policy {p.name!r} is already defined at "
                                    f"{_where(seen[p.name])}"))
        seen.setdefault(p.name, doc)
    for _, doc in fleets[1:]:
        problems.append(Problem(doc.file, doc.start_line, "kind",
                                f"only one FleetGuardrails document is allowed; the first is at "
                                f"{_where(fleets[0][1])}"))


def _dotted(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif part == "[key]":  # pydantic's marker for a bad mapping key: the key is named
            continue
        else:
            text = str(part)
            out += ("." if out else "") + (text if len(text) <= 60 else text[:57] + "...")
    return out if len(out) <= 120 else out[:117] + "..."


def _short(v: Any) -> str:
    """``repr(v)`` cut to a length an error message can carry."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**18:
        return f"a {len(str(abs(v)))}-digit number"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind_of(v: Any) -> str:
    if isinstance(v, bool):
        return f"a boolean ({v})"
    if isinstance(v, (int, float)):
        return f"a number ({_short(v)})"
    if isinstance(v, str):
        return f"a string ({_short(v)})"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "a mapping"
    return "nothing" if v is None else type(v).__name__


def _explain(err: Any, loc: tuple[Any, ...], kind: str) -> str:
    t = err["type"]
    got = err.get("input")
    ctx = err.get("ctx") or {}
    match t:
        case "missing":
            return "required field is missing"
        case "extra_forbidden":
            allowed = _allowed_fields(kind, loc[:-1])
            hint = f" (expected one of: {', '.join(allowed)})" if allowed else ""
            return f"unknown field {_short(loc[-1])}{hint}"
        case "literal_error":
            return f"expected one of {ctx.get('expected')}, got {_short(got)}"
        case "float_parsing" | "float_type":
            return f"expected a number, got {_kind_of(got)}"
        case "int_parsing" | "int_type" | "int_from_float":
            return f"expected an integer, got {_kind_of(got)}"
        case "bool_parsing" | "bool_type":
            return f"expected true or false, got {_kind_of(got)}"
        case "string_type":
            return f"expected a string, got {_kind_of(got)}"
        case "dict_type" | "model_type" | "model_attributes_type":
            return f"expected a mapping, got {_kind_of(got)}"
        case "list_type":
            return f"expected a list, got {_kind_of(got)}"
        case "greater_than":
            return f"expected a value > {ctx.get('gt')}, got {_short(got)}"
        case "greater_than_equal":
            return f"expected a value ≥ {ctx.get('ge')}, got {_short(got)}"
        case "less_than_equal":
            return f"expected a value ≤ {ctx.get('le')}, got {_short(got)}"
        case "less_than":
            return f"expected a value < {ctx.get('lt')}, got {_short(got)}"
        case "finite_number":
            return f"expected a finite number (not .nan, .inf or -.inf), got {_short(got)}"
        case "too_long":
            return f"expected at most {ctx.get('max_length')} item(s)"
        case "too_short":
            return f"expected at least {ctx.get('min_length')} item(s)"
        case "string_too_long":
            return f"expected at most {ctx.get('max_length')} characters"
        case "string_pattern_mismatch":
            if loc and loc[-1] == "name":
                return (f"expected a lowercase DNS-1123 name (a-z, 0-9, '-'), got {_short(got)}")
            return f"expected a value matching {ctx.get('pattern')}, got {_short(got)}"
        case "value_error":
            return str(err["msg"]).removeprefix("Value error, ")
    return str(err["msg"])


def _allowed_fields(kind: str, loc: tuple[Any, ...]) -> list[str]:
    """The field names (as written in YAML) of the model at ``loc`` inside a ``kind`` document."""
    model: Any = {"RemediationPolicy": s.RemediationPolicy,
                  "SlurmNodeSet": s.SlurmNodeSet}.get(kind, s.FleetGuardrails)
    for part in loc:
        if isinstance(part, int):
            continue
        field = next((f for name, f in model.model_fields.items()
                      if (f.alias or name) == part), None)
        if field is None:
            return []
        model = _model_in(field.annotation)
        if model is None:
            return []
    return [f.alias or n for n, f in model.model_fields.items()]


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        m = _model_in(arg)
        if m is not None:
            return m
    return None
