"""The local stack's slurmrestd refuses a port something else listens on: a slurmrestd left
by a killed run would otherwise answer in its place (dev side)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from healer_dev.devstack.slurm import LocalSlurm, SlurmStartupError


def test_slurmrestd_refuses_a_port_that_is_taken(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        slurm = LocalSlurm(tmp_path, ("gpu-0",))
        with pytest.raises(SlurmStartupError, match=f"127.0.0.1:{port}: something listens"):
            slurm.start_restd(port)
        assert slurm._restd is None  # nothing was spawned
