"""healer_dev.devstack.slurmrestd_shim against a real Slurm 22.05: auth, nodes, updates, jobs,
signals.

Field names follow github.com/SlinkyProject/slurm-client api/v0044 (slurm.gen.go); the Go type
each asserted object decodes into is named in a comment.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import jwt
import pytest

from healer_dev.devstack.net import free_port
from healer_dev.devstack.slurm import LocalSlurm
from healer_dev.devstack.slurmrestd_shim import ShimPortInUse, SlurmrestdShim
from tests.integration.slurm_fixtures import HOLD_SCRIPT, release, wait_for_file

pytestmark = pytest.mark.integration

KEY = b"k" * 64
V = "/slurm/v0.0.44"


def operator_token(key: bytes = KEY, lifetime: int = 900, **extra: Any) -> str:
    """What slurm-operator's slurmjwt.NewToken(...).NewSignedToken() mints."""
    now = int(time.time())
    claims = {"jti": "x", "iss": "slurm-operator", "iat": now, "nbf": now,
              "exp": now + lifetime, "sun": "slurm", **extra}
    return jwt.encode(claims, key, algorithm="HS256")


@pytest.fixture
async def shim(slurm: LocalSlurm) -> AsyncIterator[SlurmrestdShim]:
    async with SlurmrestdShim(slurm.env(), jwt_key=KEY, port=free_port()) as s:
        yield s


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers={"X-SLURM-USER-TOKEN": operator_token(),
                                              "Content-Type": "application/json"}) as s:
        yield s


async def call(http: aiohttp.ClientSession, shim: SlurmrestdShim, method: str, path: str,
               **kw: Any) -> tuple[int, dict[str, Any]]:
    async with http.request(method, shim.url + path, **kw) as r:
        return r.status, await r.json()


def _alg_none() -> str:
    def b64(d: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    return f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64({'sun': 'slurm', 'exp': 2**31})}."


@pytest.mark.parametrize("headers", [
    {},
    {"X-SLURM-USER-TOKEN": operator_token(key=b"w" * 64)},
    {"X-SLURM-USER-TOKEN": operator_token(lifetime=-60)},
    {"X-SLURM-USER-TOKEN": _alg_none()},
    {"X-SLURM-USER-TOKEN": jwt.encode({"exp": 2**31}, KEY, algorithm="HS256")},  # no sun
    {"X-SLURM-USER-TOKEN": jwt.encode({"sun": "slurm"}, KEY, algorithm="HS256")},  # no exp
    {"X-SLURM-USER-TOKEN": jwt.encode({"sun": "slurm", "exp": 2**31}, KEY,
                                      algorithm="HS512")},
    {"X-SLURM-USER-TOKEN": "not-a-jwt", "X-SLURM-USER-NAME": "root"},
    {"X-SLURM-USER-TOKEN": operator_token(sun="alice"), "X-SLURM-USER-NAME": "bob"},
], ids=["none", "wrong-key", "expired", "alg-none", "no-sun", "no-exp", "hs512", "static",
        "impersonation"])
async def test_bad_credentials_get_401_with_an_openapi_error(
        shim: SlurmrestdShim, headers: dict[str, str]) -> None:
    async with aiohttp.ClientSession() as s, s.get(shim.url + f"{V}/nodes/",
                                                    headers=headers) as r:
        assert r.status == 401
        body = await r.json()
    # V0044OpenapiResp.errors: []V0044OpenapiError
    assert body["errors"][0]["error_number"] == 6000
    assert shim.requests[-1].user == ""


async def test_healer_style_headers_are_accepted(shim: SlurmrestdShim) -> None:
    token = jwt.encode({"sun": "root", "exp": int(time.time()) + 60}, KEY, algorithm="HS256")
    async with aiohttp.ClientSession(headers={"X-SLURM-USER-NAME": "root",
                                              "X-SLURM-USER-TOKEN": token}) as s:
        async with s.get(shim.url + "/openapi/v3") as r:
            assert r.status == 200
            assert f"{V}/node/{{node_name}}" in (await r.json())["paths"]
        async with s.get(shim.url + f"{V}/nodes/") as r:
            assert r.status == 200
    assert shim.requests[-1].user == "root"


