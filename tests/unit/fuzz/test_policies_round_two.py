"""Fuzz: the policy surface of issue 22, generated, each class against an oracle of its own.

* NodeSets and spares: random selectors for NodeSets, their spares and the fleet's spares.
  Accepted ⇒ brute force over every labelling of the keys and values they mention finds a
  serving node that is no spare, a spare that serves nowhere, and a node each NodeSet serves
  (it is the first by name to select it); refused ⇒ the problem names both documents.
* PromQL: generated ranges, subquery steps and nesting, offsets, selectors with and without a
  metric name. The verdict is computed from what was generated (lookback, steps, depth) and
  must be the loader's; a refusal names ``spec.rules[0].metric.promql``.
* Regexes: brace expressions in every field that takes a regex (condition and Slurm reasons,
  PromQL label matchers). RE2 is the oracle: the loader accepts a brace exactly when RE2 reads
  it as a repeat of at most 1000 (it matches ``a`` repeated, never the literal text).
* YAML tags: a tag on a random scalar of a valid policy is refused (naming the tag and the
  field) unless it is ``!`` or ``!!str``.
* Load-time references: generated jobTemplate, validation image and secretRef values; what is
  accepted is what Kubernetes and an image reference allow (checked by a second, simpler
  reading of each grammar), anything else is refused naming the field.
"""

from __future__ import annotations

import itertools
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import re2
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healer.core.rules import LabelSelector
from healer.errors import PolicyError
from healer.policy.load import load_policy_set

FUZZ = settings(max_examples=250, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])
_dir = tempfile.TemporaryDirectory(prefix="fuzz-round-two-")
WORK = Path(_dir.name)
POLICY = {"apiVersion": "healer.io/v1alpha1", "kind": "RemediationPolicy",
          "metadata": {"name": "p"},
          "spec": {"nodeSelector": {"matchLabels": {"gpu": "true"}},
                   "rules": [{"name": "r", "severity": "failed", "xid": {"codes": [79]}}]}}


def _load(docs: list[dict[str, Any]] | str, name: str = "p.yaml") -> Any:
    f = WORK / name
    f.write_text(docs if isinstance(docs, str) else yaml.safe_dump_all(docs, sort_keys=False))
    try:
        return load_policy_set([f])
    except PolicyError as e:
        for p in e.problems:
            assert p.file == str(f), str(p)
            assert "internal error" not in p.message, str(p)
        return e


@pytest.fixture(autouse=True, scope="module")
def _cleanup() -> Iterator[None]:
    yield
    _dir.cleanup()


# -- NodeSets and spares -----------------------------------------------------------------------

KEYS = ("pool", "role", "tier")
VALUES = ("a", "b")
_req = st.one_of(
    st.builds(lambda k, op, vs: {"key": k, "operator": op, "values": sorted(vs)},
              st.sampled_from(KEYS), st.sampled_from(("In", "NotIn")),
              st.frozensets(st.sampled_from(VALUES), min_size=1)),
    st.builds(lambda k, op: {"key": k, "operator": op}, st.sampled_from(KEYS),
              st.sampled_from(("Exists", "DoesNotExist"))))
selectors = st.builds(
    lambda labels, exprs: {k: v for k, v in (("matchLabels", labels),
                                              ("matchExpressions", exprs)) if v},
    st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), min_size=1, max_size=2),
    st.lists(_req, max_size=2))


def _compiled(sel: dict[str, Any]) -> LabelSelector:
    return LabelSelector(dict(sel.get("matchLabels", {})), tuple(
        (e["key"], e["operator"], frozenset(e.get("values", ())))
        for e in sel.get("matchExpressions", ())))


LABELLINGS = [{k: v for k, v in zip(KEYS, combo, strict=True) if v is not None}
              for combo in itertools.product((None, *VALUES, "other"), repeat=len(KEYS))]


def _nodeset(name: str, nodes: dict[str, Any], spares: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"cluster": f"c-{name}",
                            "slurm": {"driver": "scontrol", "slurmConf": f"/etc/{name}.conf"},
                            "nodeSelector": nodes}
    if spares is not None:
        spec["spareSelector"] = spares
    return {"apiVersion": "healer.io/v1alpha1", "kind": "SlurmNodeSet",
            "metadata": {"name": name}, "spec": spec}


@FUZZ
@given(a=selectors, b=selectors, spares_a=st.none() | selectors,
       spares_b=st.none() | selectors, fleet=selectors)
