"""The README's support table ("What works where") claims nothing that no test proves.

The table has one row per (platform, capability): ``| Platform | What | Status | Proved by |``.
A status of ``yes``, ``read-only`` or ``partly`` is a claim, and its "Proved by" cell must cite
at least one test as `` `tests/<path>.py` `` or `` `tests/<path>.py::test_name` ``; every cited
file must exist (and be a test module) and every cited test must be defined in it. ``not
implemented`` and ``n/a`` claim nothing. Each platform the project talks about has a row, and a
platform healer has no code for (Soperator, SUNK: no module under ``healer/`` names it) says
``not implemented`` in every row and wherever the README's opening paragraph names it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
HEADING = "## What works where"
HEADER = ["Platform", "What", "Status", "Proved by"]
CLAIMS = ("yes", "read-only", "partly")
NO_CLAIM = ("not implemented", "n/a")
CITATION = re.compile(r"`(tests/[^`\s:]+)(?:::(\w+))?`")

#: Every platform the README must place in the table (a row's Platform cell starts with it).
PLATFORMS = ("Slinky slurm-operator v1.1", "Slinky slurm-operator v1.0", "Slurm via `scontrol`",
             "Slurm via slurmrestd", "Soperator", "SUNK")
#: Platforms with no code unless a module under healer/ names them (case-insensitive).
UNIMPLEMENTED = {"Soperator": "soperator", "SUNK": "sunk"}


@dataclass(frozen=True)
class Row:
    line: int
    platform: str
    what: str
    status: str
    proof: str

    @property
    def where(self) -> str:
        return f"README.md line {self.line} ({self.platform}: {self.what[:40]})"


def support_rows(markdown: str) -> list[Row]:
    """The rows of the table under ``## What works where`` (ValueError naming the line when
    the section, the header or a row is malformed)."""
    lines = markdown.splitlines()
    try:
        start = lines.index(HEADING)
    except ValueError:
        raise ValueError(f"README.md has no {HEADING!r} section") from None
    rows: list[Row] = []
    header_seen = False
    for i in range(start + 1, len(lines)):
        text = lines[i].strip()
        if text.startswith("## "):
            break
        if not text.startswith("|"):
            if header_seen and rows:
                break
            continue
        cells = [c.strip() for c in text.strip("|").split("|")]
        if not header_seen:
            if cells != HEADER:
                raise ValueError(f"README.md line {i + 1}: the table header must be {HEADER}, "
                                 f"not {cells}")
            header_seen = True
            continue
        if all(set(c) <= set("-: ") for c in cells):
            continue  # the separator row
        if len(cells) != len(HEADER):
            raise ValueError(f"README.md line {i + 1}: {len(cells)} cells, expected "
                             f"{len(HEADER)} ({' | '.join(HEADER)})")
        rows.append(Row(i + 1, *cells))
    if not rows:
        raise ValueError(f"README.md: no table rows under {HEADING!r}")
    return rows


def status_kind(status: str) -> str:
    """The status word(s) a cell starts with (``yes``, ``partly``, ``not implemented``...);
    ValueError when it starts with none of them."""
    low = status.lower()
    for kind in (*CLAIMS, *NO_CLAIM):
        if low == kind or re.match(rf"{re.escape(kind)}\b[\s:(]", low):
            return kind
    raise ValueError(f"status {status!r} is not one of {', '.join((*CLAIMS, *NO_CLAIM))}")


def _defines(path: Path, name: str) -> bool:
    return re.search(rf"^(async )?def {re.escape(name)}\(", path.read_text(), re.M) is not None


def row_problems(row: Row, root: Path) -> list[str]:
    """What is wrong with one row: an unknown status, a claim without a test, a citation of a
    file or test that does not exist."""
    try:
        kind = status_kind(row.status)
    except ValueError as e:
        return [f"{row.where}: {e}"]
    cited = CITATION.findall(row.proof)
    problems = []
    if kind in CLAIMS and not cited:
        problems.append(f"{row.where}: claims {row.status!r} but cites no test "
                        "(`tests/...py` or `tests/...py::test_name`)")
    for rel, test in cited:
        path = root / rel
        if not (rel.endswith(".py") and path.name.startswith("test_")):
            problems.append(f"{row.where}: cites {rel}, which is not a test module")
        elif not path.is_file():
            problems.append(f"{row.where}: cites {rel}, which does not exist")
        elif test and not _defines(path, test):
            problems.append(f"{row.where}: cites {rel}::{test}, which {rel} does not define")
    return problems


def opening(markdown: str) -> str:
    """The README's first paragraph (after the title): what healer says it runs on. The later
    paragraphs compare healer with other tools and may name them freely."""
    paragraphs = [p for p in markdown.split("\n\n") if p.strip()]
    body = [p for p in paragraphs if not p.lstrip().startswith("# ")]
    return body[0] if body else ""


def intro_problems(markdown: str, names: tuple[str, ...]) -> list[str]:
    """Sentences of the opening paragraph that name an unimplemented platform without saying
    it is not implemented."""
    intro = opening(markdown)
    sentences = re.split(r"(?<=[.!?])\s+", " ".join(intro.split()))
    return [f"README.md opening: {s!r} names {n} without saying 'not implemented'"
            for s in sentences for n in names
            if re.search(rf"\b{n}\b", s) and "not implemented" not in s]


def _has_code(keyword: str) -> bool:
    return any(keyword in p.relative_to(ROOT).as_posix().lower()
               for p in (ROOT / "healer").rglob("*.py"))


# -- the README --------------------------------------------------------------------------------


TEXT = README.read_text()
ROWS = support_rows(TEXT)


def test_every_claim_cites_tests_that_exist() -> None:
    problems = [p for row in ROWS for p in row_problems(row, ROOT)]
    assert not problems, "\n".join(problems)


def test_every_platform_has_a_row() -> None:
    missing = [p for p in PLATFORMS if not any(r.platform.startswith(p) for r in ROWS)]
    assert not missing, f"no row for {missing} under {HEADING!r}"


@pytest.mark.parametrize("platform", sorted(UNIMPLEMENTED))
def test_a_platform_without_code_says_not_implemented(platform: str) -> None:
    assert not _has_code(UNIMPLEMENTED[platform]), (
        f"healer/ now has {platform} code: update its rows in README.md and this test")
    rows = [r for r in ROWS if r.platform.startswith(platform)]
    assert rows
    assert all(status_kind(r.status) == "not implemented" for r in rows), rows
    assert not intro_problems(TEXT, (platform,)), intro_problems(TEXT, (platform,))


# -- the checks themselves, on tables that must fail -------------------------------------------


def _table(*rows: str) -> str:
    return "\n".join(["# x", "", HEADING, "", "intro", "",
                      "| Platform | What | Status | Proved by |", "|---|---|---|---|",
                      *rows, "", "## Next", "| not | a | row | here |"])


SCONTROL = "tests/integration/slurm/test_scontrol.py"


@pytest.mark.parametrize(("row", "expected"), [
    (f"| A | drain | yes | `{SCONTROL}` |", []),
    (f"| A | drain | yes | `{SCONTROL}::test_requeue_only_requeueable_jobs` |", []),
    (f"| A | drain | partly: reads | `{SCONTROL}`, `tests/unit/test_slurm_parse.py` |", []),
    ("| A | drain | not implemented | |", []),
    ("| A | drain | n/a (none) | |", []),
    ("| A | drain | yes | |", ["claims 'yes' but cites no test"]),
    ("| A | drain | read-only (22.05) | the slurm tests |", ["claims 'read-only (22.05)'"]),
    ("| A | drain | yes | `tests/integration/slurm/test_nope.py` |",
     ["cites tests/integration/slurm/test_nope.py, which does not exist"]),
    (f"| A | drain | yes | `{SCONTROL}::test_nope` |",
     [f"cites {SCONTROL}::test_nope, which {SCONTROL} does not define"]),
    ("| A | drain | yes | `tests/integration/waiting.py` |",
     ["cites tests/integration/waiting.py, which is not a test module"]),
    ("| A | drain | probably | |", ["status 'probably' is not one of"]),
    ("| A | drain | yesterday | |", ["status 'yesterday' is not one of"]),
])
def test_row_checks(row: str, expected: list[str]) -> None:
    [parsed] = support_rows(_table(row))
    assert parsed.line == 9
    problems = row_problems(parsed, ROOT)
    assert len(problems) == len(expected), problems
    for p, e in zip(problems, expected, strict=True):
        assert p.startswith("README.md line 9 (A: drain): "), p
        assert e in p, (p, e)


@pytest.mark.parametrize(("markdown", "error"), [
    ("# x\n\nno table\n", "no '## What works where' section"),
    (f"{HEADING}\n\n| Platform | Status |\n|---|---|\n", "line 3: the table header must be"),
    (f"{HEADING}\n\n| Platform | What | Status | Proved by |\n|---|---|---|---|\n| a | b |\n",
     "line 5: 2 cells, expected 4"),
    (f"{HEADING}\n\ntext only\n\n## Next\n", "no table rows"),
])
def test_malformed_tables_are_refused_with_the_line(markdown: str, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        support_rows(markdown)


@pytest.mark.parametrize(("intro", "flagged"), [
    ("healer runs on Slinky. Soperator and SUNK are not implemented.\n", 0),
    ("healer runs on Slinky; also Soperator, SUNK and bare Slurm.\n", 2),
    ("healer runs on SUNK.\nSoperator is not implemented.\n", 1),
    ("Nothing about them. SUNKEN ships.\n", 0),
])
def test_the_opening_must_not_imply_support(intro: str, flagged: int) -> None:
    markdown = f"# healer\n\n{intro}\nSoperator drains; SUNK too.\n\n## Next\nSUNK is great.\n"
    assert len(intro_problems(markdown, ("Soperator", "SUNK"))) == flagged
