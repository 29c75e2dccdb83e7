"""A dynamic Slurm node (``slurmd -Z``, as Slinky's worker pods run it) whose pod died with its
node, against a real Slurm 22.05 (scontrol) and the real slurmrestd of Slurm 26.05 (issue 20,
docs/adr/0016): the pod's preStop, which deletes the node's record, never ran, so a replacement
registering under the same name keeps the dead pod's address and slurmctld never reaches it;
once the record is deleted (what healer does for a fenced dead node, through scontrol or
slurmrestd) the replacement registers afresh.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from healer.adapters.slurm import ScontrolDriver
from healer.adapters.slurm.parse import parse_kv_line
from healer.adapters.slurm.slurmrestd import SlurmrestdDriver, StaticToken
from healer.errors import NotFoundError, TransientError
from healer.ports import SlurmNodeRecords
from healer_dev.devstack.slurm import LocalSlurm, SlurmVersion
from tests.integration.slurm_fixtures import HOLD_SCRIPT, release, running_slurm

pytestmark = pytest.mark.integration

CONF = "CPUs=1 RealMemory=100"


@pytest.fixture(scope="module")
def dyn_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    with running_slurm(tmp_path_factory.mktemp("dyn-slurm"), nodes=(),
                       max_dynamic_nodes=4) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def dyn_slurm_restd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    """Slurm 26.05 (the Debian sid root) with dynamic nodes and its real slurmrestd."""
    with running_slurm(tmp_path_factory.mktemp("dyn-slurm-26"), nodes=(), max_dynamic_nodes=4,
                       with_restd=True, version=SlurmVersion.V26_05) as cluster:
        yield cluster


def node_addr(slurm: LocalSlurm, name: str) -> str:
    out = slurm.run(["scontrol", "show", "node", name, "-o"], timeout=20).stdout
    return parse_kv_line(out.strip()).get("NodeAddr", "")


def dies(slurm: LocalSlurm, name: str) -> None:
    """The pod's node lost power: its slurmd is killed, no preStop runs."""
    assert slurm.signal_dynamic_slurmd(name, signal.SIGKILL)
    slurm.stop_dynamic_slurmd(name)


async def test_a_replacement_keeps_the_dead_pods_address_until_the_record_is_deleted(
        dyn_slurm: LocalSlurm) -> None:
    slurm, driver = dyn_slurm, ScontrolDriver(env=dyn_slurm.env(), timeout=20)
    records: SlurmNodeRecords = driver  # it can delete a record (checked by mypy)
    slurm.start_dynamic_slurmd("dyn-0", pod_ip="127.0.0.21", conf=CONF)
    assert node_addr(slurm, "dyn-0") == "127.0.0.21"
    dies(slurm, "dyn-0")

    # no deletion: the replacement registers, but Slurm keeps the dead pod's address
    slurm.start_dynamic_slurmd("dyn-0", pod_ip="127.0.0.22", conf=CONF)
    assert node_addr(slurm, "dyn-0") == "127.0.0.21"
    dies(slurm, "dyn-0")

    # the record deleted first (the preStop's Slurm half): the replacement is reached
    assert await records.delete_node("dyn-0") is True
    with pytest.raises(NotFoundError):
        await driver.state("dyn-0")
    assert await records.delete_node("dyn-0") is False  # idempotent
    slurm.start_dynamic_slurmd("dyn-0", pod_ip="127.0.0.23", conf=CONF)
    assert node_addr(slurm, "dyn-0") == "127.0.0.23"
    slurm.stop_dynamic_slurmd("dyn-0")
    await driver.delete_node("dyn-0")


async def test_slurm_does_not_delete_a_node_with_a_job(dyn_slurm: LocalSlurm) -> None:
    slurm, driver = dyn_slurm, ScontrolDriver(env=dyn_slurm.env(), timeout=20)
    slurm.start_dynamic_slurmd("dyn-1", pod_ip="127.0.0.24", conf=CONF)
    job = slurm.submit(HOLD_SCRIPT, "dyn-1", name="train", gres="")
    slurm.wait_job(job, ["RUNNING"])
    try:
        with pytest.raises(TransientError, match="busy"):  # a wait: jobs end
            await driver.delete_node("dyn-1")
        assert (await driver.state("dyn-1")).busy
    finally:
        release(slurm, job)
        slurm.wait_job(job, ["COMPLETED"])
    slurm.stop_dynamic_slurmd("dyn-1")
    assert await driver.delete_node("dyn-1") is True


async def test_slurmrestd_deletes_the_record_too(dyn_slurm_restd: LocalSlurm) -> None:
    slurm = dyn_slurm_restd
    slurm.start_dynamic_slurmd("dyn-2", pod_ip="127.0.0.25", conf=CONF)
    dies(slurm, "dyn-2")
    async with SlurmrestdDriver(slurm.restd_url, StaticToken(slurm.token(lifespan=600))) as driver:
        assert await driver.delete_node("dyn-2") is True
        deletes = [r.path for r in slurm.restd_requests() if r.method == "DELETE"]
        assert len(deletes) == 1, deletes
        assert deletes[0].endswith("/node/dyn-2"), deletes
        with pytest.raises(NotFoundError):
            await driver.state("dyn-2")
        assert await driver.delete_node("dyn-2") is False
        slurm.start_dynamic_slurmd("dyn-2", pod_ip="127.0.0.26", conf=CONF)
        assert node_addr(slurm, "dyn-2") == "127.0.0.26"
        slurm.stop_dynamic_slurmd("dyn-2")
