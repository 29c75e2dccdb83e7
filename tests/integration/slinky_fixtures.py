"""pytest fixtures for the Slinky world on the local stack
(:mod:`healer_dev.devstack.slinky_stack`):
SchedMD's real slurm-operator, a real Slurm 26.05 (its Debian root, ADR 0017) with dynamic
nodes and its real slurmrestd on :6820 (JWT auth with the key of the clusters' JWT Secret), and
the kwok pod runtime (a real ``slurmd -Z`` per Running slurmd pod).

* ``slinky_stack`` (session): started once on the session's ``kube_stack`` with the default
  operator version; a test that needs another version calls ``slinky_stack.use("v1.0.0")``
  (the ``operator_version`` fixture does it from a parametrize). If any part cannot start,
  every test using it FAILS with the reason; nothing is skipped.
* ``slinky_cluster`` (function): the test's namespace with what ``helm install slurm``
  creates there (Secrets, Controller, RestApi), on the operator version the test asked for.

NodeSet names must be unique per test (one Slurm serves every namespace and a Slurm node is
named after its pod): use :func:`unique_nodeset`.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from healer.errors import ConfigError
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.operator import DEFAULT_VERSION
from healer_dev.devstack.slinky_stack import SlinkyStack
from healer_dev.devstack.slurm import LocalSlurm, SlurmVersion

__all__ = ["operator_version", "slinky_cluster", "slinky_stack", "unique_nodeset"]

#: dynamic Slurm nodes the session's Slurm admits (MaxNodeCount)
MAX_NODES = 128
#: GPU device files per node in gres.conf: what a NodeSet requesting all 8 GPUs of a Node sees
GPUS = 8


def unique_nodeset(prefix: str) -> str:
    """A NodeSet name no other test uses (its pods, hence its Slurm nodes, are unique too)."""
    return f"{prefix}{secrets.token_hex(2)}"


@pytest.fixture(scope="session")
def slinky_stack(kube_stack: KubeStack,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlinkyStack]:
    slurm = LocalSlurm(tmp_path_factory.mktemp("slinky-slurm"), nodes=(), gpus_per_node=GPUS,
                       cpus_per_node=2, max_dynamic_nodes=MAX_NODES,
                       version=SlurmVersion.V26_05)
    try:
        slurm.start()
    except ConfigError as e:
        pytest.fail(f"the local Slurm cluster (dynamic nodes) did not start:\n{e}",
                    pytrace=False)
    stack = SlinkyStack(kube_stack, slurm, workdir=tmp_path_factory.mktemp("slinky"),
                        version=DEFAULT_VERSION)
    try:
        stack.start()
    except BaseException as e:  # also a test timeout while another stack holds the lock
        slurm.stop()
        if not isinstance(e, ConfigError):
            raise
        pytest.fail(f"the Slinky stack (slurm-operator {DEFAULT_VERSION}, Slurm 26.05's "
                    f"slurmrestd, pod runtime) did not start:\n{e}", pytrace=False)
    try:
        yield stack
    finally:
        stack.stop()
        slurm.stop()


@pytest.fixture
def operator_version(request: pytest.FixtureRequest, slinky_stack: SlinkyStack) -> str:
    """The operator version a test runs on: its ``operator_version`` parameter (indirect
    parametrize), else the default. Switching stops one operator and starts the other."""
    version = str(getattr(request, "param", DEFAULT_VERSION))
    try:
        slinky_stack.use(version)
    except ConfigError as e:
        pytest.fail(f"slurm-operator {version} did not start:\n{e}", pytrace=False)
    return version


@pytest.fixture
def slinky_cluster(slinky_stack: SlinkyStack, operator_version: str,
                   namespace: str) -> SlinkyStack:
    try:
        slinky_stack.add_cluster(namespace)
    except ConfigError as e:
        pytest.fail(f"cannot create the Slurm cluster objects in {namespace}:\n{e}",
                    pytrace=False)
    return slinky_stack
