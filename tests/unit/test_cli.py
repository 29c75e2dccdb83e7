"""The healer command line, run in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from healer.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_validate_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(ROOT / "policies")]) == 0
    assert "policies valid" in capsys.readouterr().out


def test_validate_reports_problems(capsys: pytest.CaptureFixture[str]) -> None:
    bad = ROOT / "tests" / "unit" / "policy_corpus" / "07-bad-threshold-type.yaml"
    assert main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "07-bad-threshold-type.yaml:12: spec.rules[0].metric.threshold" in err
    assert "nothing loaded" in err


def test_workflow_prints_mermaid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workflow"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("stateDiagram-v2")
    assert "Draining --> Cordoned" in out


def test_xid_explains_what_healer_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["xid", "79", "--policies", str(ROOT / "policies" / "default.yaml")]) == 0
    out = capsys.readouterr().out
    assert "GPU_HAS_FALLEN_OFF_THE_BUS" in out
    assert "policy gpu-fatal (mode observe): rule fatal-xid" in out
    assert "observe-only" in out
    assert main(["xid", "13", "--policies", str(ROOT / "policies" / "default.yaml")]) == 0
    assert "no rule matches" in capsys.readouterr().out
    assert main(["xid", "4242"]) == 1


def test_simulate_demo_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(ROOT / "scenarios" / "xid79-warm-spare.yaml")]) == 0
    out = capsys.readouterr().out
    assert "Draining → Cordoned" in out
    assert "all 2 expectations met" in out


def test_bad_scenario_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("name: x\npolicies: [nope.yaml]\nfleet: {nodes: []}\n")
    assert main(["simulate", str(f)]) == 2
    assert "fleet.nodes" in capsys.readouterr().err


# -- every CLI path fails cleanly: one line on stderr, a non-zero exit, no traceback ------------

def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(("argv", "expected"), [
    (["run", "--poll-interval", "nan"], "--poll-interval: expected a finite number"),
    (["run", "--poll-interval", "inf"], "--poll-interval: expected a finite number"),
    (["run", "--poll-interval", "-1"], "--poll-interval: expected seconds from 0.1"),
    (["run", "--lease-duration", "1e309"], "--lease-duration: expected a finite number"),
    (["run", "--shutdown-grace", "-0.5"], "--shutdown-grace: expected seconds from 0"),
    (["run", "--http-port", "65536"], "--http-port: expected a number from 0 to 65535"),
    (["run", "--http-port", "http"], "--http-port: expected a whole number"),
    (["run", "--http-host", "256.0.0.1"], "--http-host: expected an IP address or a host"),
    (["run", "--http-host", "a b"], "--http-host: expected an IP address or a host"),
    (["run", "--prometheus-url", "https://"], "--prometheus-url: expected a URL with a host"),
    (["run", "--prometheus-url", "http://p:99999"], "--prometheus-url: expected an http(s) URL"),
    (["run", "--prometheus-url", "http://p\r\nX-Evil: 1"], "without spaces or control"),
    (["run", "--prometheus-url", "ftp://p"], "expected an http:// or https:// URL"),
    (["run", "--slurmrestd-token-secret", "nons"], "expected NAMESPACE/NAME[:KEY]"),
    (["run", "--namespace", "Not_A_Namespace"], "--namespace: expected a lower-case"),
    (["run", "--prometheus-ca-file", "/nonexistent/ca.pem"], "No such file or directory"),
    (["run", "--prometheus-ca-file", "/"], "not a regular file"),
    (["run", "--log-level", "loud"], "--log-level: invalid choice"),
    (["run", "--policy-load-memory", "1"], "--policy-load-memory: expected a number from 64"),
    (["run", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["xid", "-3"], "argument code: expected a number from 0"),
    (["report", "--since", "7x"], "--since: expected a duration such as 90s, 5m, 12h, 7d"),
    (["report", "--since=-7d"], "--since: expected a duration such as"),
    (["report", "--since", "0"], "--since: expected a duration from 1s to 400d, got '0'"),
    (["report", "--since", "401d"], "--since: expected a duration from 1s to 400d"),
    (["report", "--format", "csv"], "--format: invalid choice: 'csv'"),
    (["report", "--gpus-per-node", "0"], "--gpus-per-node: expected a number from 1"),
    (["report", "--node", "Bad_Node"], "--node: expected a lower-case RFC 1123 name"),
    (["agent", "--interval", "nan"], "--interval: expected a finite number"),
    (["nope"], "invalid choice: 'nope'"),
    ([], "the following arguments are required: command"),
])
def test_a_bad_flag_is_one_line_and_exit_2(argv: list[str], expected: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    line = _one_line_error(capsys)
    assert expected in line
    assert line.startswith("healer")


@pytest.mark.parametrize(("argv", "expected"), [
    (["bench", "--nodes", "0"], "--nodes: expected a number from 1"),
    (["devstack", "up", "--timeout=-inf"], "--timeout: expected a finite number"),
    (["demo", "--scenario", "nope"], "--scenario: invalid choice: 'nope'"),
    (["run"], "invalid choice: 'run'"),
])
def test_the_dev_cli_has_the_same_one_line_errors(argv: list[str], expected: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from healer_dev.cli import main as dev_main

    assert dev_main(argv) == 2
    line = _one_line_error(capsys)
    assert expected in line
    assert line.startswith("python -m healer_dev")


def test_the_shipped_cli_has_no_dev_commands(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("demo", "bench", "devstack"):
        assert main([command]) == 2
        assert f"invalid choice: '{command}'" in _one_line_error(capsys)


def test_help_and_version_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert main(["run", "--help"]) == 0
    assert "--poll-interval" in capsys.readouterr().out


def _kubeconfig(tmp_path: Path, server: str) -> Path:
    f = tmp_path / "kubeconfig"
    f.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return f


@pytest.mark.parametrize(("content", "expected"), [
    (None, "No such file or directory"),
    ("dir", "not a regular file"),
    (b"\xff\xfe\x00binary", "not UTF-8 text"),
    ("clusters: [", "not valid YAML"),
    ("- just\n- a list\n", "expected a mapping with clusters, contexts and users, got list"),
    ("", "got NoneType"),
    ("a: &a [*a]\n", "Invalid kube-config file"),
    ("apiVersion: v1\nkind: Config\nclusters: 5\ncontexts: {}\ncurrent-context: x\n",
     "clusters: expected a list of {name: ..., cluster: {...}}"),
    ("contexts: [{name: x, context: [1]}]\n", "contexts: expected a list of"),
    ("apiVersion: v1\nclusters: []\ncontexts: []\nusers: []\ncurrent-context: nope\n",
     "Expected object with name nope"),
])
def test_a_bad_kubeconfig_is_one_line(tmp_path: Path, content: str | bytes | None,
                                      expected: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "kc"
    if content == "dir":
        f.mkdir()
    elif isinstance(content, bytes):
        f.write_bytes(content)
    elif content is not None:
        f.write_text(content)
    assert main(["status", "--kubeconfig", str(f)]) == 2
    line = _one_line_error(capsys)
    assert line.startswith(f"healer: kubeconfig {f}: ")
    assert expected in line


def test_status_against_an_unreachable_api_server_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from healer_dev.devstack.net import free_port

    kc = _kubeconfig(tmp_path, f"https://127.0.0.1:{free_port()}")
    assert main(["status", "--kubeconfig", str(kc)]) == 1
    assert "Cannot connect to host" in _one_line_error(capsys)


async def test_status_without_the_crd_says_so(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """An API server that answers 404 for the NodeRemediation list (the CRD is absent)."""
    import asyncio

    from aiohttp import web

    async def not_found(_: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "code": 404, "message": "the server "
                                  "could not find the requested resource"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", not_found)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        kc = _kubeconfig(tmp_path, f"http://127.0.0.1:{port}")
        code = await asyncio.to_thread(main, ["status", "--kubeconfig", str(kc)])
    finally:
        await runner.cleanup()
    assert code == 2
    assert "the NodeRemediation CRD (noderemediations.healer.io) is not installed" in \
        _one_line_error(capsys)


def test_run_with_a_broken_policy_exits_2_with_the_problem(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: &a [*a]\n")  # the recursive alias that crash-looped the daemon
    kc = _kubeconfig(tmp_path, "https://127.0.0.1:1")
    assert main(["run", "--kubeconfig", str(kc), "--policies", str(bad),
                 "--log-format", "json"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "cannot start: the policies cannot be loaded" in err
    assert f"{bad}:1" in err


def test_an_unexpected_error_is_one_line_exit_2_and_debug_shows_the_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import healer.cli

    def boom(_: object) -> int:
        raise ZeroDivisionError("a bug\nover two lines")

    monkeypatch.setattr(healer.cli, "_cmd_schema", boom)
    assert main(["schema"]) == 2
    line = _one_line_error(capsys)
    assert line == ("healer: internal error: ZeroDivisionError: a bug over two lines (run with "
                    "--debug or HEALER_DEBUG=1 for the traceback)")
    assert main(["--debug", "schema"]) == 2
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.setenv("HEALER_DEBUG", "1")
    assert main(["schema"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_a_healer_error_while_running_is_one_line_exit_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import healer.cli
    from healer.errors import TransientError

    def refused(_: object) -> int:
        raise TransientError("list noderemediations: HTTP 503 \x1b[31mred\x1b[0m")

    monkeypatch.setattr(healer.cli, "_cmd_schema", refused)
    assert main(["schema"]) == 1
    line = _one_line_error(capsys)
    assert "\x1b" not in line  # a terminal escape from the outside world is shown escaped
    assert line.startswith("healer: list noderemediations: HTTP 503")


def test_settings_reject_non_finite_and_out_of_range_numbers() -> None:
    from healer.errors import ConfigError
    from healer.settings import HttpSettings, Settings, TelemetrySettings

    with pytest.raises(ConfigError, match=r"telemetry.poll_interval: expected a number from "
                                          r"0.1 to 3600, got nan"):
        Settings(telemetry=TelemetrySettings(poll_interval=float("nan")))
    with pytest.raises(ConfigError, match=r"http\.port"):
        Settings(http=HttpSettings(port=70000))
    with pytest.raises(ConfigError, match="policy_load_timeout"):
        Settings(policy_load_timeout=float("inf"))
    assert Settings().telemetry.poll_interval == 15.0


def test_healthz_fails_while_any_loop_is_stale() -> None:
    from healer.obs.http import Health

    now = [100.0]
    h = Health(clock=lambda: now[0])
    h.beat("event-loop", 10)
    h.beat("policy-reload", 60)
    now[0] += 30
    ok, detail = h.healthy()
    assert not ok
    assert detail["event-loop"]["ok"] is False
    assert detail["policy-reload"]["ok"] is True
    with pytest.raises(ValueError, match="finite"):
        h.beat("poll", float("nan"))


def test_a_bad_url_error_never_repeats_its_credentials(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--prometheus-url", "http://bob:hunter2@prom:99999"]) == 2
    line = _one_line_error(capsys)
    assert "hunter2" not in line
    assert "'http://***@prom:99999'" in line


@pytest.mark.parametrize("url", [
    "http://prometheus.monitoring:9090", "https://thanos.monitoring.svc.cluster.local:10902/",
    "http://[::1]:9090", "http://10.0.0.1:9090/prometheus", "http://prom_k8s:9090"])
def test_real_urls_and_hosts_are_accepted(url: str) -> None:
    from healer import flags

    assert flags.url(url) == url
    for host in ("0.0.0.0", "::", "localhost", "node-1.example.com"):
        assert flags.host(host) == host


def test_simulate_on_a_binary_file_names_the_file_and_its_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "scenario.yaml"
    f.write_bytes(b"name: x\n\x7fELF\x02\x01\x01\x00\xd0\xff\x00")
    assert main(["simulate", str(f)]) == 2
    line = _one_line_error(capsys)
    assert f"{f}:2: cannot read scenario: expected UTF-8 text" in line


@pytest.mark.parametrize("given", [["/nonexistent/policies"], ["{corpus}"]])
def test_xid_with_policies_that_cannot_be_loaded_exits_non_zero(
        given: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    paths = [p.replace("{corpus}", str(ROOT / "tests" / "unit" / "policy_corpus" /
                                        "01-bad-yaml.yaml")) for p in given]
    assert main(["xid", "79", "--policies", *paths]) == 2
    assert paths[0] in _one_line_error(capsys)
