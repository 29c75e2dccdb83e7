"""SlurmrestdDriver against the REAL slurmrestd of every Slurm the local stack runs, each with
JWT auth (tokens from ``scontrol token``, checked by slurmctld's auth/jwt):

* Slurm 22.05 (the host's Debian packages): v0.0.38, read-only (no node update in its REST API);
* Slurm 24.11 (Debian trixie root): v0.0.40, v0.0.41, v0.0.42, each a writable contract;
* Slurm 26.05 (Debian sid root): v0.0.42, v0.0.43, v0.0.44 (what SchedMD's operator speaks),
  v0.0.45, each a writable contract; negotiation picks the newest a server offers.

Faults the real daemon cannot be made to produce on demand (a 503, errors inside an HTTP 200)
are in test_slurmrestd_faults.py, against a fault injector.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from healer.adapters.slurm import CallableToken, SlurmrestdDriver, StaticToken
from healer.errors import ForbiddenError, NotFoundError, PermanentError, TransientError
from healer.ports import SlurmNodeState, Undrain
from healer_dev.devstack.slurm import LocalSlurm, SlurmVersion
from tests.integration.slurm_fixtures import HOLD_SCRIPT, release, wait_for_file

pytestmark = pytest.mark.integration

REASON = "healer: XID 79 on GPU 3 (incident inc-7f3a)"

#: (Slurm, API version) pairs healer writes through, each against that Slurm's slurmrestd
WRITABLE = [(v, api) for v in (SlurmVersion.V24_11, SlurmVersion.V26_05)
            for api in v.restd_versions]


@dataclass
class Rest:
    slurm: LocalSlurm
    api: str
    driver: SlurmrestdDriver


@pytest.fixture(params=WRITABLE, ids=[f"slurm-{v.value}-{api}" for v, api in WRITABLE])
async def rest(request: pytest.FixtureRequest,
               slurm_clusters: Callable[[SlurmVersion], LocalSlurm]) -> AsyncIterator[Rest]:
    version, api = request.param
    cluster = slurm_clusters(version)
    cluster.reset()
    async with SlurmrestdDriver(cluster.restd_url, StaticToken(cluster.token(lifespan=600)),
                                versions=(api,)) as d:
        yield Rest(cluster, api, d)


async def poll(read: Callable[[], object], ok: Callable[[SlurmNodeState], bool],
               within: float = 20.0) -> SlurmNodeState:
    deadline = time.monotonic() + within
    while True:
        st = await read()  # type: ignore[misc]
        if ok(st):
            return st  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise AssertionError(f"state never matched within {within} s; last: {st}")
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# negotiation, against each real server


@pytest.mark.parametrize("version", list(SlurmVersion), ids=lambda v: f"slurm-{v.value}")
async def test_negotiates_the_newest_version_the_real_server_offers(
        version: SlurmVersion, slurm_clusters: Callable[[SlurmVersion], LocalSlurm]) -> None:
    cluster = slurm_clusters(version)
    async with SlurmrestdDriver(cluster.restd_url, StaticToken(cluster.token())) as d:
        newest = version.restd_versions[0]
        assert await d.version() == newest
        assert await d.writable() is (version is not SlurmVersion.V22_05)
        assert set(d._api.offered if d._api else ()) >= set(version.restd_versions)
        nodes = {n.name: n for n in await d.nodes()}
        assert set(nodes) == set(cluster.nodes)
    # a driver told to prefer what the server lacks takes the next it allows
    async with SlurmrestdDriver(cluster.restd_url, StaticToken(cluster.token()),
                                versions=("v0.0.99", version.restd_versions[-1])) as d:
        if version is SlurmVersion.V22_05:
            assert await d.version() == "v0.0.38"  # the read-only fallback
        else:
            assert await d.version() == version.restd_versions[-1]


# ---------------------------------------------------------------------------------------------
# the writable contract, for every (Slurm, API version)


async def test_drain_a_busy_node_then_undrain_only_our_incident(rest: Rest) -> None:
    slurm, d = rest.slurm, rest.driver
    assert await d.version() == rest.api
    job = slurm.submit(HOLD_SCRIPT, "gpu-1", name="restd drain")
    slurm.wait_job(job, ["RUNNING"])
    assert [(j.id, j.state, j.nodes, j.name) for j in await d.jobs_on("gpu-1")] == \
        [(job, "RUNNING", ("gpu-1",), "restd drain")]
    assert await d.jobs_on("gpu-0") == []

    assert await d.drain("gpu-1", REASON) is True
    st = await d.state("gpu-1")
    assert st.drain
    assert st.busy
    assert not st.drained
    assert st.reason == REASON
    assert st.reason_user == "root"
    assert slurm.node_state("gpu-1").reason == REASON  # Slurm's own view agrees
    assert await d.drain("gpu-1", REASON) is True  # idempotent
    assert slurm.job_state(job) == "RUNNING"  # a drain never touches the running job

    release(slurm, job)
    # read the one node as fast as the machine allows: slurmctld's single-node view keeps a
    # stale allocation under such polling (the driver checks it against the jobs)
    await poll(lambda: d.state("gpu-1"), lambda s: s.drained)
    assert await d.undrain("gpu-1", incident="inc-other") is Undrain.NOT_OURS
    assert (await d.state("gpu-1")).drained
    assert await d.undrain("gpu-1", incident="inc-7f3a") is Undrain.CLEARED
    st = await poll(lambda: d.state("gpu-1"), lambda s: not s.drain and s.registered)
    assert st.base == "IDLE"
    assert await d.undrain("gpu-1", incident="inc-7f3a") is Undrain.NOT_OURS


async def test_someone_elses_drain_is_kept_and_never_cleared(rest: Rest) -> None:
    slurm, d = rest.slurm, rest.driver
    admin = "disk replacement ticket 4711 Key=val [x]"
    slurm.run(["scontrol", "update", "nodename=gpu-3", "state=drain", f"reason={admin}"])
    assert await d.drain("gpu-3", REASON) is False
    assert await d.undrain("gpu-3") is Undrain.NOT_OURS
    assert await d.undrain("gpu-3", incident="inc-7f3a") is Undrain.NOT_OURS
    st = await d.state("gpu-3")
    assert st.drained
    assert st.reason == admin
    assert not st.reason_is_ours


async def test_a_down_node_with_someone_elses_reason_stays_theirs(rest: Rest) -> None:
    """DOWN with an admin's reason is someone else's, like their drain (ADR 0016)."""
    slurm, d = rest.slurm, rest.driver
    slurm.run(["scontrol", "update", "nodename=gpu-0", "state=down", "reason=broken"])
    assert await d.drain("gpu-0", REASON) is False
    st = await d.state("gpu-0")
    assert st.down
    assert st.reason == "broken"
    assert await d.undrain("gpu-0", incident="inc-7f3a") is Undrain.NOT_OURS
    st = await d.state("gpu-0")
    assert st.down
    assert st.reason == "broken"


async def test_undrain_keeps_a_down_node_down(rest: Rest) -> None:
    slurm, d = rest.slurm, rest.driver
    # DOWN with healer's own reason (Slurm took down a node healer was draining)
    slurm.run(["scontrol", "update", "nodename=gpu-0", "state=down", f"reason={REASON}"])
    assert await d.drain("gpu-0", REASON) is True
    st = await d.state("gpu-0")
    assert st.down
    assert st.drain
    assert await d.undrain("gpu-0", incident="inc-7f3a") is Undrain.CLEARED
    st = await d.state("gpu-0")
    assert st.down
    assert not st.drain  # UNDRAIN, not RESUME


async def test_usr1_reaches_the_trap_and_the_job_lives_on(rest: Rest) -> None:
    """A signal always carries ``signal`` and ``flags``: a bare DELETE would cancel the job."""
    slurm, d = rest.slurm, rest.driver
    job = slurm.submit(HOLD_SCRIPT, "gpu-2", name="ckpt")
    other = slurm.submit(HOLD_SCRIPT, "gpu-3", name="elsewhere")
    slurm.wait_job(job, ["RUNNING"])
    slurm.wait_job(other, ["RUNNING"])
    marker = slurm.jobdir / f"usr1-{job}"
    assert await d.signal_jobs("gpu-2", "SIGUSR1", batch_only=True) == [job]
    assert wait_for_file(marker).count("USR1") == 1
    assert slurm.job_state(job) == "RUNNING"
    assert await d.signal_jobs("gpu-2", "usr1") == [job]  # FULL_JOB: the batch shell too
    deadline = time.monotonic() + 10
    while marker.read_text().count("USR1") < 2:
        assert time.monotonic() < deadline, "the second USR1 never reached the trap"
        await asyncio.sleep(0.02)
    assert slurm.job_state(job) == "RUNNING"
    assert not (slurm.jobdir / f"usr1-{other}").exists()
    assert await d.signal_jobs("gpu-0", "USR1") == []
    release(slurm, job)
    release(slurm, other)


async def test_errors_are_mapped(rest: Rest) -> None:
    slurm, d = rest.slurm, rest.driver
    with pytest.raises(NotFoundError):
        await d.state("gpu-99")
    with pytest.raises(NotFoundError):
        await d.drain("gpu-99", REASON)
    with pytest.raises(PermanentError, match="must start with"):
        await d.drain("gpu-0", "no prefix")
    with pytest.raises(PermanentError, match="requeue"):
        await d.requeue_jobs("gpu-0")
    with pytest.raises(PermanentError):
        await d.signal_jobs("gpu-0", "USR1; rm -rf /")
    async with SlurmrestdDriver(slurm.restd_url, StaticToken("not-a-jwt"), attempts=1,
                                versions=(rest.api,)) as bad:
        with pytest.raises(ForbiddenError):
            await bad.nodes()
    async with SlurmrestdDriver("http://127.0.0.1:9", StaticToken("x"), attempts=2,
                                timeout=2) as gone:
        with pytest.raises(TransientError, match="cannot connect"):
            await gone.nodes()


async def test_an_expired_token_is_fetched_again(rest: Rest) -> None:
    slurm = rest.slurm
    handed: list[str] = []
    tokens = iter([slurm.token(lifespan=1), slurm.token(lifespan=600)])

    def fetch() -> str:
        handed.append(next(tokens))
        return handed[-1]

    async with SlurmrestdDriver(slurm.restd_url, CallableToken(fetch, ttl=3600),
                                versions=(rest.api,)) as d:
        await asyncio.sleep(2.5)  # the first token's lifetime (1 s) is over
        assert len(await d.nodes()) == len(slurm.nodes)
        assert len(handed) == 2  # refused, then fetched again
        await d.nodes()
        assert len(handed) == 2  # cached


# ---------------------------------------------------------------------------------------------
# Slurm 22.05: read-only


@pytest.fixture
async def real(slurm: LocalSlurm) -> AsyncIterator[SlurmrestdDriver]:
    async with SlurmrestdDriver(slurm.restd_url, StaticToken(slurm.token(lifespan=600))) as d:
        yield d


async def test_22_05_reads_nodes_jobs_and_a_drain_reason(
        slurm: LocalSlurm, real: SlurmrestdDriver) -> None:
    assert await real.version() == "v0.0.38"
    assert await real.writable() is False
    job = slurm.submit(HOLD_SCRIPT, "gpu-1", name="restd read")
    slurm.wait_job(job, ["RUNNING"])
    slurm.run(["scontrol", "update", "nodename=gpu-1", "state=drain", f"reason={REASON}"])
    st = await real.state("gpu-1")
    assert st.drain
    assert st.busy
    assert st.reason == REASON
    assert st.reason_user == "root"
    jobs = await real.jobs_on("gpu-1")
    assert [(j.id, j.state, j.nodes, j.name) for j in jobs] == \
        [(job, "RUNNING", ("gpu-1",), "restd read")]
    release(slurm, job)
    slurm.wait_state("gpu-1", lambda s: s.drained)
    assert (await real.state("gpu-1")).drained


async def test_22_05_writes_raise_a_clear_permanent_error(
        slurm: LocalSlurm, real: SlurmrestdDriver) -> None:
    for call in (real.drain("gpu-0", REASON), real.undrain("gpu-0", "inc-7f3a"),
                 real.signal_jobs("gpu-0", "USR1")):
        with pytest.raises(PermanentError, match=r"Slurm >= 23\.11"):
            await call
    assert (await real.state("gpu-0")).base == "IDLE"  # nothing changed


async def test_22_05_errors(slurm: LocalSlurm, real: SlurmrestdDriver) -> None:
    with pytest.raises(NotFoundError, match="Invalid node name"):
        await real.state("gpu-99")
    async with SlurmrestdDriver(slurm.restd_url, StaticToken("not-a-jwt"), attempts=1) as bad:
        # 22.05 passes the token through; slurmctld rejects it: HTTP 500, errno -1
        with pytest.raises(TransientError, match="rejected the JWT"):
            await bad.nodes()
    async with SlurmrestdDriver(slurm.restd_url, StaticToken(slurm.token()), user="") as anon:
        with pytest.raises(ForbiddenError, match="401"):
            await anon.nodes()
