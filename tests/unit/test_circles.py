"""No import circles (``healer_dev/circles.py``, run by ``make lint``): a circle planted in a
tiny package is found whichever way it is closed (at module level, under ``TYPE_CHECKING``, in
a function, relatively, through a package's ``__init__``) and named with its files and the
names that tie them; healer and healer_dev have none but the allowed ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from healer_dev.circles import ALLOWED, check, main

ROOT = Path(__file__).resolve().parents[2]


def plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


CLEAN = {
    "pkg/__init__.py": "",
    "pkg/base.py": "X = 1\n",
    "pkg/top.py": "from pkg.base import X\nimport pkg.base\n",
    "pkg/sub/__init__.py": "from pkg.sub.leaf import Y as Y\n",
    "pkg/sub/leaf.py": "from ..base import X\nY = X\n",
    "pkg/other.py": "import os\nfrom collections import abc\nfrom pkg import base\n",
}


def test_a_package_without_a_circle_passes(tmp_path: Path) -> None:
    plant(tmp_path, CLEAN)
    assert check(tmp_path, ["pkg"], {}) == []


@pytest.mark.parametrize(("closing", "where"), [
    ("from pkg.top import Z\n", "line 1)"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.top import Z\n",
     "line 3, type-checking only)"),
    ("import typing\nif typing.TYPE_CHECKING:\n    from . import top\n",
     "line 3, type-checking only)"),
    ("def f():\n    from pkg.top import Z\n    return Z\n", "line 2, in a function)"),
    ("class C:\n    async def g(self):\n        import pkg.top\n", "line 3, in a function)"),
])
def test_a_planted_circle_is_named_with_its_files_and_names(tmp_path: Path, closing: str,
                                                             where: str) -> None:
    plant(tmp_path, {**CLEAN, "pkg/base.py": closing + "X = 1\n",
                     "pkg/top.py": "from pkg.base import X\nZ = X\n"})
    problems = check(tmp_path, ["pkg"], {})
    assert problems[0] == "import circle of 2 files: pkg/base.py, pkg/top.py"
    assert problems[1].startswith("  pkg/base.py -> pkg/top.py: ")
    assert problems[1].endswith(where)
    assert problems[2] == "  pkg/top.py -> pkg/base.py: X (line 1)"
    assert len(problems) == 3


def test_a_circle_through_a_package_face_and_three_files(tmp_path: Path) -> None:
    plant(tmp_path, {**CLEAN,
                     "pkg/sub/leaf.py": "from pkg.top import T\nY = 1\n",
                     "pkg/top.py": "from pkg.sub import Y\nT = 2\n"})
    problems = check(tmp_path, ["pkg"], {})
    assert problems[0] == ("import circle of 3 files: pkg/sub/__init__.py, pkg/sub/leaf.py, "
                           "pkg/top.py")
    assert "  pkg/top.py -> pkg/sub/__init__.py: Y (line 1)" in problems


def test_an_allowed_circle_passes_only_as_it_is(tmp_path: Path) -> None:
    two = {**CLEAN, "pkg/base.py": "from pkg.top import Z\nX = 1\n",
           "pkg/top.py": "from pkg.base import X\nZ = X\n"}
    plant(tmp_path, two)
    allowed = {frozenset({"pkg/base.py", "pkg/top.py"}): "being split"}
    assert check(tmp_path, ["pkg"], allowed) == []
    plant(tmp_path, {"pkg/base.py": "from pkg.other import O\nX = 1\n",
                     "pkg/other.py": "from pkg.top import Z\nO = Z\n"})
    assert check(tmp_path, ["pkg"], allowed)[0].startswith("import circle of 3 files")
    plant(tmp_path, CLEAN)  # the circle is gone: so must its entry be
    assert check(tmp_path, ["pkg"], allowed) == [
        "allowed import circle pkg/base.py, pkg/top.py (being split) is gone: delete its "
        "entry in healer_dev/circles.py ALLOWED"]


def test_the_command_exits_1_on_a_circle(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    plant(tmp_path, {**CLEAN, "pkg/base.py": "from pkg.top import Z\nX = 1\n"})
    assert main(["--root", str(tmp_path), "pkg"]) == 1
    assert "pkg/base.py -> pkg/top.py: Z (line 1)" in capsys.readouterr().err
    plant(tmp_path, CLEAN)
    assert main(["--root", str(tmp_path), "pkg"]) == 0


def test_healer_and_healer_dev_have_no_circle() -> None:
    assert check(ROOT, ["healer", "healer_dev"]) == []
    assert ALLOWED == {}  # none is allowed: a circle is cut, not listed