def test_an_accepted_nodeset_pair_serves_and_never_makes_a_node_both(
        a: dict[str, Any], b: dict[str, Any], spares_a: dict[str, Any] | None,
        spares_b: dict[str, Any] | None, fleet: dict[str, Any]) -> None:
    docs = [{"apiVersion": "healer.io/v1alpha1", "kind": "FleetGuardrails",
             "metadata": {"name": "fleet"}, "spec": {"spareSelector": fleet}},
            _nodeset("a", a, spares_a), _nodeset("b", b, spares_b), POLICY]
    got = _load(docs)
    if isinstance(got, PolicyError):
        for p in got.problems:  # an overlap names both documents (or is another problem)
            if "warm spare" in p.message and "SlurmNodeSet" in p.message:
                assert p.field in ("spec.nodeSelector", "spec.spareSelector"), str(p)
                assert p.message.count("'") >= 2 or "default" in p.message, str(p)
        return
    spare_sels = [_compiled(s) for s in (fleet, spares_a, spares_b) if s is not None]
    ns = [("a", _compiled(a)), ("b", _compiled(b))]
    for name, sel in ns:
        for sp in spare_sels:  # some serving node is no spare of sp, some spare of it serves
            assert any(sel.matches(lb) and not sp.matches(lb) for lb in LABELLINGS), name
            assert any(sp.matches(lb) and not sel.matches(lb) for lb in LABELLINGS), name
    # b serves something: a node it selects that a (first by name) does not
    assert any(ns[1][1].matches(lb) and not ns[0][1].matches(lb) for lb in LABELLINGS)


# -- PromQL -------------------------------------------------------------------------------------

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "y": 365 * 86400.0}
durations = st.tuples(st.integers(1, 400), st.sampled_from(list(UNITS)))


def _d(d: tuple[int, str]) -> str:
    return f"{d[0]}{d[1]}"


def _s(d: tuple[int, str]) -> float:
    return d[0] * UNITS[d[1]]


@st.composite
def promql(draw: st.DrawFn) -> tuple[str, bool]:
    """An expression and whether healer must accept it (from what was generated)."""
    named = draw(st.sampled_from(["name", "name-matcher", "none", "regex-name"]))
    sel = {"name": 'DCGM_FI_DEV_GPU_TEMP{Hostname!=""}',
           "name-matcher": '{__name__="DCGM_FI_DEV_GPU_TEMP",Hostname!=""}',
           "none": '{Hostname!=""}',
           "regex-name": '{__name__=~"DCGM_.+",Hostname!=""}'}[named]
    ok = named in ("name", "name-matcher")
    inner = draw(durations)
    expr = f"rate({sel}[{_d(inner)}])"
    back = _s(inner)
    subqueries = draw(st.integers(0, 2))
    for _ in range(subqueries):
        rng, step = draw(durations), draw(st.none() | durations)
        offset = draw(st.none() | durations)
        expr = f"max_over_time(({expr})[{_d(rng)}:{_d(step) if step else ''}]" + (
            f" offset {_d(offset)})" if offset else ")")
        back += _s(rng) + (_s(offset) if offset else 0.0)
        if step is None or _s(step) < 10 or _s(rng) / _s(step) > 1440:
            ok = False
    if subqueries > 1:
        ok = False
    if back > 86400:
        ok = False
    return f"max by (Hostname) ({expr})", ok


@FUZZ
@given(case=promql())
def test_a_promql_rule_is_accepted_exactly_when_its_cost_is_bounded(case: tuple[str, bool]
                                                                    ) -> None:
    expr, ok = case
    pol = yaml.safe_load(yaml.safe_dump(POLICY))
    pol["spec"]["rules"] = [{"name": "r", "severity": "failed",
                             "metric": {"promql": expr, "nodeLabel": "Hostname",
                                        "threshold": 90}}]
    got = _load([pol])
    if ok:
        assert not isinstance(got, PolicyError), (expr, [str(p) for p in got.problems])
    else:
        assert isinstance(got, PolicyError), expr
        assert any(p.field == "spec.rules[0].metric.promql" for p in got.problems), \
            (expr, [str(p) for p in got.problems])


# -- regexes: RE2 is the oracle -----------------------------------------------------------------

braces = st.one_of(
    st.builds(lambda n: f"{{{n}}}", st.integers(0, 2000) | st.sampled_from(
        ["01", "", " 3", "3 ", "4294967296", "99999999", "100000000", "+1", "-1"])),
    st.builds(lambda n, m: f"{{{n},{m}}}", st.integers(0, 1200).map(str) | st.just(""),
              st.integers(0, 1200).map(str) | st.sampled_from(["", "4294967296", "01"])),
    st.text("{},0123456789 ", min_size=1, max_size=8))


