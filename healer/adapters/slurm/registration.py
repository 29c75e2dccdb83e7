"""Did a replacement register with Slurm so that Slurm will really schedule on it? (pure)

Before healer undrains a replacement (ADR 0017), it reads the Slurm node and compares it with
what the NodeSet declared for the slurmd pod:

* Slurm accepted the registration: no ``INVALID_REG`` (Slurm sets it, with DRAIN and a reason
  such as ``Failed to set topology 'CoreSpecCount=36'``, when the ``--conf`` the slurmd
  registered with is wrong: SlinkyProject/slurm-operator#261);
* the features the pod's ``--conf`` declares (``Features=``, the NodeSet's name first) are the
  node's;
* its GPUs: the ``Gres=`` of the ``--conf`` when it has one, else the pod's ``nvidia.com/gpu``
  limit, equals the number of GPUs in Slurm's GRES;
* its topology string, where Slurm keeps one (>= 25.05) and the annotation names one, is set.

No I/O: the caller hands in Slurm's view (:class:`~healer.ports.SlurmNodeState`) and the pod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from healer.ports import SlurmNodeState

__all__ = ["Declared", "declared_by_pod", "gpu_count", "registration_problems"]

SLURMD_CONTAINER = "slurmd"
GPU_RESOURCE = "nvidia.com/gpu"
_GPU = re.compile(r"^gpu(?::[^:(,]+)?:(\d+)")


@dataclass(frozen=True, slots=True)
class Declared:
    """What the NodeSet declared for one slurmd (None / empty: nothing declared)."""

    features: frozenset[str] = frozenset()
    gpus: int | None = None


def conf_items(args: Sequence[str]) -> dict[str, str]:
    """``Key=value`` items of a slurmd ``--conf`` argument (the operator quotes it: ``'A=1
    B=2'``); keys title-cased as the operator writes them."""
    out: dict[str, str] = {}
    args = list(args)
    for i, a in enumerate(args):
        if a == "--conf" and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith("--conf="):
            value = a.split("=", 1)[1]
        else:
            continue
        for item in value.strip().strip("'\"").split():
            key, sep, val = item.partition("=")
            if sep:
                out[key[:1].upper() + key[1:].lower()] = val
    return out


def gpu_count(gres: str) -> int:
    """GPUs in a GRES string: ``gpu:h100:8``, ``gpu:8``, ``gpu:h100:4(S:0),gpu:a100:2`` → 8, 8,
    6; none → 0."""
    total = 0
    for part in re.split(r",(?![^()]*\))", gres):
        m = _GPU.match(part.strip())
        if m:
            total += int(m.group(1))
    return total


def declared_by_pod(pod: Mapping[str, Any]) -> Declared:
    """The slurmd container's ``--conf`` Features and GPUs (``Gres=``, else its
    ``nvidia.com/gpu`` limit)."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        if not isinstance(c, Mapping) or c.get("name") != SLURMD_CONTAINER:
            continue
        conf = conf_items([str(a) for a in c.get("args") or []])
        feats = conf.get("Features") or conf.get("Feature") or ""
        gpus: int | None = None
        if conf.get("Gres"):
            gpus = gpu_count(conf["Gres"])
        else:
            limit = ((c.get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE)
            if limit is not None and str(limit).isdigit():
                gpus = int(str(limit))
        return Declared(frozenset(f for f in feats.split(",") if f), gpus)
    return Declared()


def registration_problems(st: SlurmNodeState, declared: Declared) -> list[str]:
    """Why Slurm will not (or should not) schedule on this node as declared; [] = valid."""
    problems: list[str] = []
    if st.invalid_registration:
        problems.append(f"Slurm refused its registration (INVALID_REG: "
                        f"{st.reason or 'no reason given'})")
    missing = declared.features - st.features
    if missing:
        problems.append(f"features {','.join(sorted(missing))} declared by the NodeSet are "
                        f"not on the Slurm node (it has {','.join(sorted(st.features)) or 'none'})")
    if declared.gpus is not None and st.gres and gpu_count(st.gres) != declared.gpus:
        problems.append(f"Slurm counts {gpu_count(st.gres)} GPUs (GRES {st.gres}), the NodeSet "
                        f"declares {declared.gpus}")
    elif declared.gpus and not st.gres:
        problems.append(f"Slurm reports no GRES, the NodeSet declares {declared.gpus} GPUs")
    return problems
