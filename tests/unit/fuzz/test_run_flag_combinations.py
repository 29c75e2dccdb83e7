"""Fuzz: ``healer run`` flag combinations (issue 22 item 8). Every combination is refused at
start with one line and exit 2, or is one that works: generated combinations of the leader
timings, the Slurm driver and its endpoints, the topology source and its request file, and
Prometheus' TLS flags go through :func:`healer.cli.main` with the daemon itself replaced by a
recorder. Accepted leader timings are handed to the leader elector's own configuration check
(kubernetes_asyncio), which must accept them too; an accepted topograph request file is one
:func:`healer.adapters.topograph.load_request` reads.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio.leaderelection import electionconfig

from healer import app, cli
from healer.adapters.topograph import load_request
from healer.settings import Settings

FUZZ = settings(max_examples=300, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])


@contextlib.contextmanager
def _recording() -> Iterator[list[Settings]]:
    seen: list[Settings] = []

    async def run(s: Settings, *a: Any, **k: Any) -> int:
        seen.append(s)
        return 0

    with mock.patch.object(app, "run", run):
        yield seen


def _main(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    return code, err.getvalue()


def _one_line_refusal(argv: list[str], code: int, err: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (argv, err)
    assert len(lines) == 1, (argv, err)
    assert "Traceback" not in err


class _Lock:
    identity = "x"


seconds = st.one_of(st.sampled_from([1, 1.5, 2, 2.4, 2.5, 3, 9.9, 10, 10.5, 15, 60, 600]),
                    st.floats(1, 60).map(lambda x: round(x, 1)))


@FUZZ
@given(duration=seconds, deadline=seconds, retry=seconds, leader=st.booleans())
def test_leader_timings_are_ones_the_elector_accepts_or_one_line(
        duration: float, deadline: float, retry: float, leader: bool) -> None:
    argv = ["run", "--policies", "policies", "--lease-duration", str(duration),
            "--renew-deadline", str(deadline), "--retry-period", str(retry)]
    if not leader:
        argv.append("--no-leader-election")
    with _recording() as seen:
        code, err = _main(argv)
    if code != 0:
        _one_line_refusal(argv, code, err)
        assert leader
        return
    le = seen[-1].leader
    if leader:  # what healer would hand the elector: it must not refuse its own configuration
        electionconfig.Config(_Lock(), math.ceil(le.lease_duration),  # type: ignore[arg-type]
                              le.renew_deadline, le.retry_period, _noop, _noop)


async def _noop() -> None:
    return None


def test_the_examples_of_the_issue_are_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "topograph.json"
    bad.write_text("[1, 2")
    for argv, says in [
        (["run", "--lease-duration", "10", "--renew-deadline", "10"], "--lease-duration"),
        (["run", "--lease-duration", "5", "--renew-deadline", "10"], "never lead"),
        (["run", "--renew-deadline", "2", "--retry-period", "2"], "--retry-period"),
        (["run", "--slurm-driver", "slurmrestd"], "needs --slurmrestd-url"),
        (["run", "--slurmrestd-url", "http://slurm:6820"], "without --slurmrestd-token-secret"),
        (["run", "--topology-source", "topograph", "--topograph-url", "http://t:49021",
          "--topograph-request", str(bad)], "is not JSON"),
        (["run", "--topology-source", "topograph"], "needs --topograph-url"),
        (["run", "--topograph-url", "http://t:49021"], "only with --topology-source"),
        (["run", "--prometheus-insecure-skip-verify"], "without --prometheus-url"),
        (["run", "--prometheus-url", "http://p:9090", "--prometheus-insecure-skip-verify"],
         "has no TLS"),
    ]:
        with _recording() as seen:
            code, err = _main(argv)
        _one_line_refusal(argv, code, err)
        assert says in err, (argv, err)
        assert seen == []


requests = st.one_of(
    st.binary(max_size=200),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                 lambda kids: st.lists(kids, max_size=3)
                 | st.dictionaries(st.sampled_from(["provider", "engine", "name", "params",
                                                    "useDynamicNodes", "nodes"]),
                                   kids, max_size=4),
                 max_leaves=12).map(lambda v: json.dumps(v).encode()))


@FUZZ
@given(body=requests, with_url=st.booleans())
def test_a_topograph_request_is_one_topograph_can_act_on_or_one_line(
        tmp_path: Path, body: bytes, with_url: bool) -> None:
    f = tmp_path / "request.json"
    f.write_bytes(body)
    argv = ["run", "--topology-source", "topograph", "--topograph-request", str(f)]
    if with_url:
        argv += ["--topograph-url", "http://topograph.topograph:49021"]
    with _recording() as seen:
        code, err = _main(argv)
    if code != 0:
        _one_line_refusal(argv, code, err)
        return
    assert with_url
    assert isinstance(load_request(seen[-1].topology.topograph_request), dict)


drivers = st.sampled_from(["slinky", "scontrol", "slurmrestd"])


@FUZZ
@given(driver=drivers, url=st.booleans(), token=st.booleans(), conf=st.booleans(),
       prom=st.sampled_from(["", "http://p:9090", "https://p:9090"]),
       ca=st.booleans(), insecure=st.booleans(), bearer=st.booleans())
def test_slurm_and_prometheus_flags_are_used_or_refused(
        tmp_path: Path, driver: str, url: bool, token: bool, conf: bool, prom: str, ca: bool,
        insecure: bool, bearer: bool) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    argv = ["run", "--slurm-driver", driver]
    argv += ["--slurmrestd-url", "http://slurm:6820"] if url else []
    argv += ["--slurmrestd-token-secret", "slurm/token:auth"] if token else []
    argv += ["--slurm-conf", str(f)] if conf else []
    argv += ["--prometheus-url", prom] if prom else []
    argv += ["--prometheus-ca-file", str(f)] if ca else []
    argv += ["--prometheus-insecure-skip-verify"] if insecure else []
    argv += ["--prometheus-bearer-token-file", str(f)] if bearer else []
    with _recording() as seen:
        code, err = _main(argv)
    if code != 0:
        _one_line_refusal(argv, code, err)
        return
    s = seen[-1]
    # accepted: every flag given is one the chosen configuration reads
    assert url == token
    assert driver != "slurmrestd" or url
    assert not (conf and driver == "slurmrestd")
    assert prom or not (ca or insecure or bearer)
    assert not (ca and insecure)
    assert prom.startswith("https://") or not (ca or insecure)
    assert s.slurm.driver == driver


@pytest.mark.parametrize("flag", ["--renew-deadline", "--retry-period"])
def test_sub_second_leader_timings_are_refused_at_parsing(flag: str) -> None:
    code, err = _main(["run", flag, "0.5"])
    _one_line_refusal(["run", flag, "0.5"], code, err)
    assert "expected seconds from 1" in err
