"""Redaction by key and by value, in /debug/state and in every log mode (no frame locals); the
HTTP server's bind and its defaults."""

from __future__ import annotations

import io
import json
import logging

import aiohttp
import pytest
import structlog
from prometheus_client import CollectorRegistry

from healer.cli import build_parser
from healer.obs import logging as hlog
from healer.obs.http import Health, make_app, serve
from healer.obs.redact import REDACTED, redact, redact_text, secret_key
from healer_dev.devstack.net import free_port

JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJoZWFsZXIiLCJleHAiOjE3fQ."
       "c2lnbmF0dXJlLXNpZ25hdHVyZQ")
PEM = ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n"
       "-----END PRIVATE KEY-----")


@pytest.mark.parametrize("key", ["token", "slurmToken", "X-Auth-Token", "clientSecret",
                                 "password", "authorization", "hmac", "api_key",
                                 "client-key-data"])
def test_secret_keys_are_redacted(key: str) -> None:
    assert secret_key(key)
    assert redact({key: "v"}) == {key: REDACTED}


@pytest.mark.parametrize("key", ["gpu-token-3", "tokenizer-node", "node-secretary",
                                 "bearerTokenFile", "keyboard", "monkey", "certified",
                                 "secretRef", "n1"])
def test_names_that_only_contain_a_word_are_kept(key: str) -> None:
    assert not secret_key(key)
    assert redact({key: {"phase": "Draining"}}) == {key: {"phase": "Draining"}}


@pytest.mark.parametrize(("text", "gone"), [
    ("https://admin:hunter2@prom.example:9090/api", "hunter2"),
    ("https://ghp_abcdef123456@git.example/repo", "ghp_abcdef123456"),
    ("http://h/api?query=up&token=abcd1234&x=1", "abcd1234"),
    ("https://s3/b?X-Amz-Signature=deadbeef00&X-Amz-Credential=AKIA1", "deadbeef00"),
    ("Authorization: Bearer abcdefghijklmnop.qrst", "abcdefghijklmnop"),
    ("header Basic dXNlcjpodW50ZXIy", "dXNlcjpodW50ZXIy"),
    (f"jwt was {JWT} ok", JWT),
    (f"key:\n{PEM}\nafter", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEunterminated", "MIIEunterminated"),
])
def test_credentials_inside_values_are_redacted(text: str, gone: str) -> None:
    out = redact_text(text)
    assert gone not in out
    assert REDACTED in out
    assert redact({"anything": [text]}) == {"anything": [out]}


def test_plain_values_are_kept() -> None:
    for text in ("node gpu-token-3 is Draining", "https://prom.example:9090/api?query=up",
                 "a basic check ran", "bearer of bad news", "user@example.com"):
        assert redact_text(text) == text


def test_redaction_is_linear_on_hostile_values() -> None:
    # patterns with no nested quantifiers: a long near-miss string is one pass each
    text = ("a://" + "b" * 300) * 300 + "eyJ" + "a" * 50_000 + "-----BEGIN X-----" * 2000
    assert redact_text(text).startswith("a://")


async def test_debug_state_is_off_by_default_and_redacted_when_on() -> None:
    state = {"workers": {"gpu-token-3": {"phase": "Draining"}},
             "settings": {"prometheusUrl": "https://u:pw-123@prom/", "slurmToken": "t0k"}}
    off = await serve(make_app(Health(), CollectorRegistry()), "127.0.0.1", 0)
    on = await serve(make_app(Health(), CollectorRegistry(), lambda: state), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{off.addresses[0][1]}/debug/state") as r:
                assert r.status == 404
            async with s.get(f"http://127.0.0.1:{on.addresses[0][1]}/debug/state") as r:
                got = json.loads(await r.text())
    finally:
        await off.cleanup()
        await on.cleanup()
    assert got["workers"] == {"gpu-token-3": {"phase": "Draining"}}
    assert got["settings"]["slurmToken"] == REDACTED
    assert "pw-123" not in got["settings"]["prometheusUrl"]


def _fail_with_a_secret_local() -> None:
    hmac_key = "hunter2-local-secret"  # noqa: F841 (a frame local a renderer must not print)
    raise RuntimeError("boom")


@pytest.mark.parametrize("as_json", [True, False])
def test_no_log_mode_prints_frame_locals_or_credentials(as_json: bool) -> None:
    out = io.StringIO()
    hlog.setup("info", json=as_json, stream=out)
    try:
        log = structlog.get_logger("t")
        try:
            _fail_with_a_secret_local()
        except RuntimeError:
            log.exception("failed", url="https://u:pw-abc@slurmrestd:6820/", token="t0k-xyz")
        logging.getLogger("aiohttp.test").warning("Authorization: Bearer abcdefghijklmnop1")
    finally:
        hlog.setup("info")
    text = out.getvalue()
    assert "Traceback" in text
    assert "RuntimeError: boom" in text
    for secret in ("hunter2-local-secret", "pw-abc", "t0k-xyz", "abcdefghijklmnop1"):
        assert secret not in text


async def test_serve_binds_its_address_and_the_pods_loopback_only() -> None:
    """A specific address (127.0.0.2 stands in for the pod IP) plus 127.0.0.1 on the same port,
    where kubectl port-forward connects; never the wildcard."""
    port = free_port()
    runner = await serve(make_app(Health(), CollectorRegistry()), "127.0.0.2", port)
    try:
        hosts = sorted(a[0] for a in runner.addresses)
        assert hosts == ["127.0.0.1", "127.0.0.2"]
        async with aiohttp.ClientSession() as s:
            for host in hosts:
                async with s.get(f"http://{host}:{port}/metrics") as r:
                    assert r.status == 200
    finally:
        await runner.cleanup()


def test_the_http_defaults_are_loopback_and_no_debug_state() -> None:
    args = build_parser().parse_args(["run"])
    assert args.http_host == "127.0.0.1"
    assert args.debug_state is False
