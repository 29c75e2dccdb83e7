"""Fuzz: hostile command lines for every ``healer`` subcommand never crash, hang or write.

Three parts, all through :func:`healer.cli.main` in-process:

* a hand-written corpus of the hostile inputs issue 12 names (NaN/inf/negative durations, ports
  and hosts out of range, URLs without a host or with CR/LF, missing, binary, recursive and
  wrong-shaped kubeconfigs and policies, absurd time ranges), run end to end: ``status``,
  ``run`` and ``backtest`` talk to a loopback server that answers 404 to everything and records
  every request (the Kubernetes API and Prometheus as far as they are concerned), so no
  request may be a write; commands that would start something long-running (``agent``,
  ``docs``, and the development CLI's ``demo``, ``bench``, ``devstack``: ``python -m
  healer_dev``, :func:`healer_dev.cli.main`) are fuzzed at argument parsing only;
* hypothesis over argv for every subcommand, at argument parsing: a value is either rejected
  with one line and exit 2, or accepted and sane (finite, in range, a URL with a host...);
* hypothesis over kubeconfig contents, end to end through ``healer status``.

Every case runs under an internal budget (a worker thread joined with a deadline), so a hang
fails with the example instead of the suite's timeout; every failure must be one line on
stderr (one per problem for invalid policies), a non-zero exit and no traceback; the working
directory must be left as it was.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healer import cli
from healer_dev import cli as dev_cli

ROOT = Path(__file__).resolve().parents[3]
POLICIES = str(ROOT / "policies" / "default.yaml")
BUDGET = 60.0  # seconds one command may take (the slowest: retries against a refusing server)
HOSTILE = ["nan", "NaN", "-nan", "inf", "-inf", "+inf", "1e309", "-1e309", "-1", "-0.0001",
           "0", "1e-300", "99999999999999999999999", "0x10", "1_000", " 5", "5 ", "",
           " ", "\t", "१२", "½", "1e3", "3600.0001", "-", "--", "5s", "10m",
           "http://", "https://", "https://:80", "ftp://h", "http://h:99999", "http://h:0",
           "http://a b", "http://h\r\nX: y", "http://h/\x00", "//h", "h:80", "http://[::1",
           "http://999.1.1.1", "javascript:alert(1)", "/dev/zero", "/nonexistent", "/",
           "/proc/self/mem", "a" * 5000, "\u202e", "☃", "$(POD_IP)", "${HOME}", "~",
           "../../etc/passwd", "Not_A_Name", "ns/", "/name", "ns/name:", "ns/name:k:k"]
DEV_COMMANDS = ("demo", "bench", "devstack")  # python -m healer_dev


# -- the budget, the output and the working directory -------------------------------------------


def _run(argv: Sequence[str]) -> tuple[int, str, str]:
    """``main(argv)`` in a worker thread under :data:`BUDGET`: (exit code, stdout, stderr);
    the development commands go to the development CLI's ``main``."""
    main = dev_cli.main if argv and argv[0] in DEV_COMMANDS else cli.main
    out, err = io.StringIO(), io.StringIO()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["code"] = main(list(argv))
        except BaseException as e:  # a failure of main() itself: reported below
            box["escaped"] = e

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        t = threading.Thread(target=target, name="healer-main", daemon=True)
        t.start()
        t.join(BUDGET)
    assert not t.is_alive(), f"healer {list(argv)!r} hung (over {BUDGET:g} s)"
    if "escaped" in box:
        raise AssertionError(f"healer {list(argv)!r} raised {box['escaped']!r}")
    return int(box["code"]), out.getvalue(), err.getvalue()


def _clean_failure(argv: Sequence[str], code: int, err: str, *, lines: int = 1) -> None:
    text = [line for line in err.splitlines() if line.strip()]
    assert code != 0, (argv, err)
    assert "Traceback" not in err, (argv, err)
    assert 1 <= len(text) <= lines, (argv, err)


@contextlib.contextmanager
def _parse_only() -> Iterator[list[Any]]:
    """Commands parse their flags and stop there: ``fn`` becomes a recorder."""
    seen: list[Any] = []
    real = cli.Parser.parse_args

    def parse_args(self: cli.Parser, *a: Any, **k: Any) -> Any:
        ns = real(self, *a, **k)
        ns.fn = lambda args: seen.append(args) or 0
        return ns

    with mock.patch.object(cli.Parser, "parse_args", parse_args):
        yield seen


