"""Fuzz: hostile policy files never crash, hang or write.

A hand-written corpus of the hostile inputs issue 12 names (every file of
``tests/unit/policy_corpus``, recursive aliases, alias bombs, 5,000-deep nesting, binary and
NUL bytes, huge numbers and strings, FIFOs and devices, every out-of-range value the validator
used to accept) plus hypothesis (random bytes; random YAML-ish text; random values planted
into a valid policy at random places) go through :func:`load_policy_set`, the function the
daemon's reload child and ``healer validate`` call. The outcome is a policy set or a
:class:`PolicyError` whose every problem names the file (and, for anything inside it, a line);
nothing else. Each load runs under an internal budget (a worker thread waited on for
``BUDGET`` seconds, so a hang fails with the example instead of the suite's timeout), and an
audit hook records every write the process attempts while a load runs: there must be none.
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healer.core.rules import PolicySet
from healer.errors import PolicyError
from healer.policy.load import load_policy_set

ROOT = Path(__file__).resolve().parents[3]
CORPUS = sorted((ROOT / "tests" / "unit" / "policy_corpus").glob("*.yaml"))
BUDGET = 20.0  # seconds one load may take before it counts as a hang
FUZZ = settings(max_examples=500, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------
# No writes: an audit hook, armed only while a load runs

_WRITE_EVENTS = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.truncate", "os.chmod",
                 "os.chown", "os.symlink", "os.link", "os.utime", "shutil.rmtree",
                 "shutil.move", "socket.connect", "socket.bind", "subprocess.Popen",
                 "os.system", "os.exec", "os.posix_spawn", "os.fork"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_armed: list[bool] = [False]
_writes: list[tuple[str, tuple[Any, ...]]] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _armed[0]:
        return
    if event in _WRITE_EVENTS:
        _writes.append((event, args))
    elif event == "open" and len(args) >= 3:
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS):
            _writes.append((event, args))


sys.addaudithook(_audit)  # audit hooks cannot be removed; this one is inert unless armed

_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="fuzz-load")


def load(paths: list[Path]) -> PolicySet | PolicyError:
    """Load ``paths`` under the budget with writes recorded; return the set or the error."""

    def run() -> PolicySet | PolicyError:
        _armed[0] = True
        try:
            return load_policy_set(paths)
        except PolicyError as e:
            return e
        finally:
            _armed[0] = False

    _writes.clear()
    outcome = _pool.submit(run).result(timeout=BUDGET)
    assert _writes == [], f"the loader wrote: {_writes[:3]}"
    return outcome


def check(path: Path) -> PolicySet | PolicyError:
    """The contract for one file: a policy set, or problems that each name the file; every
    problem inside the file has a line; none is the loader's internal-error fallback."""
    outcome = load([path])
    if isinstance(outcome, PolicyError):
        assert outcome.problems
        assert len(outcome.problems) <= 60, "problems are capped per file"
        for p in outcome.problems:
            assert p.file == str(path), str(p)
            assert "internal error" not in p.message, str(p)
            assert len(str(p)) < 1200, f"an unbounded message: {str(p)[:200]}"
            if p.field:
                assert p.line > 0, str(p)
    return outcome


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fuzz-policies-") as d:
        yield Path(d)


def _write(workdir: Path, data: bytes, name: str = "p.yaml") -> Path:
    f = workdir / name
    f.write_bytes(data)
    return f


# ---------------------------------------------------------------------------------------------
# The hand corpus


def _laughs(levels: int, width: int) -> str:
    text = "a0: &a0 [" + ",".join(['"lol"'] * width) + "]\n"
    for i in range(1, levels):
        text += f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]\n"
    return text