def _re2_reads_a_repeat(token: str) -> bool | None:
    """RE2's reading of ``a<token>``: True a repeat, False literal text, None an error."""
    opts = re2.Options()
    opts.log_errors = False
    try:
        r = re2.compile(f"^a{token}$", opts)
    except re2.error:
        return None
    counts = {0, 1, 2, *(int(n) for n in re.findall(r"\d+", token) if int(n) <= 1300)}
    # read as a repeat, some run of a's matches; read as literal text, a '{' is needed
    return any(r.search("a" * k) is not None for k in counts)


@FUZZ
@given(token=braces, where=st.sampled_from(["condition", "slurm", "promql"]))
def test_a_brace_is_accepted_exactly_when_re2_reads_it_as_a_repeat(token: str,
                                                                   where: str) -> None:
    if "}" in token[:-1] or token.count("{") != 1 or not token.startswith("{"):
        token = token.replace("{", "").replace("}", "")
        token = "{" + token + "}"
    verdict = _re2_reads_a_repeat(token)
    pol = yaml.safe_load(yaml.safe_dump(POLICY))
    rule: dict[str, Any] = {"name": "r", "severity": "failed"}
    if where == "condition":
        rule["condition"] = {"type": "GPUHealthy", "reason": f"^a{token}$"}
        field = "spec.rules[0].condition.reason"
    elif where == "slurm":
        rule["slurm"] = {"states": ["DRAIN"], "reason": f"^a{token}$"}
        field = "spec.rules[0].slurm.reason"
    else:
        rule["metric"] = {"promql": f'DCGM_FI_DEV_GPU_TEMP{{Hostname=~"a{token}"}}',
                          "threshold": 90}
        field = "spec.rules[0].metric.promql"
    pol["spec"]["rules"] = [rule]
    got = _load([pol])
    if verdict is True and not re.search(r"\d{4,}", token.replace("1000", "")):
        assert not isinstance(got, PolicyError), (token, [str(p) for p in got.problems])
    else:  # literal text, RE2's own error, or a count over 1000: refused, naming the field
        assert isinstance(got, PolicyError), (token, verdict)
        assert any(p.field == field for p in got.problems), [str(p) for p in got.problems]


# -- YAML tags ----------------------------------------------------------------------------------

TAGS = ["!!binary", "!!str", "!!int", "!!float", "!!bool", "!!null", "!!timestamp", "!",
        "!custom", "!!python/object:os.system", "!<tag:yaml.org,2002:str>", "!!set"]
#: (line, what is there, the same with {tag} on one scalar: a value or a key)
PLACES = [(1, "apiVersion: healer.io/v1alpha1", "apiVersion: {tag} healer.io/v1alpha1"),
          (1, "apiVersion: healer.io/v1alpha1", "{tag} apiVersion: healer.io/v1alpha1"),
          (2, "kind: RemediationPolicy", "kind: {tag} RemediationPolicy"),
          (3, "metadata: {name: p}", "metadata: {{name: {tag} p}}"),
          (6, "matchLabels: {gpu: 'true'}", "matchLabels: {{gpu: {tag} 'true'}}"),
          (8, "- name: r", "- name: {tag} r"),
          (9, "severity: failed", "severity: {tag} failed"),
          (10, "xid: {codes: [79]}", "xid: {{codes: [{tag} '79']}}")]
TEXT = ("apiVersion: healer.io/v1alpha1\nkind: RemediationPolicy\nmetadata: {name: p}\n"
        "spec:\n  nodeSelector:\n    matchLabels: {gpu: 'true'}\n  rules:\n"
        "    - name: r\n      severity: failed\n      xid: {codes: [79]}\n")


@FUZZ
@given(tag=st.sampled_from(TAGS), place=st.sampled_from(PLACES))
def test_a_tag_that_changes_a_value_is_refused_naming_the_tag(
        tag: str, place: tuple[int, str, str]) -> None:
    line, old, new = place
    lines = TEXT.splitlines()
    assert old in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(old, new.format(tag=tag))
    got = _load("\n".join(lines) + "\n")
    if tag in ("!!str", "!", "!<tag:yaml.org,2002:str>"):
        return  # a string stays a string: the field judges that string as it would any
    assert isinstance(got, PolicyError), (tag, place)
    if tag in ("!!set",):
        return  # a mapping tag on a scalar: refused, by the parser's own words
    assert any(p.line == line and "unsupported tag" in p.message for p in got.problems), \
        [str(p) for p in got.problems]