def _listing(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


# -- a loopback server that answers 404 to everything and records every request ----------------


class Recorder:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.url = ""
        self._ready = threading.Event()
        self._stop: Any = None
        self.thread = threading.Thread(target=self._serve, name="recorder", daemon=True)

    def _serve(self) -> None:
        import asyncio

        async def main() -> None:
            async def any_request(request: web.Request) -> web.Response:
                self.requests.append((request.method, request.path))
                return web.json_response({"kind": "Status", "code": 404, "message": "nothing "
                                          "here"}, status=404)

            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", any_request)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(main())
        self._loop.close()

    def __enter__(self) -> Recorder:
        self.thread.start()
        assert self._ready.wait(30), "the recording server did not start"
        return self

    def __exit__(self, *_: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(30)

    def writes(self) -> list[tuple[str, str]]:
        return [r for r in self.requests if r[0] not in ("GET", "HEAD")]


@pytest.fixture(scope="module")
def recorder() -> Iterator[Recorder]:
    with Recorder() as r:
        yield r


def _kubeconfig(d: Path, server: str) -> str:
    f = d / "kubeconfig-ok"
    f.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return str(f)


# -- the corpus, end to end ------------------------------------------------------------------


def _files(d: Path) -> dict[str, str]:
    """Hostile files: kubeconfigs and policies alike."""
    out = {}
    for name, data in {
        "recursive.yaml": b"a: &a [*a]\n",
        "laughs.yaml": b"a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + b"".join(
            f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n".encode()
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)),
        "deep.yaml": b"[" * 5000 + b"]" * 5000,
        "binary.yaml": bytes(range(256)) * 4,
        "empty.yaml": b"",
        "list.yaml": b"- 1\n- 2\n",
        "wrong-shape.yaml": b"apiVersion: v1\nclusters: {a: 1}\ncontexts: 5\n",
        "no-context.yaml": b"apiVersion: v1\nclusters: []\ncontexts: []\nusers: []\n"
                           b"current-context: gone\n",
        "bad-server.yaml": b"apiVersion: v1\nclusters: [{name: c, cluster: {server: "
                           b"'ftp://x'}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: x, "
                           b"context: {cluster: c, user: u}}]\ncurrent-context: x\n",
        "nines.yaml": b"apiVersion: healer.io/v1alpha1\nkind: RemediationPolicy\nmetadata: "
                      b"{name: p}\nspec:\n  steps: {pollInterval: " + b"9" * 400 + b"s}\n",
    }.items():
        (d / name).write_bytes(data)
        out[name] = str(d / name)
    os.mkfifo(d / "fifo.yaml")
    out["fifo.yaml"] = str(d / "fifo.yaml")
    out["dir"] = str(d)
    out["missing"] = str(d / "missing.yaml")
    return out


KUBECONFIGS = ["recursive.yaml", "laughs.yaml", "deep.yaml", "binary.yaml", "empty.yaml",
               "list.yaml", "wrong-shape.yaml", "no-context.yaml", "bad-server.yaml",
               "fifo.yaml", "dir", "missing"]
POLICY_FILES = ["recursive.yaml", "laughs.yaml", "deep.yaml", "binary.yaml", "empty.yaml",
                "nines.yaml", "fifo.yaml", "dir", "missing"]


