"""A verdict's GPUs, named from the node's GPU identity blocks (:mod:`healer.core.gpu_identity`,
ADR 0009). Pure: no I/O, no clock.

The controller uses the blocks twice (:func:`with_gpu_identity`, run on every verdict):

* a condition rule's match names the GPUs marked ``*`` in the condition it matched, so the
  incident, its Events and the per-serial retry budget see their index, UUID and serial;
* any other match (a DCGM metric, an XID from Prometheus) that names a GPU by UUID without a
  serial gets the serial the node's agent published for that UUID (a UUID names one physical
  GPU, like its serial; the index is never used to join, DCGM's and NVML's may differ).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from healer.core.gpu_identity import serials_by_uuid, signal_identities
from healer.core.health import Verdict
from healer.core.model import GpuRef, Signal


def _fill(gpus: Sequence[GpuRef], serials: dict[str, str]) -> tuple[GpuRef, ...]:
    """``gpus`` (in order) with the serials they lack."""
    return tuple(replace(g, serial=serials[g.uuid]) if not g.serial and g.uuid in serials
                 else g for g in gpus)


def with_gpu_identity(verdict: Verdict, signals: Sequence[Signal]) -> Verdict:
    """``verdict`` with its confirmed matches' GPUs identified from the node's condition blocks:

    * a match naming no GPU whose evidence is a condition with a block names the GPUs the
      block marks affected (and its detail, which Events and the record show, says so);
    * a GPU named by UUID without a serial gets the serial published for that UUID (in the
      detail too).

    The same verdict (the same object) when nothing changes."""
    if not any(m.state.is_confirmed and (not m.gpus or any(not g.serial and g.uuid
                                                           for g in m.gpus))
               for m in verdict.matches):
        return verdict  # nothing to identify (healthy, suspect, stale, or serials known)
    serials = serials_by_uuid(signals)
    matches = []
    changed = False
    for m in verdict.matches:
        if not m.state.is_confirmed:  # only confirmed matches name an incident's GPUs
            matches.append(m)
            continue
        gpus, detail = m.gpus, m.detail
        if not gpus:
            gpus = tuple(sorted({g.gpu for e in m.evidence for g in signal_identities(e)
                                 if g.affected}))
            if gpus:
                detail = f"{detail} (on {', '.join(g.describe() for g in gpus)})"
        elif serials:
            filled = _fill(gpus, serials)
            for old, new in zip(gpus, filled, strict=True):
                if old != new:
                    detail = detail.replace(old.describe(), new.describe())
            gpus = filled
        if gpus != m.gpus:
            changed = True
            m = replace(m, gpus=gpus, detail=detail)
        matches.append(m)
    return replace(verdict, matches=tuple(matches)) if changed else verdict
