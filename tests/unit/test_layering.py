"""healer.core stays pure (import-linter enforces it too; this is the quick check)."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "healer" / "core"
FORBIDDEN = {"asyncio", "aiohttp", "kubernetes_asyncio", "prometheus_api_client", "pynvml",
             "prometheus_client", "structlog", "pydantic", "yaml", "time", "socket",
             "subprocess", "requests", "os", "threading"}


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            out |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            out.add(n.module.split(".")[0])
    return out


def test_core_imports_nothing_that_does_io() -> None:
    for f in CORE.glob("*.py"):
        bad = _imports(f) & FORBIDDEN
        assert not bad, f"{f.name} imports {bad}"


def test_core_never_reads_the_clock() -> None:
    for f in CORE.glob("*.py"):
        text = f.read_text()
        for needle in ("datetime.now", ".utcnow(", "time.time(", "monotonic("):
            assert needle not in text, f"{f.name} reads the clock ({needle})"


def test_the_daemon_reads_wall_time_and_waits_only_through_its_clock() -> None:
    """``Clock`` (healer/ports.py) is healer's one notion of time; only its real
    implementation (adapters/clock.py) reads the wall clock, and a sleep elsewhere says on
    its line why it is real time rather than the daemon's (a start-up poll, the Lease)."""
    real = CORE.parent / "adapters" / "clock.py"
    for f in sorted(CORE.parent.rglob("*.py")):
        if f == real:
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for needle in ("time.time(", "datetime.now(", ".utcnow(", "time.sleep("):
                assert needle not in line, f"{f}:{n} reads the clock ({needle}): use Clock"
            if "asyncio.sleep(" in line:
                assert "#" in line, f"{f}:{n} sleeps outside the Clock without saying why"


def test_no_xid_list_is_hard_coded_in_python() -> None:
    from healer.policy.catalog import default_catalog

    codes = set(default_catalog().entries)
    for f in (CORE.parent).rglob("*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, (ast.List, ast.Set, ast.Tuple)):
                ints = [e.value for e in n.elts if isinstance(e, ast.Constant)
                        and isinstance(e.value, int) and not isinstance(e.value, bool)]
                if len(ints) >= 3 and set(ints) <= codes and len(ints) == len(n.elts):
                    raise AssertionError(f"{f}: line {n.lineno} looks like an XID list {ints}")