def _corpus(d: Path, f: dict[str, str], server: str) -> list[tuple[list[str], int]]:
    """(argv, how many stderr lines a clean failure may have)."""
    kc = _kubeconfig(d, server)
    run = ["run", "--kubeconfig", kc, "--policies", POLICIES, "--no-leader-election",
           "--http-host", "127.0.0.1", "--http-port", "0", "--log-format", "json"]
    bt = ["backtest", "--prometheus", server, "--policies", POLICIES]
    cases: list[tuple[list[str], int]] = [(run, 1), (["status", "--kubeconfig", kc], 1)]
    for k in KUBECONFIGS:
        cases.append((["status", "--kubeconfig", f[k]], 1))
        cases.append(([*run[:2], f[k], *run[3:]], 1))
    for p in POLICY_FILES:  # run: one log line; validate and backtest: one line per problem
        cases.append(([*run[:4], f[p], *run[5:]], 1))
        cases.append((["validate", f[p]], 60))
        cases.append((["backtest", "--prometheus", server, "--policies", f[p], "--from",
                       "now-1h"], 60))
    for flag in ("--poll-interval", "--lease-duration", "--retry-period", "--shutdown-grace",
                 "--policy-reload-interval", "--policy-load-timeout"):
        for v in ("nan", "inf", "-1", "1e309"):
            cases.append(([*run, f"{flag}={v}"], 1))
    for flag, vals in {"--http-port": ["-1", "65536", "1e3", "http"],
                       "--http-host": ["999.1.1.1", "a b", "", "-x"],
                       "--prometheus-url": ["https://", "http://h\r\nX: y", "ftp://h",
                                            "http://h:99999"],
                       "--callback-url": ["http://", "http://a b"],
                       "--slurmrestd-url": ["https://:1"],
                       "--prometheus-ca-file": [f["missing"], f["dir"], f["fifo.yaml"]],
                       "--policy-load-memory": ["0", "-5", "nan"]}.items():
        for v in vals:
            cases.append(([*run, f"{flag}={v}"], 1))
    for frm in ("now-99999999999d", "yesterday", "nan", "now+1d", "", "1e309", "-1"):
        cases.append(([*bt, "--from", frm], 1))
    for extra in (["--step", "nan"], ["--step", "0s"], ["--step", "-5s"], ["--to", "nan"],
                  ["--spares", "-1"], ["--action-latency", "inf"], ["--repair-after", "-1s"],
                  ["--ca-file", f["missing"]], ["--bearer-token-file", f["fifo.yaml"]],
                  ["--kubeconfig", f["recursive.yaml"]]):
        cases.append(([*bt, "--from", "now-1h", *extra], 1))
    for bad in ("https://", "http://h\r\n", "ftp://x", "http://h:99999", "not a url"):
        cases.append((["backtest", "--prometheus", bad, "--policies", POLICIES, "--from",
                       "now-1h"], 1))
    for code in ("-1", "nan", "99999999999999999999", "x"):
        cases.append((["xid", code], 1))
    for s in (f["recursive.yaml"], f["binary.yaml"], f["missing"], f["dir"], f["laughs.yaml"]):
        cases.append((["simulate", s], 60))
    return cases