async def test_nodes_list_and_single_node(shim: SlurmrestdShim,
                                          http: aiohttp.ClientSession) -> None:
    status, body = await call(http, shim, "GET", f"{V}/nodes/", params={"update_time": "0"})
    assert status == 200, body
    # V0044OpenapiNodesResp: nodes, last_update (V0044Uint64NoValStruct)
    assert body["last_update"]["set"] is True
    nodes = {n["name"]: n for n in body["nodes"]}
    assert sorted(nodes) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    n = nodes["gpu-0"]  # V0044Node
    assert n["state"] == ["IDLE"]
    assert n["reason"] == ""
    assert n["comment"] == ""
    assert n["partitions"] == ["gpu"]  # V0044CsvString
    assert n["gres"] == "gpu:h100:8"
    assert n["address"] == "127.0.0.1"
    assert n["hostname"] == "gpu-0"
    assert isinstance(n["cpus"], int)
    assert isinstance(n["real_memory"], int)
    assert n["features"] == []
    assert set(n["boot_time"]) == {"set", "infinite", "number"}

    status, body = await call(http, shim, "GET", f"{V}/node/gpu-2")
    assert status == 200
    assert [x["name"] for x in body["nodes"]] == ["gpu-2"]

    status, body = await call(http, shim, "GET", f"{V}/node/nosuch")
    assert status == 500
    assert body["errors"][0]["error_number"] == 2018


async def test_drain_undrain_comment_and_reason(slurm: LocalSlurm, shim: SlurmrestdShim,
                                                http: aiohttp.ClientSession) -> None:
    reason = "slurm-operator: pod is being deleted"
    status, body = await call(http, shim, "POST", f"{V}/node/gpu-1",
                              json={"state": ["DRAIN"], "reason": reason})
    assert status == 200, body
    st = slurm.node_state("gpu-1")
    assert st.drain
    assert st.reason == reason
    _, body = await call(http, shim, "GET", f"{V}/node/gpu-1")
    node = body["nodes"][0]
    assert node["state"][0] == "IDLE"
    assert "DRAIN" in node["state"]
    assert node["reason"] == reason
    assert node["reason_set_by_user"] == "root"
    assert node["reason_changed_at"]["set"] is True

    status, body = await call(http, shim, "POST", f"{V}/node/gpu-1", json={"state": ["DRAIN"]})
    assert status == 400  # Slurm requires a reason

    comment = json.dumps({"namespace": "slurm", "podName": "gpu-1-0", "node": "kind-w1"},
                         separators=(",", ":"))
    status, body = await call(http, shim, "POST", f"{V}/node/gpu-1", json={"comment": comment})
    assert status == 200, body
    _, body = await call(http, shim, "GET", f"{V}/node/gpu-1")
    assert body["nodes"][0]["comment"] == comment
    assert "DRAIN" in body["nodes"][0]["state"]  # a comment-only update leaves the state

    status, body = await call(http, shim, "POST", f"{V}/node/gpu-1",
                              json={"state": ["UNDRAIN"], "reason": ""})
    assert status == 200, body
    st = slurm.wait_state("gpu-1", lambda s: not s.drain)
    assert st.reason == ""
    assert shim.updates_of("gpu-1") == [("DRAIN", reason), ("UNDRAIN", "")]
    assert shim.comments == [("gpu-1", comment)]

    # topology_str (Slurm 25.05) is kept by the shim and served back; other fields are refused
    status, body = await call(http, shim, "POST", f"{V}/node/gpu-1",
                              json={"topology_str": "default:block1"})
    assert status == 200, body
    status, body = await call(http, shim, "GET", f"{V}/node/gpu-1")
    assert body["nodes"][0]["topology"] == "default:block1"
    status, body = await call(http, shim, "POST", f"{V}/node/gpu-1", json={"weight": 5})
    assert status == 400
    assert "weight" in body["errors"][0]["error"]


