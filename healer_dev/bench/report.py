"""Figures, their targets and the table ``make bench`` prints (and the ``--json`` file).

A :class:`Figure` is one measured quantity with one value per repeat; a target is either an
upper bound (``<=``: times, memory, CPU) or a lower bound (``>=``: rates). "met"/"missed"
compares the median with the target. Nothing here fails on a missed target: the bench reports.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Figure:
    group: str
    name: str
    unit: str
    target: float | None = None
    bound: str = "<="  # "<=": at most the target; ">=": at least the target
    values: list[float] = field(default_factory=list)
    note: str = ""

    def add(self, value: float) -> None:
        self.values.append(float(value))

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    def ratio(self) -> float | None:
        m = self.median
        if m is None or not self.target:
            return None
        return m / self.target

    def verdict(self) -> str:
        m = self.median
        if m is None:
            return "no data"
        if self.target is None:
            return "-"
        ok = m <= self.target if self.bound == "<=" else m >= self.target
        return "met" if ok else "missed"

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "name": self.name, "unit": self.unit,
                "values": self.values, "min": min(self.values) if self.values else None,
                "median": self.median, "max": max(self.values) if self.values else None,
                "target": self.target, "bound": self.bound, "ratio": self.ratio(),
                "verdict": self.verdict(), "note": self.note}


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    a = abs(v)
    if a >= 10_000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 0.1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def table(figures: Sequence[Figure]) -> list[str]:
    """The figures as aligned text rows (one header line, one row per figure)."""
    head = ("group", "figure", "min / median / max", "unit", "target", "ratio", "")
    rows: list[tuple[str, ...]] = [head]
    for f in figures:
        vals = f.values
        spread = (f"{_num(min(vals))} / {_num(f.median)} / {_num(max(vals))}" if vals
                  else "-")
        target = f"{f.bound} {_num(f.target)}" if f.target is not None else "-"
        ratio = f.ratio()
        rows.append((f.group, f.name, spread, f.unit, target,
                     f"{ratio:.2f}" if ratio is not None else "-", f.verdict()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    out = []
    for r in rows:
        out.append("  ".join(c.ljust(w) if i != 2 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip())
    notes = [f"  {f.group}/{f.name}: {f.note}" for f in figures if f.note]
    if notes:
        out.append("notes:")
        out.extend(notes)
    return out


def write_json(path: str | Path, figures: Iterable[Figure], meta: dict[str, Any]) -> None:
    doc = {"meta": meta, "figures": [f.to_json() for f in figures]}
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")