def test_the_corpus_fails_cleanly_end_to_end_and_writes_nothing(
        tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    f = _files(tmp_path)
    cases = _corpus(tmp_path, f, recorder.url)
    before = _listing(tmp_path)
    for argv, lines in cases:
        code, _, err = _run(argv)
        _clean_failure(argv, code, err, lines=lines)
    assert _listing(tmp_path) == before  # nothing written where it ran
    assert ("GET", "/apis/healer.io/v1alpha1/noderemediations") in recorder.requests
    assert recorder.writes() == []  # and nothing written to the "API server"
    print(f"{len(cases)} corpus command lines, none crashed, hung or wrote")


PARSE_ONLY = [
    ["demo", "--scenario", "{v}"], ["demo", "--operator-version", "{v}"],
    ["bench", "--repeats", "{v}"], ["bench", "--nodes", "{v}"], ["bench", "--seed", "{v}"],
    ["bench", "--long-polls", "{v}"], ["devstack", "up", "--timeout={v}"],
    ["agent", "--interval={v}"], ["agent", "--heartbeat={v}"], ["agent", "--api-timeout={v}"],
    ["agent", "--event-window={v}"], ["agent", "--http-port={v}"],
    ["agent", "--http-host={v}"], ["agent", "--nvml-wait-ms={v}"], ["docs", "{v}"],
]


def test_long_running_commands_reject_hostile_flags_at_parsing() -> None:
    n = 0
    with _parse_only() as seen:
        for template in PARSE_ONLY:
            for v in HOSTILE:
                argv = [a.replace("{v}", v) for a in template]
                code, _, err = _run(argv)
                n += 1
                if code == 0:
                    _check_sane(seen.pop())
                else:
                    _clean_failure(argv, code, err)
    print(f"{n} parse-only command lines, none crashed or hung")


# -- hypothesis: argv at parsing, every subcommand ----------------------------------------------

SECONDS = {"--poll-interval": (0.1, 3600), "--lease-duration": (1, 3600),
           "--renew-deadline": (1, 3600), "--retry-period": (1, 600),
           "--shutdown-grace": (0, 3600), "--policy-reload-interval": (0.1, 86400),
           "--policy-load-timeout": (1, 3600), "--interval": (0.1, 3600),
           "--heartbeat": (1, 3600), "--api-timeout": (0.1, 600),
           "--event-window": (1, 30 * 86400), "--timeout": (1, 3600)}
INTS = {"--http-port": (0, 65535), "--policy-load-memory": (64, 1 << 20),
        "--repeats": (1, 1000), "--nodes": (1, 100_000), "--long-polls": (1, 1_000_000),
        "--seed": (0, 2**32 - 1), "--nvml-wait-ms": (1, 60_000)}
URLS = ("--prometheus-url", "--slurmrestd-url", "--topograph-url", "--callback-url")
FLAGS = {
    "run": [*list(SECONDS)[:7], "--http-port", "--policy-load-memory", "--http-host", *URLS,
            "--namespace", "--slurm-namespace", "--nodeset", "--lease-name",
            "--slurmrestd-token-secret", "--host-label", "--log-level", "--identity"],
    "agent": ["--interval", "--heartbeat", "--api-timeout", "--event-window", "--http-port",
              "--http-host", "--nvml-wait-ms"],
    "bench": ["--repeats", "--nodes", "--long-polls", "--seed"],
    "xid": [],
    "demo": ["--scenario", "--operator-version"],
}
DEST = {"--poll-interval": "poll_interval", "--host-label": "host_labels"}


def _dest(flag: str) -> str:
    return DEST.get(flag, flag.lstrip("-").replace("-", "_"))


def _check_sane(args: Any) -> None:
    """What an accepted value may be: no NaN, no infinity, nothing out of range."""
    for flag, (lo, hi) in {**SECONDS, **INTS}.items():
        v = getattr(args, _dest(flag), None)
        if v is not None:
            assert math.isfinite(v), (flag, v)
            assert lo <= v <= hi, (flag, v)
    for flag in URLS:
        v = getattr(args, _dest(flag), "") or ""
        if v:
            parts = urlsplit(v)
            assert parts.scheme in ("http", "https"), v
            assert parts.hostname, v
            assert not any(c.isspace() or ord(c) < 32 for c in v), v
    host = getattr(args, "http_host", None)
    if host is not None:
        assert host, host
        assert not any(c in host for c in " /\r\n"), host


values = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=40),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.integers(-(2**70), 2**70).map(str))


@st.composite
def argvs(draw: st.DrawFn) -> list[str]:
    cmd = draw(st.sampled_from(sorted(FLAGS)))
    if cmd == "xid":
        return ["xid", "--", draw(values)]
    flags = draw(st.lists(st.sampled_from(FLAGS[cmd]), min_size=1, max_size=3))
    return [cmd, *(f"{f}={draw(values)}" for f in flags)]


@settings(max_examples=400, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(argv=argvs())
def test_any_flag_value_is_rejected_in_one_line_or_sane(argv: list[str]) -> None:
    with _parse_only() as seen:
        code, _, err = _run(argv)
    if code == 0:
        _check_sane(seen[-1])
    else:
        assert code == 2, (argv, err)
        _clean_failure(argv, code, err)


# -- hypothesis: kubeconfig contents, end to end through `healer status` ------------------------

kubeconfig_text = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=300).map(str.encode),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                 lambda kids: st.lists(kids, max_size=4)
                 | st.dictionaries(st.sampled_from(["apiVersion", "clusters", "contexts",
                                                    "users", "current-context", "name",
                                                    "cluster", "context", "user", "server"]),
                                   kids, max_size=5),
                 max_leaves=20).map(lambda v: repr(v).encode()),
)


@settings(max_examples=150, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(content=kubeconfig_text)
def test_any_kubeconfig_fails_status_in_one_line(tmp_path: Path, content: bytes) -> None:
    f = tmp_path / "kubeconfig"
    f.write_bytes(content)
    argv = ["status", "--kubeconfig", str(f)]
    code, _, err = _run(argv)
    _clean_failure(argv, code, err)
