"""The observability tests drive the real daemon process with the ``fleet`` fixture of
tests/integration/daemon (kwok nodes on the real kube-apiserver, file-backed Slurm)."""

from tests.integration.daemon.conftest import Fleet, fleet

__all__ = ["Fleet", "fleet"]
