"""Real-Slurm tests: the fixtures live in tests/integration/slurm_fixtures.py."""

from __future__ import annotations

from tests.integration.slurm_fixtures import any_slurm, local_slurm, slurm, slurm_clusters

__all__ = ["any_slurm", "local_slurm", "slurm", "slurm_clusters"]
