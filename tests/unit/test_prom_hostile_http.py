"""Hostile answers over real HTTP, the drop counter, and ``healer backtest``'s bounds and token.

A tiny aiohttp server (in its own thread and loop) plays Prometheus: it answers what each test
tells it and records every request (method, path, ``Authorization``). Through
:meth:`PrometheusSource.poll_once` (the daemon's path): an HTML error page, a wrong content
type, a truncated body, a body over the size limit and non-JSON never raise out of the poll,
are counted as ``bad-answer``, and the source only ever sends GETs. Through the offline
tools' client (:class:`~healer.adapters.prometheus.offline.OfflineClient`, prometheus-api-client:
the backtest's path): the same bodies are each a ``BadAnswer``, statuses map to the same errors,
the library never retries by itself, a body over the limit is refused while it is read.
``healer backtest``: absurd ranges fail at once with one line and exit 2; ``--bearer-token-file``
is sent with every query, history included; a missing, empty or unreadable token file is one
line; an answer that is no API answer is one line and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import generate_latest

from healer.adapters.prometheus import PrometheusSource
from healer.adapters.prometheus.access import Access, check_url, read_bearer_token
from healer.adapters.prometheus.http import BadAnswer, decode_result
from healer.adapters.prometheus.offline import OfflineClient
from healer.backtest.cli import add_backtest_flags, cmd_backtest
from healer.backtest.inputs import check_range
from healer.core.model import Severity, SignalKind
from healer.core.rules import LabelSelector as Sel
from healer.core.rules import MetricRule, Op, Policy, PolicySet
from healer.errors import (
    ConfigError,
    ForbiddenError,
    HealerError,
    NotFoundError,
    PermanentError,
    TransientError,
)
from healer.obs.metrics import Metrics, StateSource

ROOT = Path(__file__).resolve().parents[2]
TEMP = "DCGM_FI_DEV_GPU_TEMP"
EMPTY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


@dataclass
class Reply:
    body: bytes = EMPTY
    status: int = 200
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class FakeProm:
    """Answers every request with ``reply(request)``; records (method, path, auth)."""

    reply: Callable[[web.Request], Reply] = lambda _r: Reply()
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path,
                          request.headers.get("Authorization", "")))
        r = self.reply(request)
        return web.Response(body=r.body, status=r.status,
                            headers={"Content-Type": r.content_type, **r.headers})


@pytest.fixture
def prom() -> Iterator[FakeProm]:
    fake = FakeProm()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    runner: list[web.AppRunner] = []

    async def start() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", fake.handle)
        r = web.AppRunner(app, access_log=None)
        await r.setup()
        site = web.TCPSite(r, "127.0.0.1", 0)
        await site.start()
        port = r.addresses[0][1]
        fake.url = f"http://127.0.0.1:{port}"
        runner.append(r)
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    assert started.wait(30)
    try:
        yield fake
    finally:
        asyncio.run_coroutine_threadsafe(runner[0].cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


def source(url: str, **kw: Any) -> PrometheusSource:
    rule = MetricRule("hot", Severity.DEGRADING, TEMP, Op.GE, 90.0)
    return PrometheusSource(url, PolicySet((Policy("p", Sel(), (rule,)),)), retries=0,
                            timeout=10, **kw)


HOSTILE = {
    "html page": Reply(b"<html><body><h1>502 Bad Gateway</h1></body></html>", 200, "text/html"),
    "json as text/html": Reply(EMPTY, 200, "text/html; charset=utf-8"),
    "truncated": Reply(EMPTY[:-9]),
    "not json": Reply(b"\x00\x01binary"),
    "json list": Reply(b"[1, 2, 3]"),
    "status error": Reply(b'{"status":"error","errorType":"bad_data","error":"boom"}'),
    "result a string": Reply(b'{"status":"success","data":{"result":"x"}}'),
    "too deep": Reply(b"[" * 50_000 + b"]" * 50_000),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_bodies_through_poll_once(prom: FakeProm, name: str) -> None:
    prom.reply = lambda _r: HOSTILE[name]
    src = source(prom.url)
    try:
        sigs = asyncio.run(src.poll_once())
        assert all(s.kind is SignalKind.STALE for s in sigs)  # nothing known: nothing fresh
        assert src.last_poll is not None
        assert src.last_poll.outage  # the freshness answer was unusable
        assert src.drops.counts[("heartbeat", "bad-answer")] == 1
        assert {m for m, _, _ in prom.seen} == {"GET"}  # reads only, never a write
    finally:
        src.close()


def test_a_bad_metric_answer_fails_that_query_only(prom: FakeProm) -> None:
    fresh = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"Hostname": "a", "instance": "a:9400", "healer_fresh": "newest"},
         "value": [0, str(time.time() - 1)]},
        {"metric": {"Hostname": "a", "instance": "a:9400", "healer_fresh": "gpus"},
         "value": [0, "0"]}]}}).encode()

    def reply(r: web.Request) -> Reply:
        q = r.query.get("query", "")
        if "healer_fresh" in q:
            return Reply(fresh)
        if q.startswith("max by") and "timestamp(" in q:  # per-GPU rows
            return Reply(EMPTY)
        return HOSTILE["html page"]

    prom.reply = reply
    src = source(prom.url)
    try:
        asyncio.run(src.poll_once())
        assert src.last_poll is not None
        assert not src.last_poll.outage
        assert src.last_poll.failed_queries == 1
        assert src.drops.counts == {(TEMP, "bad-answer"): 1}
    finally:
        src.close()


def test_a_body_over_the_limit_is_refused_in_chunks(prom: FakeProm) -> None:
    prom.reply = lambda _r: Reply(b'{"status":"success","data":{"result":[' + b" " * (3 << 20)
                                  + b"]}}")
    src = source(prom.url)
    src._http.max_body = 1 << 20
    try:
        asyncio.run(src.poll_once())
        assert src.last_poll is not None
        assert src.last_poll.outage
        assert any("larger than 1 MiB" in e for e in src.last_poll.errors)
    finally:
        src.close()


# -- the offline tools' client (prometheus-api-client) ------------------------------------------


def offline(url: str, **kw: Any) -> OfflineClient:
    return OfflineClient(Access(url, 10.0), **kw)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_bodies_through_the_offline_client(prom: FakeProm, name: str) -> None:
    prom.reply = lambda _r: HOSTILE[name]
    client = offline(prom.url)
    try:
        with pytest.raises(BadAnswer, match=r"query_range x: .*(not JSON|malformed)"):
            client.query_range("up", 0, 60, 15, "query_range x")
        with pytest.raises(BadAnswer):
            client.query("up", 60, "query x")
    finally:
        client.close()
    assert {m for m, _, _ in prom.seen} == {"GET"}
    assert {p for _, p, _ in prom.seen} == {"/api/v1/query_range", "/api/v1/query"}


@pytest.mark.parametrize(("status", "error", "delay"), [
    (503, TransientError, 7.0), (429, TransientError, 7.0), (408, TransientError, 7.0),
    (500, TransientError, 7.0), (401, ForbiddenError, None), (403, ForbiddenError, None),
    (404, NotFoundError, None), (400, PermanentError, None), (422, PermanentError, None),
])
def test_offline_client_maps_statuses_and_never_retries_itself(
        prom: FakeProm, status: int, error: type[HealerError], delay: float | None) -> None:
    prom.reply = lambda _r: Reply(b'{"status":"error","error":"no"}', status,
                                  headers={"Retry-After": "7"})
    client = offline(prom.url)
    try:
        with pytest.raises(error, match=f"q: HTTP {status}: .*no") as got:
            client.query_range("up", 0, 60, 15, "q")
    finally:
        client.close()
    assert type(got.value) is error
    if delay is not None:
        assert isinstance(got.value, TransientError)
        assert got.value.delay == delay
    assert len(prom.seen) == 1  # healer's retry policy retries, never the library


def test_offline_client_refuses_a_body_over_the_limit_while_reading(prom: FakeProm) -> None:
    prom.reply = lambda _r: Reply(b'{"status":"success","data":{"result":[' + b" " * (3 << 20)
                                  + b"]}}")
    client = offline(prom.url, max_body=1 << 20)
    try:
        with pytest.raises(BadAnswer, match="larger than 1 MiB"):
            client.query_range("up", 0, 60, 15, "q")
    finally:
        client.close()


def test_offline_client_reads_an_answer_and_sends_what_the_daemon_sent(
        prom: FakeProm, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    queries: list[dict[str, str]] = []

    def reply(r: web.Request) -> Reply:
        queries.append(dict(r.query))
        return Reply(b'{"status":"success","data":{"resultType":"matrix","result":['
                     b'{"metric":{"a":"b"},"values":[[60,"1"],[75,NaN]]}]}}')

    prom.reply = reply
    client = OfflineClient(Access(prom.url, 10.0, {"X-Scope-OrgID": "t"},
                                  bearer_token_file=str(token)))
    try:
        got = client.query_range("up", 59.6, 120.2, 15, "q")
        token.write_text("two\n")  # rotated: read again before the next query
        client.query("up", 90.5, "q")
    finally:
        client.close()
    assert got[0]["metric"] == {"a": "b"}
    assert got[0]["values"][0] == [60, "1"]
    assert math.isnan(got[0]["values"][1][1])  # a bare NaN: dropped later with its sample
    assert queries == [{"query": "up", "start": "60", "end": "120", "step": "15"},
                       {"query": "up", "time": "90.500"}]
    assert [a for _, _, a in prom.seen] == ["Bearer one", "Bearer two"]


def test_offline_client_connection_errors_are_transient() -> None:
    client = offline("http://127.0.0.1:9")
    try:
        with pytest.raises(TransientError, match=r"q: cannot connect to http://127\.0\.0\.1:9"):
            client.query("up", 1, "q")
    finally:
        client.close()


def test_a_backtest_reading_no_api_answer_is_one_line(prom: FakeProm,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    prom.reply = lambda _r: HOSTILE["html page"]
    assert _backtest(prom.url, "--from", "now-2h") == 2
    err = capsys.readouterr().err
    assert "not JSON" in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_bare_nan_and_infinity_drop_their_samples_not_the_answer() -> None:
    got = decode_result(b'{"status":"success","data":{"result":[{"value":[1,NaN]},'
                        b'{"value":[1,Infinity]},{"value":[1,-Infinity]}]}}', "q", "u")
    assert [e["value"][1] for e in got] == ["NaN", "+Inf", "-Inf"]
    with pytest.raises(BadAnswer):
        decode_result(b'{"status":"success","data":{"result":[1,', "q", "u")


def test_drops_are_exported_by_source_metric_and_reason() -> None:
    m = Metrics()
    m.attach_state(StateSource(dropped=lambda: {("dcgm", "xid", "inf"): 2,
                                                ("dcgm", TEMP, "bad-answer"): 1}))
    text = generate_latest(m.registry).decode()
    assert ('healer_telemetry_samples_dropped_total{metric="xid",reason="inf",source="dcgm"} '
            '2.0') in text
    assert (f'healer_telemetry_samples_dropped_total{{metric="{TEMP}",reason="bad-answer",'
            f'source="dcgm"}} 1.0') in text


@pytest.mark.parametrize(("url", "message"), [
    ("ftp://p:9090", "http:// or https://"), ("http://", "no host"),
    ("http://p:99999", "out of range"), ("http://p:9090/\r\nX: y", "control"),
    ("http://p:port", "Port"),
])
def test_bad_prometheus_urls_are_one_line(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_url(url)


def test_bearer_token_file_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(PermanentError, match="no such file"):
        read_bearer_token(tmp_path / "missing")
    with pytest.raises(PermanentError, match="not a regular file"):
        read_bearer_token(tmp_path)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(PermanentError, match="no usable token"):
        read_bearer_token(tmp_path / "empty")
    (tmp_path / "two").write_text("a\nb\n")
    with pytest.raises(PermanentError, match="no usable token"):
        read_bearer_token(tmp_path / "two")
    (tmp_path / "ok").write_text("s3cret\n")
    assert read_bearer_token(tmp_path / "ok") == "s3cret"


# -- healer backtest ---------------------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_backtest_flags(p)
    return p.parse_args(list(argv))


def _backtest(url: str, *argv: str) -> int:
    return cmd_backtest(_args("--prometheus", url, "--policies",
                              str(ROOT / "policies" / "default.yaml"), *argv),
                        out=lambda _t: None)


@pytest.mark.parametrize(("argv", "message"), [
    # the duration parser may refuse these first (it bounds durations): either way, one line
    (["--from", "now-99999999999d"], "before 1970|at most"),
    (["--from", "now-" + "9" * 400 + "d"], "not a finite time|at most"),
    (["--from", "now-401d"], "at most"),
    (["--from", "1" + "0" * 400], "not a finite time"),
    (["--from", "1969-12-31T00:00:00Z"], "before 1970"),
    (["--from", "2025-01-01T00:00:00Z", "--to", "2026-03-01T00:00:00Z"], "at most 400 days"),
    (["--from", "now+2d", "--to", "now+3d"], "in the future"),
    (["--from", "now-30d", "--step", "1s"], "use a larger --step"),
    (["--from", "now-1h", "--step", "0.5s"], "at least 1s"),
    (["--from", "now-1h", "--spares", "-1"], "--spares"),
    (["--from", "now-1h", "--ca-file", "/nonexistent/ca.pem"], "the CA file .* no such file"),
    (["--from", "now-1h", "--ca-file", "/"], "not a regular file"),
])
def test_absurd_ranges_fail_at_once_with_one_line(argv: list[str], message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # nothing listens on port 9: the range must be refused before any query
    assert _backtest("http://127.0.0.1:9", *argv) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_check_range_accepts_a_week() -> None:
    now = time.time()
    check_range(now - 7 * 86400, now, 60.0, now)


def test_bearer_token_is_sent_with_every_history_query(prom: FakeProm, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    prom.reply = lambda r: Reply(EMPTY.replace(b"vector", b"matrix")) \
        if r.headers.get("Authorization") == "Bearer s3cret" \
        else Reply(b'{"status":"error","error":"unauthorized"}', 401)
    assert _backtest(prom.url, "--from", "now-2h", "--bearer-token-file", str(token)) == 0
    paths = {p for _, p, _ in prom.seen}
    assert paths == {"/api/v1/query", "/api/v1/query_range"}  # history: both kinds
    assert all(a == "Bearer s3cret" for _, _, a in prom.seen)
    assert {m for m, _, _ in prom.seen} == {"GET"}
    capsys.readouterr()
    token.write_text("wrong\n")
    prom.seen.clear()
    assert _backtest(prom.url, "--from", "now-2h", "--bearer-token-file", str(token)) == 2
    err = capsys.readouterr().err
    assert "HTTP 401" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("content", [None, "", "a\nb"])
def test_unusable_token_file_is_one_line_before_any_query(
        prom: FakeProm, tmp_path: Path, content: str | None,
        capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    if content is not None:
        token.write_text(content)
    assert _backtest(prom.url, "--from", "now-2h", "--bearer-token-file", str(token)) == 2
    err = capsys.readouterr().err
    assert "bearer token file" in err
    assert err.count("\n") == 1
    assert prom.seen == []


def test_hostile_history_is_dropped_not_fatal(prom: FakeProm,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Range answers full of NaN, ±Inf, impossible XIDs, stamps outside the range and wrong
    shapes: the backtest reads the rest and reports (exit 0), nothing raises."""
    now = time.time()
    lb = {"Hostname": "a", "instance": "a:9400", "gpu": "0", "UUID": "GPU-a-0"}
    bad_points = [[now - 600, "NaN"], [now - 540, "+Inf"], [1e300, "1"], ["x", "1"],
                  [now - 480, None], [now - 420, "abc"], "junk", [now - 360]]

    def reply(r: web.Request) -> Reply:
        q = r.query.get("query", "")
        if "XID" in q:
            result: list[Any] = [
                {"metric": {**lb, "__name__": "DCGM_FI_DEV_XID_ERRORS"},
                 "values": [*bad_points, [now - 300, "1e300"], [now - 240, "-79"]]},
                {"metric": {**lb, "__name__": "DCGM_EXP_XID_ERRORS_COUNT", "xid": "99999"},
                 "values": [[now - 300, "5"]]}, None, [1, 2]]
        else:
            result = [{"metric": {**lb, "instance": ["unhashable"]}, "values": bad_points},
                      {"metric": lb, "values": [*bad_points, [now - 300, "1e9"]]},
                      {"metric": None}, "x", 7]
        return Reply(json.dumps({"status": "success",
                                 "data": {"resultType": "matrix", "result": result}}).encode())

    prom.reply = reply
    assert _backtest(prom.url, "--from", "now-1h") == 0
    assert "Traceback" not in capsys.readouterr().err


def test_drop_series_exist_before_the_first_drop() -> None:
    src = source("http://127.0.0.1:1")
    try:
        series = src.drops.series()
        assert series[("heartbeat", "bad-answer")] == 0
        assert series[("xid", "inf")] == 0
        src.drops.add("xid", "inf", 3)
        assert src.drops.series()[("xid", "inf")] == 3
    finally:
        src.close()


def test_a_host_label_longer_than_any_node_name_names_no_node() -> None:
    from healer.adapters.prometheus.labels import node_name

    assert node_name({"Hostname": "n" * 253}) == "n" * 253
    assert node_name({"Hostname": "n" * 254}) is None
    assert node_name({"Hostname": "n" * 254, "hostname": "short"}) == "short"