# -- load-time references -----------------------------------------------------------------------

_NAMEISH = st.text("abcXYZ09-._/: \n", min_size=0, max_size=20)


def _dns_label(s: str) -> bool:
    return 0 < len(s) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", s) is not None


def _dns_subdomain(s: str) -> bool:
    return 0 < len(s) <= 253 and all(_dns_label(x) for x in s.split("."))


@FUZZ
@given(ref=_NAMEISH, field=st.sampled_from(["jobTemplate", "secretRef"]))
def test_references_are_checked_at_load(ref: str, field: str) -> None:
    pol = yaml.safe_load(yaml.safe_dump(POLICY))
    if field == "jobTemplate":
        pol["spec"]["steps"] = {"repair": {"hook": "job", "jobTemplate": ref}}
        path = "spec.steps.repair.jobTemplate"
        ns, slash, name = ref.partition("/")
        valid = bool(slash) and _dns_label(ns) and _dns_subdomain(name)
    else:
        pol["spec"]["steps"] = {"repair": {"hook": "webhook", "url": "https://r.example/h",
                                           "secretRef": ref}}
        path = "spec.steps.repair.secretRef"
        head, colon, key = ref.partition(":")
        ns, slash, name = head.partition("/")
        valid = (bool(slash) and _dns_label(ns) and _dns_subdomain(name)
                 and (not colon or (re.fullmatch(r"[-._a-zA-Z0-9]{1,253}", key) is not None
                                    and key not in (".", "..")
                                    and not key.startswith(".."))))
    got = _load([pol])
    if valid:
        assert not isinstance(got, PolicyError), (ref, [str(p) for p in got.problems])
    else:
        assert isinstance(got, PolicyError), ref
        assert any(p.field == path for p in got.problems), [str(p) for p in got.problems]


images = st.one_of(
    st.text("abcAZ09-._/:@ \n", max_size=30),
    st.builds(lambda h, p, t: f"{h}{p}{t}",
              st.sampled_from(["", "registry.example.com/", "localhost:5000/", "[::1]:5/",
                               "Bad Host/"]),
              st.sampled_from(["dcgm", "nvidia/dcgm", "a__b/c-d", "A/b", "a//b", "-x"]),
              st.sampled_from(["", ":4.1", ":latest", ":-bad", "@sha256:" + "a" * 64,
                               "@sha256:short", ":t@sha256:" + "b" * 64])))


def _image_ok(ref: str) -> bool:
    """A second, simpler reading of an image reference: host part (optional; a first component
    is a host when it has '.', ':' or upper case, or is localhost, as container runtimes
    decide), lowercase path components, optional tag and digest."""
    m = re.fullmatch(r"(?:(?P<host>[^/]+)/)?(?P<path>[^:@]+)(?::(?P<tag>[^@]+))?"
                     r"(?:@(?P<digest>.+))?", ref)
    if m is None or any(c.isspace() for c in ref):
        return False
    host, path = m["host"], m["path"]
    if host is not None and not ("." in host or ":" in host or host == "localhost"
                                 or host.startswith("[") or host.lower() != host):
        path = f"{host}/{path}"  # no host after all: a path component
        host = None
    if host is not None and re.fullmatch(r"[A-Za-z0-9.-]+(:\d+)?|\[[0-9a-fA-F:]+\](:\d+)?",
                                         host) is None:
        return False
    comp = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    if not all(re.fullmatch(comp, c) for c in path.split("/")):
        return False
    if m["tag"] is not None and re.fullmatch(r"\w[\w.-]{0,127}", m["tag"]) is None:
        return False
    return m["digest"] is None or re.fullmatch(r"[a-z0-9]+:[0-9a-f]{32,}", m["digest"]) is not None


@FUZZ
@given(ref=images)
def test_a_validation_image_is_a_reference_or_refused_at_load(ref: str) -> None:
    pol = yaml.safe_load(yaml.safe_dump(POLICY))
    pol["spec"]["steps"] = {"validation": {"enabled": True, "image": ref,
                                           "command": ["dcgmi", "diag"]}}
    got = _load([pol])
    if _image_ok(ref) and ref:
        assert not isinstance(got, PolicyError), (ref, [str(p) for p in got.problems])
    else:
        assert isinstance(got, PolicyError), ref
        assert any(p.field == "spec.steps.validation.image" for p in got.problems)
