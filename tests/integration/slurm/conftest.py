"""Real-Slurm tests: the fixtures live in tests/integration/slurm_fixtures.py."""

from __future__ import annotations

from tests.integration.slurm_fixtures import local_slurm, slurm

__all__ = ["local_slurm", "slurm"]
