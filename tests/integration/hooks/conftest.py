"""Hooks against the real components: the fixtures come from the shared modules."""

from __future__ import annotations

from tests.integration.slurm_fixtures import any_slurm, local_slurm, slurm, slurm_clusters

__all__ = ["any_slurm", "local_slurm", "slurm", "slurm_clusters"]
