"""How one spare-validation check's output is judged (pure).

Each check's Job (``deploy/validation/``) writes its container's termination message in one
format: a first line ``healer-check <check> exit=<code>``, then the tool's output — for
``dcgm-diag`` the JSON of ``dcgmi diag -r 2 -j`` (gzip, then base64, to fit the 4 KiB a
termination message may hold), for ``nccl-loopback`` the tail of ``all_reduce_perf``'s report,
ending with its ``# Avg bus bandwidth`` line. The adapter decodes; this module parses and judges:

* dcgm-diag passes when the exit code is 0 and no test in the JSON failed; a failing test is
  named (with its GPU and first warning) in the detail.
* nccl-loopback passes when the exit code is 0 and the average bus bandwidth is at least the
  policy's threshold for the node's GPU model (``nvidia.com/gpu.product``); the detail gives the
  figure and the threshold.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from healer.core.spare_validation import SpareCheck, SpareValidation

_HEADER_RE = re.compile(r"^healer-check\s+(\S+)\s+exit=(-?\d+)\s*$")
_BUSBW_RE = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)
_FAILED = {"fail", "failed", "error"}


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    check: str
    passed: bool
    detail: str  # what failed and the figure (or why it passed)
    figure: str = ""  # the measured figure, when the check has one ("312.4 GB/s")


@dataclass(frozen=True, slots=True)
class Report:
    """A check Job's termination message, split: the check, its exit code, its output."""

    check: str
    exit_code: int
    body: str


def parse_report(message: str) -> Report | None:
    """The termination message's header and body; None when it has no header line."""
    head, _, body = message.partition("\n")
    m = _HEADER_RE.match(head.strip())
    if m is None:
        return None
    return Report(m.group(1), int(m.group(2)), body)


def dcgm_failures(text: str) -> list[str] | None:
    """The failed tests of ``dcgmi diag -j``'s JSON (``test (GPU n): warning``), [] when all
    passed, None when the text is not that JSON."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    diag = doc.get("DCGM GPU Diagnostic") if isinstance(doc, dict) else None
    if not isinstance(diag, dict) or not isinstance(diag.get("test_categories"), list):
        return None
    out: list[str] = []
    for cat in diag["test_categories"]:
        for test in (cat.get("tests") or []) if isinstance(cat, dict) else []:
            if isinstance(test, dict):
                out.extend(_test_failures(test))
    return out


def _test_failures(test: dict[str, Any]) -> list[str]:
    name = str(test.get("name") or "?")
    out = []
    for res in test.get("results") or []:
        if not isinstance(res, dict) or str(res.get("status", "")).lower() not in _FAILED:
            continue
        gpu = res.get("gpu_id", res.get("gpu_ids"))
        where = f" (GPU {gpu})" if gpu not in (None, "", []) else ""
        warnings = [w.get("warning") for w in res.get("warnings") or [] if isinstance(w, dict)]
        why = next((str(w) for w in warnings if w), "")
        out.append(f"{name}{where}" + (f": {why}" if why else ""))
    return out


def bus_bandwidth(text: str) -> float | None:
    """``all_reduce_perf``'s ``# Avg bus bandwidth : X`` in GB/s (the last one), or None."""
    found = _BUSBW_RE.findall(text)
    return float(found[-1]) if found else None


def judge_dcgm(exit_code: int, json_text: str | None) -> CheckOutcome:
    check = SpareCheck.DCGM_DIAG.value
    failures = dcgm_failures(json_text) if json_text else None
    if failures:
        shown = "; ".join(failures[:4]) + (f" (+{len(failures) - 4} more)"
                                           if len(failures) > 4 else "")
        return CheckOutcome(check, False, f"dcgmi diag -r 2 failed: {shown}")
    if exit_code != 0:
        return CheckOutcome(check, False, f"dcgmi diag -r 2 exited {exit_code}"
                            + ("" if failures is not None else " (no readable JSON result)"))
    if failures is None:
        return CheckOutcome(check, True, "dcgmi diag -r 2 exited 0 (no readable JSON result)")
    return CheckOutcome(check, True, "dcgmi diag -r 2 passed")


def judge_nccl(exit_code: int, output: str, model: str,
               policy: SpareValidation) -> CheckOutcome:
    check = SpareCheck.NCCL_LOOPBACK.value
    threshold = policy.bus_bandwidth_threshold(model)
    busbw = bus_bandwidth(output)
    figure = f"{busbw:g} GB/s" if busbw is not None else ""
    if exit_code != 0:
        return CheckOutcome(check, False, f"all_reduce_perf exited {exit_code}"
                            + (f" (bus bandwidth {figure})" if figure else ""), figure)
    if busbw is None:
        return CheckOutcome(check, False, "all_reduce_perf printed no average bus bandwidth")
    what = model or "unknown GPU model"
    if threshold is None:
        return CheckOutcome(check, False, f"bus bandwidth {figure}: no threshold for {what} "
                            "in ncclBusBandwidthGBps (and no default)", figure)
    verdict = "below" if busbw < threshold else "at least"
    return CheckOutcome(check, busbw >= threshold,
                        f"bus bandwidth {figure}, {verdict} the {threshold:g} GB/s "
                        f"threshold for {what}", figure)


def judge(check: str, exit_code: int, message: str | None, dcgm_json: str | None, model: str,
          policy: SpareValidation) -> CheckOutcome:
    """One check's outcome from its pod's exit code and termination message (``dcgm_json``:
    the decoded JSON of a dcgm-diag report, when the adapter could decode it)."""
    report = parse_report(message) if message else None
    code = report.exit_code if report is not None else exit_code
    if check == SpareCheck.DCGM_DIAG:
        return judge_dcgm(code, dcgm_json)
    if check == SpareCheck.NCCL_LOOPBACK:
        return judge_nccl(code, report.body if report is not None else (message or ""), model,
                          policy)
    return CheckOutcome(check, code == 0, f"{check} exited {code}")
