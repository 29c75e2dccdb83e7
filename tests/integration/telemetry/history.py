"""Scripted telemetry HISTORY for a real Prometheus: the DCGM simulator rendered over a time
range, written as OpenMetrics and backfilled with ``promtool tsdb create-blocks-from
openmetrics`` into the TSDB of a :class:`LocalPrometheus` that is started afterwards.

The simulator is a pure function of its faults and the time, so rendering ``node`` at every
sample time gives exactly what a Prometheus scraping it at that cadence would have stored:
the same metric names and labels (plus ``instance`` and ``job``, which Prometheus adds), and an
``up`` series per exporter that is 0 while the exporter is down (no DCGM sample then). The
render is cached while a node's faults cannot change it (between fault boundaries, with no
counter growing), which keeps a week of minutes cheap.

Every family is typed ``gauge`` in the file: OpenMetrics wants counters to be named
``*_total`` samples of a family without the suffix, and PromQL does not care about the type.

``promtool`` cuts blocks at multiples of the block duration since the epoch and
``LocalPrometheus`` keeps a 1-day retention relative to the newest block, so the history must
fit one block: :data:`BLOCK` (486 h, the largest compatible duration not above
``--max-block-duration``) and a start on a multiple of it (:func:`aligned_start`).
"""

from __future__ import annotations

import bisect
import shutil
import subprocess
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from healer_dev.devstack.prometheus import LocalPrometheus
from healer_dev.sim.dcgm import METRICS, DcgmSim, FaultKind

#: promtool's block duration for ``--max-block-duration=500h`` (2h * 3^5).
BLOCK = 486 * 3600
EXPORTER_PORT = 9400


def aligned_start(not_before: float) -> int:
    """The first block boundary at or after ``not_before`` (seconds since the epoch)."""
    return -(-int(not_before) // BLOCK) * BLOCK


@dataclass(frozen=True)
class HistoryFile:
    path: Path
    start: int
    end: int
    every: int
    samples: int
    series: int
    renders: int
    seconds: float  # wall time spent writing it


def _change_points(sim: DcgmSim, node: str) -> list[float]:
    """Times at which ``node``'s render can change other than by a growing counter."""
    window = sim.nodes[node].xid_window
    points: set[float] = set()
    for f in sim.faults:
        if f.node != node:
            continue
        points.add(f.start)
        if f.stop is not None:
            points.add(f.stop)
        if f.kind is FaultKind.XID:
            for x in f.xid_times():
                points.update((x, x + window))
    return sorted(points)


def _growing(sim: DcgmSim, node: str, t: float) -> bool:
    """A counter of ``node`` grows at ``t`` (conservative: any active fault with a rate)."""
    return any(f.node == node and f.rate > 0 and f.active(t) for f in sim.faults)


def _parse(text: str, extra: str, families: Collection[str] | None
           ) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        lb = line.index("{")
        name = line[:lb]
        if families is not None and name not in families:
            continue
        rb = line.rindex("}")
        out.append((name, line[lb + 1:rb] + extra, line[rb + 2:]))
    return out


def write_history(sim: DcgmSim, path: Path, start: int, end: int, every: int = 60, *,
                  families: Collection[str] | None = None, job: str = "dcgm") -> HistoryFile:
    """Render every node of ``sim`` at ``start, start+every, ... <= end`` into ``path``.

    ``families`` limits the DCGM families written (None: all of them); ``up`` is always written.
    """
    began = time.monotonic()
    series: dict[str, dict[str, list[str]]] = {}
    renders = 0
    for node in sorted(sim.nodes):
        instance = f"{node}:{EXPORTER_PORT}"
        extra = f',instance="{instance}",job="{job}"'
        up = series.setdefault("up", {}).setdefault(f'instance="{instance}",job="{job}"', [])
        points = _change_points(sim, node)
        cached_key: int | None = None
        cached: list[tuple[str, str, str]] = []
        for t in range(start, end + 1, every):
            if sim.exporter_state(node, t) != "up":
                up.append(f"0 {t}")
                continue
            up.append(f"1 {t}")
            key = -1 if _growing(sim, node, t) else bisect.bisect_right(points, t)
            if key == -1 or key != cached_key:
                cached = _parse(sim.render(node, t), extra, families)
                cached_key = key
                renders += 1
            for name, labels, value in cached:
                series.setdefault(name, {}).setdefault(labels, []).append(f"{value} {t}")
    samples = 0
    types = {name: help_text for name, _, help_text in METRICS}
    types["up"] = "Whether the exporter was scraped successfully."
    with path.open("w", encoding="utf-8") as f:
        for name in [*(n for n, _, _ in METRICS if n in series), "up"]:
            f.write(f"# HELP {name} {types[name]}\n# TYPE {name} gauge\n")
            for labels in sorted(series[name]):
                prefix = f"{name}{{{labels}}} "
                values = series[name][labels]
                samples += len(values)
                f.write("".join(f"{prefix}{v}\n" for v in values))
        f.write("# EOF\n")
    n_series = sum(len(v) for v in series.values())
    return HistoryFile(path, start, end, every, samples, n_series, renders,
                       time.monotonic() - began)


def backfill(history: HistoryFile, data_dir: Path) -> str:
    """``promtool tsdb create-blocks-from openmetrics`` into ``data_dir``; its output.

    Raises RuntimeError with promtool's output when it fails.
    """
    promtool = shutil.which("promtool")
    if promtool is None:
        raise RuntimeError("promtool is not on PATH (Debian: apt-get install prometheus)")
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet",
         f"--max-block-duration={BLOCK // 3600 + 14}h", str(history.path), str(data_dir)],
        capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"promtool failed with status {proc.returncode}:\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    blocks = [p for p in data_dir.iterdir() if (p / "meta.json").is_file()]
    if len(blocks) != 1:
        raise RuntimeError(f"expected one TSDB block, promtool wrote {len(blocks)}: the "
                           "history must fit one block (see aligned_start)")
    return proc.stdout + proc.stderr


def history_prometheus(workdir: Path, history: HistoryFile) -> LocalPrometheus:
    """A LocalPrometheus (not started) whose TSDB holds ``history`` and that scrapes nothing."""
    prom = LocalPrometheus(workdir, [], f"{history.every}s")
    backfill(history, prom.data_dir)
    return prom