_VALID = (ROOT / "policies" / "default.yaml").read_text()
HOSTILE: dict[str, bytes] = {
    "recursive-alias": b"a: &a [*a]\n",
    "recursive-alias-in-mapping": b"a: &a {b: *a}\n",
    "recursive-alias-deeper": b"a: &a [[[[{x: [*a]}]]]]\n",
    "recursive-merge": b"a: &a {<<: *a}\n",
    "alias-before-anchor": b"a: *b\nb: &b 1\n",
    "billion-laughs": _laughs(9, 9).encode(),
    "wide-laughs": _laughs(3, 1000).encode(),
    "laughs-in-keys": b"a: &a [1,2,3,4,5,6,7,8,9,10]\n" + b"".join(
        f"b{i}: &b{i} [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\n".encode() for i in range(600)),
    "deep-flow-5000": b"[" * 5000 + b"]" * 5000,
    "deep-flow-unclosed": b"[" * 100_000,
    "deep-map-5000": b"{a: " * 5000 + b"}" * 5000,
    "deep-block": b"a:\n" + b"".join(b"  " * i + b"b:\n" for i in range(1, 500)),
    "binary": bytes(range(256)) * 16,
    "nul": b"apiVersion: healer.io/v1alpha1\x00\n",
    "control-chars": b"a: \x1b[31m\x07\n",
    "utf16": "a: b\n".encode("utf-16"),
    "bom-then-policy": b"\xef\xbb\xbf" + _VALID.encode(),
    "huge-int": b"spec: " + b"9" * 100_000 + b"\n",
    "huge-float": b"spec: 1e" + b"9" * 5000 + b"\n",
    "huge-string": b"spec: '" + b"x" * 500_000 + b"'\n",
    "many-documents": b"---\na: 1\n" * 5000,
    "many-empty-documents": b"---\n" * 100_000,
    "flat-list": b"[" + b"1," * 400_000 + b"1]",
    "long-key": b"? " + b"k" * 60_000 + b"\n: 1\n",
    "python-tag": b"!!python/object/apply:os.system ['true']\n",
    "python-name": b"a: !!python/name:os.system\n",
    "set-tag": b"a: !!set {x, y}\n",
    "custom-tag": b"a: !custom {x: 1}\n",
    "binary-tag": b"apiVersion: !!binary aGVhbGVy\n",
    "timestamp-bad": b"a: 2024-99-99\n",
    "key-is-list": b"[a, b]: 1\n",
    "key-is-alias-of-map": b"x: &x {a: 1}\n*x : 2\n",
    "duplicate-keys": b"a: 1\na: 2\n",
    "empty": b"",
    "only-comment": b"# nothing\n",
    "scalar-root": b"just a string\n",
    "null-root": b"~\n",
    "tab-indent": b"a:\n\tb: 1\n",
    "unterminated-quote": b"a: 'oops\n",
    "1-MiB-plus-one": b"#" * (1024 * 1024 + 1),
    "policy-with-everything-absurd": _VALID.replace("maxConcurrent: 2", "maxConcurrent: 1e999")
                                           .replace("USR1", "\"USR1\\r\\n\"").encode(),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hand_corpus_of_hostile_bytes(workdir: Path, name: str) -> None:
    outcome = check(_write(workdir, HOSTILE[name], f"{name}.yaml"))
    if name != "bom-then-policy":
        assert isinstance(outcome, PolicyError), name


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_hand_corpus_of_broken_policies(path: Path) -> None:
    assert isinstance(check(path), PolicyError)


def test_special_files(workdir: Path) -> None:
    fifo = workdir / "fifo.yaml"
    os.mkfifo(fifo)
    for special in (fifo, Path("/dev/zero"), Path("/dev/null"), Path("/dev/urandom"),
                    workdir / "missing.yaml", workdir / "nul\x00byte.yaml"):
        assert isinstance(check(special), PolicyError), special
    folder = workdir / "folder-with-a-fifo"
    folder.mkdir()
    os.mkfifo(folder / "p.yaml")
    outcome = load([folder])
    assert isinstance(outcome, PolicyError)
    assert [str(p) for p in outcome.problems] == [
        f"{folder / 'p.yaml'}: expected a regular file, got a FIFO"]
    link = workdir / "loop.yaml"
    link.symlink_to(link)
    assert isinstance(check(link), PolicyError)


# ---------------------------------------------------------------------------------------------
# Hypothesis


@FUZZ
@given(data=st.binary(max_size=4096))
def test_random_bytes(workdir: Path, data: bytes) -> None:
    check(_write(workdir, data))


_TOKENS = [*"[]{}:,-?&*!|>'\"#%@`\n\t .0123456789eE+abcxyz<=~\\/", "\n  ", "\n    ",
           "<<: ", "&a ", "*a", "&b ", "*b", "!!str ", "!!int ", "!!binary ", "---\n", "...\n",
           ".nan", ".inf", "true", "null", "\x00", "\u2028", "\ufeff", "é", "apiVersion: ",
           "healer.io/v1alpha1", "kind: ", "RemediationPolicy", "spec: ", "rules: "]
_YAMLISH = st.lists(st.sampled_from(_TOKENS), max_size=120).map("".join)


@FUZZ
@given(text=_YAMLISH)
def test_random_yamlish_text(workdir: Path, text: str) -> None:
    check(_write(workdir, text.encode("utf-8", "surrogatepass")))


_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from(["30s", "1ms", "9" * 400 + "s", "367d", "https://", "http://h:99999/",
                     "https://a\r\nb", "USR1", "SIGKILL", "FOO", "(a+)+$", "a{4294967296}",
                     "(a)\\1", "rate(x[5m]", "a,b", "x=y", "!x", "", "10%", "101%", "-1"]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=20)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


_BASE_DOCS = [d for d in yaml.safe_load_all(_VALID) if d]


@FUZZ
@given(doc=st.sampled_from(range(len(_BASE_DOCS))), where=st.integers(min_value=0),
       value=_VALUES, extra_key=st.booleans())
def test_random_values_planted_in_a_valid_policy(workdir: Path, doc: int, where: int,
                                                  value: Any, extra_key: bool) -> None:
    data = yaml.safe_load(yaml.safe_dump(_BASE_DOCS[doc]))  # a deep copy
    paths = _paths(data)
    path = paths[where % len(paths)]
    if not path:
        data = value
    else:
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        if extra_key and isinstance(parent, dict):
            parent[f"x{where % 7}"] = value
        else:
            parent[path[-1]] = value
    check(_write(workdir, yaml.safe_dump(data, allow_unicode=True).encode("utf-8",
                                                                          "surrogatepass")))


def test_the_write_detector_sees_a_write(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The no-write assertion is not vacuous: a loader that wrote would fail it."""
    import healer.policy.load as loader

    real = loader.load_policy_set

    def writing(paths: Any) -> Any:
        (workdir / "side-effect").write_text("x")
        return real(paths)

    monkeypatch.setattr(sys.modules[__name__], "load_policy_set", writing)
    with pytest.raises(AssertionError, match="the loader wrote"):
        load([ROOT / "policies" / "default.yaml"])
