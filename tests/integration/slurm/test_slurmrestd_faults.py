"""SlurmrestdDriver against an in-process FAULT INJECTOR (fake_slurmrestd.py beside this file):
only what the real slurmrestd cannot be made to do on demand here: a 503, a failure carried in
an HTTP 200 body, a server that offers nothing newer than v0.0.39 (Slurm 23.02, not packaged in
Debian), the exact bytes healer sends. The contract itself (drain, undrain, signals, states,
jobs, errors, negotiation) is proved against the real slurmrestd of every Slurm the stack runs,
in test_slurmrestd.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from healer.adapters.slurm import SlurmrestdDriver, StaticToken
from healer.errors import ForbiddenError, NotFoundError, PermanentError, TransientError
from healer.ports import Undrain
from tests.integration.slurm.fake_slurmrestd import FakeSlurmrestd

pytestmark = pytest.mark.integration

REASON = "healer: XID 79 on GPU 3 (incident inc-7f3a)"

# ---------------------------------------------------------------------------------------------
# the v0.0.44 wire format, on the fault injector


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlurmrestd]:
    server = FakeSlurmrestd()
    for i in range(4):
        server.add_node(f"gpu-{i}")
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def rest(fake: FakeSlurmrestd) -> AsyncIterator[SlurmrestdDriver]:
    async with SlurmrestdDriver(fake.url, StaticToken(fake.token), user="healer") as d:
        yield d


async def test_negotiates_the_newest_version_and_sends_auth_headers(
        fake: FakeSlurmrestd, rest: SlurmrestdDriver) -> None:
    assert await rest.version() == "v0.0.44"
    assert await rest.writable() is True
    await rest.state("gpu-0")
    first, get = fake.requests
    assert (first.method, first.path) == ("GET", "/openapi/v3")
    assert (get.method, get.path) == ("GET", "/slurm/v0.0.44/node/gpu-0")
    for r in fake.requests:
        assert r.headers["X-SLURM-USER-NAME"] == "healer"
        assert r.headers["X-SLURM-USER-TOKEN"] == fake.token


async def test_negotiation_honours_the_allowed_versions() -> None:
    server = FakeSlurmrestd(versions=("v0.0.40", "v0.0.41", "v0.0.42"))
    server.add_node("gpu-0")
    await server.start()
    try:
        async with SlurmrestdDriver(server.url, StaticToken(server.token),
                                    versions=("v0.0.44", "v0.0.41")) as d:
            assert await d.version() == "v0.0.41"
            await d.jobs()
            assert server.calls()[-1].path == "/slurm/v0.0.41/jobs/"
    finally:
        await server.close()


async def test_only_old_versions_means_read_only() -> None:
    server = FakeSlurmrestd(versions=("v0.0.37", "v0.0.38", "v0.0.39"), release="23.02.7")
    server.add_node("gpu-0")
    await server.start()
    try:
        async with SlurmrestdDriver(server.url, StaticToken(server.token)) as d:
            assert await d.version() == "v0.0.39"
            assert (await d.state("gpu-0")).base == "IDLE"
            with pytest.raises(PermanentError, match=r"offers only v0\.0\.39, v0\.0\.38"):
                await d.drain("gpu-0", REASON)
            assert server.calls("POST") == []
    finally:
        await server.close()


async def test_drain_and_undrain_send_the_documented_bodies(
        fake: FakeSlurmrestd, rest: SlurmrestdDriver) -> None:
    fake.add_job(11, "gpu-[1-2]")
    fake.nodes["gpu-1"]["state"] = ["MIXED"]
    assert await rest.drain("gpu-1", REASON) is True
    (post,) = fake.calls("POST")
    assert (post.path, post.query, post.body) == (
        "/slurm/v0.0.44/node/gpu-1", {}, {"state": ["DRAIN"], "reason": REASON})
    st = await rest.state("gpu-1")
    assert st.drain
    assert st.busy
    assert not st.drained
    assert st.reason == REASON

    assert await rest.drain("gpu-1", REASON) is True  # already ours: no second POST
    assert len(fake.calls("POST")) == 1

    fake.nodes["gpu-1"]["state"] = ["IDLE", "DRAIN"]
    assert (await rest.state("gpu-1")).drained
    assert await rest.undrain("gpu-1", incident="inc-other") is Undrain.NOT_OURS
    assert await rest.undrain("gpu-1", incident="inc-7f3a") is Undrain.CLEARED
    assert fake.calls("POST")[-1].body == {"state": ["UNDRAIN"]}
    assert not (await rest.state("gpu-1")).drain


async def test_a_foreign_drain_is_kept_and_never_cleared(
        fake: FakeSlurmrestd, rest: SlurmrestdDriver) -> None:
    fake.add_node("gpu-3", ["IDLE", "DRAIN"], reason="slurm-operator: cordoned", user="slurm")
    assert await rest.drain("gpu-3", REASON) is False
    assert await rest.undrain("gpu-3") is Undrain.NOT_OURS
    assert fake.calls("POST") == []
    assert fake.nodes["gpu-3"]["reason"] == "slurm-operator: cordoned"


async def test_signal_uses_flags_and_never_a_bare_delete(
        fake: FakeSlurmrestd, rest: SlurmrestdDriver) -> None:
    fake.add_job(41, "gpu-2")
    fake.add_job(42, "gpu-[2-3]")
    fake.add_job(43, "gpu-2", state="PENDING")
    fake.add_job(44, "gpu-0")
    assert await rest.signal_jobs("gpu-2", "SIGUSR1", batch_only=True) == [41, 42]
    deletes = fake.calls("DELETE")
    assert [(d.path, d.query, d.body) for d in deletes] == [
        ("/slurm/v0.0.44/job/41", {"signal": "USR1", "flags": "BATCH_JOB"}, None),
        ("/slurm/v0.0.44/job/42", {"signal": "USR1", "flags": "BATCH_JOB"}, None),
    ]
    assert await rest.signal_jobs("gpu-3", "USR2") == [42]
    assert fake.calls("DELETE")[-1].query == {"signal": "USR2", "flags": "FULL_JOB"}
    assert fake.kills == []
    assert fake.running_on("gpu-2") == [41, 42]


async def test_the_fake_treats_a_bare_delete_as_a_kill(fake: FakeSlurmrestd) -> None:
    """The contract the driver guards against, shown on the fake itself."""
    fake.add_job(7, "gpu-0")
    async with aiohttp.ClientSession() as s, s.delete(
            f"{fake.url}/slurm/v0.0.44/job/7",
            headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": fake.token}) as r:
        assert r.status == 200
    assert fake.kills == [7]
    assert fake.running_on("gpu-0") == []


async def test_errors_in_a_200_response_are_failures(
        fake: FakeSlurmrestd, rest: SlurmrestdDriver) -> None:
    fake.fail_next(200, 2028, "Invalid node state specified",
                   paths=["/slurm/v0.0.44/node/gpu-0"], method="POST")
    with pytest.raises(PermanentError, match="Invalid node state"):
        await rest.drain("gpu-0", REASON)
    assert len(fake.calls("POST")) == 1  # a refusal is not retried
    with pytest.raises(NotFoundError, match="Invalid node name"):
        await rest.drain("gpu-99", REASON)

    fake.add_job(5, "gpu-1")
    fake.fail_next(200, 2017, "Invalid job id specified", paths=["/slurm/v0.0.44/job/5"])
    assert await rest.signal_jobs("gpu-1", "USR1") == []  # ended meanwhile: skipped

    fake.fail_next(200, 1800, "Unable to contact slurm controller (connect failure)")
    fake.fail_next(200, 1800, "Unable to contact slurm controller (connect failure)")
    fake.fail_next(200, 1800, "Unable to contact slurm controller (connect failure)")
    with pytest.raises(TransientError, match="Unable to contact"):
        await rest.nodes()


async def test_transient_failures_are_retried_for_reads_not_for_writes(
        fake: FakeSlurmrestd, rest: SlurmrestdDriver) -> None:
    await rest.version()
    fake.fail_next(503)
    assert len(await rest.nodes()) == 4  # retried
    assert [r.path for r in fake.calls("GET")] == ["/slurm/v0.0.44/nodes/"] * 2

    fake.add_job(9, "gpu-0")
    fake.fail_next(503, paths=["/slurm/v0.0.44/job/9"])
    with pytest.raises(TransientError, match="503"):
        await rest.signal_jobs("gpu-0", "USR1")
    assert len(fake.calls("DELETE")) == 1  # not resent: the signal may have been delivered
    assert fake.signals == []


async def test_unknown_node_and_bad_token(fake: FakeSlurmrestd, rest: SlurmrestdDriver) -> None:
    with pytest.raises(NotFoundError):
        await rest.state("gpu-99")
    with pytest.raises(PermanentError, match="must start with"):
        await rest.drain("gpu-0", "no prefix")
    async with SlurmrestdDriver(fake.url, StaticToken("wrong")) as bad:
        with pytest.raises(ForbiddenError):
            await bad.version()
