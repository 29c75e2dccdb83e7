"""`python -m healer_dev bench --smoke` runs every group end to end on this machine and prints
every figure.

Only that: it exits 0, prints a row for each figure (and writes them to --json), and leaves no
process behind. The timings themselves are never asserted: they are reported (docs/bench.md).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.processes import run_in_group

REPO = Path(__file__).resolve().parents[2]

#: (group, the start of the figure's name) of every figure the smoke prints
ROWS = [
    ("telemetry", "CPU per poll, 100 nodes"),
    ("telemetry", "CPU per poll, 200 nodes"),
    ("telemetry", "of which garbage collection, 200 nodes"),
    ("telemetry", "CPU of the first poll"),
    ("telemetry", "steady RSS"),
    ("telemetry", "RSS growth"),
    ("telemetry", "CPU/poll, median last"),
    ("telemetry", "floor: reference loop"),
    ("telemetry", "CPU per poll, 100 nodes x 8 GPUs / reference loop"),
    ("telemetry", "CPU per poll, 200 nodes x 8 GPUs / reference loop"),
    ("engine", "decisions/s, 1,000 nodes"),
    ("engine", "decisions/s with the simulated world, 1,000 nodes"),
    ("engine", "decisions/s, 2,000 nodes"),
    ("engine", "decisions/s with the simulated world, 2,000 nodes"),
    ("engine", "decisions/s, 1,000 nodes, 100 XID 79 -> Done / reference loop speed"),
    ("engine", "decisions/s with the simulated world, 1,000 nodes / reference loop speed"),
    ("engine", "decisions/s, 2,000 nodes, 200 XID 79 -> Done / reference loop speed"),
    ("engine", "decisions/s with the simulated world, 2,000 nodes / reference loop speed"),
    ("stack", "floor: one API write round trip"),
    ("stack", "floor: reference loop"),
    ("stack", "API server's own write load"),
    ("stack", "bench: sending the 20 condition patches"),
    ("stack", "first fault after the daemon started"),
    ("stack", "condition -> NodeRemediation p50"),
    ("stack", "condition -> NodeRemediation p99"),
    ("stack", "condition -> cordoned p50"),
    ("stack", "condition -> cordoned p99"),
    ("stack", "burst of 20: all cordoned"),
    ("stack", "burst of 20: p99 per node"),
    ("stack", "daemon idle CPU, 20 open"),
    ("stack", "daemon RSS"),
    ("stack", "20 healed -> all remediations closed"),
    ("stack", "condition -> cordoned p99, 50 nodes / write round trip"),
    ("stack", "burst of 20: all cordoned + drain requested / write round trip"),
    ("stack", "burst of 20: p99 per node, cordoned + drain requested / write round trip"),
    ("stack", "daemon idle CPU, 20 open / reference loop"),
    ("stack", "API writes per remediation (burst, to held), all"),
    ("stack", "API reads per remediation (burst, to held), all"),
    ("promql", "XID scraped -> NodeRemediation p50"),
    *[("shards", f"{what}, {who}") for who in ("one leader", "4 shards", "16 shards")
      for what in ("most in flight at once", "most nodes out at once", "faults replaced",
                   "fault -> spare serving p50", "fault -> spare serving p99")],
]


def _bench_processes() -> list[str]:
    """Command lines of live processes that belong to a bench run (its temp dirs, its daemon,
    its telemetry worker)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "healer-bench-" in cmd or "healer_dev.bench." in cmd:
            out.append(f"{d.name}: {cmd[:200]}")
    return out


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_bench_smoke_prints_every_figure(tmp_path: Path) -> None:
    before = set(_bench_processes())
    out_json = tmp_path / "bench.json"
    # its own process group: on a timeout the bench's stack goes with it, not only the bench
    proc = run_in_group(
        [sys.executable, "-m", "healer_dev", "bench", "--smoke", "--json", str(out_json)],
        cwd=REPO, timeout=400, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("group "))
    rows = lines[start + 1:]
    for group, name in ROWS:
        assert any(r.split()[0] == group and f" {name}" in r for r in rows), \
            f"no row for {group} / {name}:\n{proc.stdout[-4000:]}"
    doc = json.loads(out_json.read_text())
    # besides ROWS, only the per-step split of the writes (its steps are what the daemon did)
    extra = [f["name"] for f in doc["figures"]
             if not any(f["group"] == g and f["name"].startswith(n) for g, n in ROWS)]
    assert all(n.startswith("API writes per remediation: ") for n in extra), extra
    assert len(doc["figures"]) - len(extra) == len(ROWS)
    assert all(f["values"] for f in doc["figures"]), doc["figures"]
    left = [p for p in _bench_processes() if p not in before]
    assert not left, f"the bench left processes behind: {left}"