async def test_idle_and_resume(slurm: LocalSlurm, shim: SlurmrestdShim,
                               http: aiohttp.ClientSession) -> None:
    await call(http, shim, "POST", f"{V}/node/gpu-3", json={"state": ["DRAIN"], "reason": "x"})
    assert slurm.node_state("gpu-3").drain
    status, body = await call(http, shim, "POST", f"{V}/node/gpu-3", json={"state": ["RESUME"]})
    assert status == 200, body
    slurm.wait_state("gpu-3", lambda s: not s.drain)

    await call(http, shim, "POST", f"{V}/node/gpu-3", json={"state": ["DRAIN"], "reason": "y"})
    status, body = await call(http, shim, "POST", f"{V}/node/gpu-3", json={"state": ["IDLE"]})
    assert status == 200, body
    slurm.wait_state("gpu-3", lambda s: not s.drain and s.registered and s.base == "IDLE",
                     timeout=60)
    assert [s for s, _ in shim.updates_of("gpu-3")] == ["DRAIN", "RESUME", "DRAIN", "IDLE"]


async def test_jobs_and_signal(slurm: LocalSlurm, shim: SlurmrestdShim,
                               http: aiohttp.ClientSession) -> None:
    job = slurm.submit(HOLD_SCRIPT, "gpu-2", name="train")
    slurm.wait_job(job, ["RUNNING"])
    t0 = int(time.time())
    status, body = await call(http, shim, "GET", f"{V}/jobs/")
    assert status == 200, body
    # V0044OpenapiJobInfoResp: jobs []V0044JobInfo, last_backfill, last_update
    assert body["last_update"]["set"] is True
    (j,) = [x for x in body["jobs"] if x["job_id"] == job]
    assert j["job_state"] == ["RUNNING"]
    assert j["nodes"] == "gpu-2"
    assert j["name"] == "train"
    assert j["user_name"] == "root"
    assert j["user_id"] == 0
    assert j["batch_flag"] is True
    start = j["start_time"]  # V0044Uint64NoValStruct
    assert start["set"] is True
    assert start["infinite"] is False
    assert abs(start["number"] - t0) < 120
    assert set(j["time_limit"]) == {"set", "infinite", "number"}  # V0044Uint32NoValStruct
    assert j["time_limit"]["set"] is True
    assert j["time_limit"]["infinite"] or j["time_limit"]["number"] > 0

    # the operator's GetNodes on a node with a job: MIXED or ALLOCATED
    _, body = await call(http, shim, "GET", f"{V}/node/gpu-2")
    assert body["nodes"][0]["state"][0] in ("MIXED", "ALLOCATED")
    status, body = await call(http, shim, "POST", f"{V}/node/gpu-2", json={"state": ["IDLE"]})
    assert status == 500  # Slurm 22.05 refuses IDLE on a node with jobs
    assert body["errors"][0]["error_number"] == 2028

    status, body = await call(http, shim, "DELETE", f"{V}/job/{job}",
                              params={"signal": "USR1", "flags": "BATCH_JOB"})
    assert status == 200, body
    assert body["status"][0]["job_id"]["number"] == job
    assert "USR1" in wait_for_file(slurm.jobdir / f"usr1-{job}")
    assert shim.signals == [(job, "USR1", "BATCH_JOB")]
    assert shim.kills == []
    release(slurm, job)


async def test_port_in_use_is_a_clear_error(slurm: LocalSlurm,
                                            shim: SlurmrestdShim) -> None:
    port = int(shim.url.rsplit(":", 1)[1])
    other = SlurmrestdShim(slurm.env(), jwt_key=KEY, port=port)
    with pytest.raises(ShimPortInUse, match=str(port)):
        await other.start()
    await other.close()
