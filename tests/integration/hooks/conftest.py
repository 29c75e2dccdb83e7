"""Hooks against the real components: the fixtures come from the shared modules."""

from __future__ import annotations

from tests.integration.slurm_fixtures import local_slurm, slurm

__all__ = ["local_slurm", "slurm"]
