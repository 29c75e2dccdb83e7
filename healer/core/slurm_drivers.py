"""The Slurm drivers, named once: each :class:`SlurmDriverKind` with what it can do and which
settings it needs (:data:`DRIVERS`).

The command line (``--slurm-driver``), the settings, the policy schema (a ``SlurmNodeSet``'s
``spec.slurm.driver``), the NodeSet compiler, the run checks and the composition root
(:mod:`healer.app`, which maps each kind to the factory that builds it) all read this one
table; no other module spells a driver's name or asks an adapter what it can do.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DRIVERS", "SlurmCapabilities", "SlurmDriverKind", "SlurmDriverSpec", "capabilities_of",
           "spec_of"]


class SlurmDriverKind(enum.StrEnum):
    """How healer drains, undrains and reads a cluster's Slurm nodes."""

    SLINKY = "slinky"
    SCONTROL = "scontrol"
    SLURMRESTD = "slurmrestd"


@dataclass(frozen=True, slots=True)
class SlurmCapabilities:
    """What a driver can do beyond the SlurmDriver port (``healer.ports``)."""

    lists_nodes: bool
    """Lists every Slurm node in one read (the guardrails' Slurm feed)."""
    holds: bool
    """Drains with someone else's reason, word for word (a swap's ``carryOver``)."""
    deletes_records: bool
    """Deletes a Slurm node's record (what a slurmd pod's preStop does)."""
    job_history: bool
    """Lists the jobs that ended with a node (a dead node's report)."""


#: Every capability: Slurm's own API (scontrol, slurmrestd) has them all.
_SLURM_API = SlurmCapabilities(lists_nodes=True, holds=True, deletes_records=True,
                               job_history=True)


@dataclass(frozen=True, slots=True)
class SlurmDriverSpec:
    """One driver's registry entry."""

    kind: SlurmDriverKind
    summary: str
    """One line for ``--help`` and the policy schema."""
    capabilities: SlurmCapabilities
    through_job_backend: bool
    """Its capabilities are those of its job backend (Slurm's own API beside it, if any),
    not its own: the slinky driver drains through Kubernetes only."""
    names_by_pod: bool
    """The Slurm node is the slurmd pod's name, not the Kubernetes node's (Slinky)."""
    needs: tuple[str, ...]
    """The settings (:class:`healer.settings.SlurmSettings` field names) it cannot run
    without, on the command line."""
    needs_in_nodeset: tuple[str, ...]
    """The ``spec.slurm`` fields a SlurmNodeSet naming it must set (with several clusters,
    each has its own)."""


DRIVERS: Mapping[SlurmDriverKind, SlurmDriverSpec] = {
    SlurmDriverKind.SLINKY: SlurmDriverSpec(
        SlurmDriverKind.SLINKY,
        "only Kubernetes RBAC, through the slurm-operator's cordon sync",
        capabilities=SlurmCapabilities(lists_nodes=True, holds=False, deletes_records=False,
                                       job_history=False),
        through_job_backend=True, names_by_pod=True, needs=(), needs_in_nodeset=()),
    SlurmDriverKind.SCONTROL: SlurmDriverSpec(
        SlurmDriverKind.SCONTROL, "Slurm's scontrol, with this cluster's slurm.conf",
        capabilities=_SLURM_API, through_job_backend=False, names_by_pod=False,
        needs=(), needs_in_nodeset=("slurm_conf",)),
    SlurmDriverKind.SLURMRESTD: SlurmDriverSpec(
        SlurmDriverKind.SLURMRESTD, "Slurm's REST API, with a JWT from a Secret",
        capabilities=_SLURM_API, through_job_backend=False, names_by_pod=False,
        needs=("slurmrestd_url", "token_secret"),
        needs_in_nodeset=("slurmrestd_url", "token_secret")),
}


def spec_of(kind: SlurmDriverKind) -> SlurmDriverSpec:
    """``kind``'s registry entry."""
    return DRIVERS[kind]


def capabilities_of(kind: SlurmDriverKind,
                    backend: SlurmDriverKind | None = None) -> SlurmCapabilities:
    """What ``kind`` can do, with ``backend`` as its job backend (Slurm's own API beside a
    driver whose entry says ``through_job_backend``; ignored for the others): its own
    capabilities, and for such a driver also each of its backend's."""
    spec = DRIVERS[kind]
    own = spec.capabilities
    if not spec.through_job_backend or backend is None:
        return own
    theirs = capabilities_of(backend)
    return SlurmCapabilities(lists_nodes=own.lists_nodes or theirs.lists_nodes,
                             holds=own.holds or theirs.holds,
                             deletes_records=own.deletes_records or theirs.deletes_records,
                             job_history=own.job_history or theirs.job_history)
