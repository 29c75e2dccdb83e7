"""What ships is the daemon, the agent and the offline tools; the dev side (``healer_dev``) never.

Two proofs: ``healer run``'s imports (its parser and the composition root, in a fresh
interpreter) hold no simulator, no local stack, no NVML, no agent and no backtest; and the wheel
``pip install .`` would install holds only ``healer/`` (no ``healer_dev``, no ``tests``, no
devstack, no C source). The import-linter contract "Shipped code never imports the dev side"
(pyproject.toml) keeps it so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: modules (and their submodules) ``healer run`` must not import
NOT_IN_RUN = ("healer_dev", "tests", "healer.sim", "pynvml", "healer.agent", "healer.backtest",
              "prometheus_api_client")

RUN_IMPORTS = """
import json, sys
from healer.cli import build_parser
args = build_parser().parse_args(["run", "--no-leader-election", "--policies", "policies"])
assert args.fn.__name__ == "_cmd_run", args.fn
import healer.app  # what args.fn imports before it runs
print(json.dumps(sorted(sys.modules)))
"""


def test_healer_run_imports_no_dev_code_no_simulator_no_nvml_no_agent_no_backtest() -> None:
    proc = subprocess.run([sys.executable, "-c", RUN_IMPORTS], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    modules = json.loads(proc.stdout)
    assert "healer.app" in modules
    found = [m for m in modules
             if any(m == bad or m.startswith(bad + ".") for bad in NOT_IN_RUN)]
    assert found == [], f"healer run imports {found}"
    print(f"healer run imports {len(modules)} modules, "
          f"{sum(m.startswith('healer.') for m in modules)} of them healer's; "
          f"none of {', '.join(NOT_IN_RUN)}")


def test_the_agent_and_backtest_flags_load_when_their_command_is_parsed() -> None:
    import argparse

    from healer.cli import build_parser

    args = build_parser().parse_args(["agent", "--interval", "5"])
    assert args.interval == 5.0
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "--prometheus" in subs.choices["backtest"].format_help()


def _wheel_files(tmp_path: Path) -> list[str]:
    """Build the wheel from a copy of this checkout (the copy keeps build/ and *.egg-info out
    of the working tree) and list the files in it."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".mypy_cache", "build")
    for d in ("healer", "healer_dev", "tests"):
        shutil.copytree(ROOT / d, src / d, ignore=ignore)
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / f, src / f)
    out = tmp_path / "wheel"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                           str(src), "-w", str(out)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    (wheel,) = out.glob("healer-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return sorted(z.namelist())


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_the_wheel_holds_only_the_shipped_package(tmp_path: Path) -> None:
    files = _wheel_files(tmp_path)
    print(f"{len(files)} files in the wheel:")
    print("\n".join(f"  {f}" for f in files))
    code = [f for f in files if ".dist-info/" not in f]
    assert code, files
    assert all(f.startswith("healer/") for f in code), \
        [f for f in code if not f.startswith("healer/")]
    assert not [f for f in files if f.startswith(("healer_dev", "tests/"))]
    assert not [f for f in files if "devstack" in f or f.endswith(".c")]
    for shipped in ("healer/cli.py", "healer/app.py", "healer/agent/main.py",
                    "healer/sim/engine.py", "healer/sim/scenario.py", "healer/sim/world.py",
                    "healer/data/xid-catalog.yaml", "healer/py.typed"):
        assert shipped in files, shipped
