"""No import circles: every import between the files of the given packages, read with ``ast``
(module level, under ``if TYPE_CHECKING:`` and inside functions alike), and every circle among
them named with the files and the names that tie them. ``make lint`` runs it over ``healer``
and ``healer_dev``: ``python -m healer_dev.circles healer healer_dev`` exits 1 on a circle.

import-linter's contracts see these imports too, but none of them forbids a loop between two
modules of one package, and its sibling check counts packages, not files, and names no names.

A file is a module (a package is its ``__init__.py``). ``from a.b import c`` ties the file to
``a/b/c.py`` when that is a module, else to ``a/b``'s ``__init__.py`` (the name ``c``);
``import a.b`` to ``a/b``. A parent package's ``__init__.py``, which Python runs first, is not
counted: a package's face that hands its modules' names on would otherwise close a loop with
each of them. Imports of modules outside the given packages are ignored.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Circles allowed for now, each the set of its files (relative to the root), with why; empty
#: since the local Slurm's was cut. A circle is allowed only as it is: one more file, or one
#: fewer, is an error, and so is an entry whose circle is gone (delete it).
ALLOWED: dict[frozenset[str], str] = {}


@dataclass(frozen=True, slots=True)
class Tie:
    """One import statement from one file of a circle to another."""

    line: int
    names: tuple[str, ...]
    where: str  # "", "type-checking only" or "in a function"

    def describe(self) -> str:
        where = f", {self.where}" if self.where else ""
        return f"{', '.join(self.names)} (line {self.line}{where})"


@dataclass(slots=True)
class Graph:
    """Files (as module names) and the imports between them."""

    files: dict[str, Path] = field(default_factory=dict)  # module → its file
    edges: dict[str, dict[str, list[Tie]]] = field(default_factory=dict)  # from → to → ties


def modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Module name → file, for every ``.py`` under each package directory of ``root``."""
    out: dict[str, Path] = {}
    for pkg in packages:
        base = root / pkg.replace(".", "/")
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of a module, with where it sits."""

    def walk(nodes: Iterable[ast.AST], where: str) -> Iterator[
            tuple[ast.Import | ast.ImportFrom, str]]:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node, where
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(ast.iter_child_nodes(node), where or "in a function")
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from walk(node.body, where or "type-checking only")
                yield from walk(node.orelse, where)
            else:
                yield from walk(ast.iter_child_nodes(node), where)

    yield from walk(tree.body, "")


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def build(root: Path, packages: Iterable[str]) -> Graph:
    """The import graph of the files of ``packages`` under ``root``."""
    g = Graph(modules(root, packages))
    for module, path in g.files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        for node, where in _imports(tree):
            targets: dict[str, list[str]] = {}
            if isinstance(node, ast.Import):
                for alias in node.names:
                    name = _known(g.files, alias.name)
                    if name is not None:
                        targets.setdefault(name, []).append(alias.name)
            else:
                source = _absolute(node, module, is_package)
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    name = sub if sub in g.files else _known(g.files, source)
                    if name is not None:
                        targets.setdefault(name, []).append(alias.name)
            for target, names in targets.items():
                if target != module:
                    g.edges.setdefault(module, {}).setdefault(target, []).append(
                        Tie(node.lineno, tuple(names), where))
    return g


def _known(files: Mapping[str, Path], dotted: str) -> str | None:
    """The module ``dotted`` names, or the deepest package of it that is one of ``files``."""
    parts = dotted.split(".")
    while parts:
        name = ".".join(parts)
        if name in files:
            return name
        parts.pop()
    return None


def circles(g: Graph) -> list[list[str]]:
    """The strongly connected components of more than one file, each sorted, in order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(g.files) + 100))
    try:
        for v in sorted(g.files):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(out)


def describe(g: Graph, root: Path, circle: Sequence[str]) -> list[str]:
    """A circle in words: its files, then each import that ties one to another."""
    def rel(m: str) -> str:
        return g.files[m].relative_to(root).as_posix()

    members = set(circle)
    lines = [f"import circle of {len(circle)} files: {', '.join(rel(m) for m in circle)}"]
    for a in circle:
        for b, ties in sorted(g.edges.get(a, {}).items()):
            if b in members:
                lines.append(f"  {rel(a)} -> {rel(b)}: "
                             + "; ".join(t.describe() for t in ties))
    return lines


def check(root: Path, packages: Sequence[str],
          allowed: Mapping[frozenset[str], str] = ALLOWED) -> list[str]:
    """Every problem, in words ([] when there is none): each circle that is not allowed as it
    is, and each allowed circle that is gone."""
    g = build(root, packages)
    problems: list[str] = []
    seen: set[frozenset[str]] = set()
    for circle in circles(g):
        files = frozenset(g.files[m].relative_to(root).as_posix() for m in circle)
        if files in allowed:
            seen.add(files)
            continue
        problems.extend(describe(g, root, circle))
    dirs = tuple(pkg.replace(".", "/") + "/" for pkg in packages)
    for files, why in allowed.items():
        if files not in seen and any(f.startswith(dirs) for f in files):
            problems.append(f"allowed import circle {', '.join(sorted(files))} ({why}) is "
                            "gone: delete its entry in healer_dev/circles.py ALLOWED")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m healer_dev.circles",
                                description="fail on any import circle among the files of "
                                            "the given packages, naming what ties it")
    p.add_argument("packages", nargs="+", help="packages to read (directories under --root)")
    p.add_argument("--root", type=Path, default=Path("."), help="the repository root")
    args = p.parse_args(argv)
    problems = check(args.root.resolve(), args.packages)
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print("import circles: break each along a seam (see CONTRIBUTING.md)", file=sys.stderr)
        return 1
    print(f"no import circles in {', '.join(args.packages)}"
          f"{f' ({len(ALLOWED)} allowed for now)' if ALLOWED else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
