"""Slurm drivers implementing :class:`healer.ports.SlurmDriver`.

* :class:`ScontrolDriver`: Slurm's CLI (``scontrol``/``squeue``/``scancel``), any Slurm version.
* :class:`SlurmrestdDriver`: slurmrestd with a JWT; writes need Slurm >= 23.11 (v0.0.40+).

:mod:`healer.adapters.slurm.parse` holds the pure parsing both share.
"""

from __future__ import annotations

from healer.adapters.slurm.scontrol import ScontrolDriver
from healer.adapters.slurm.slurmrestd import (
    CallableToken,
    SlurmrestdDriver,
    StaticToken,
    TokenProvider,
)

__all__ = ["CallableToken", "ScontrolDriver", "SlurmrestdDriver", "StaticToken", "TokenProvider"]
