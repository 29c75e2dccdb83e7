"""Live policy reload in the running daemon process (issue 12, item 11): a valid change is
picked up (the digest on /metrics changes); an invalid policy and a billion-laughs policy keep
the previous policies, each is logged once, counted in healer_policy_reload_failures_total and
emitted as a PolicyReloadFailed Event; /healthz answers 200 all along."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from tests.integration.daemon.conftest import Fleet
from tests.integration.daemon_process import Daemon
from tests.integration.waiting import wait_for

BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi",
                                                                 strict=True))


async def _digest(d: Daemon) -> str:
    status, text = await d.get("/metrics")
    m = re.search(r'^healer_policy_info\{digest="([^"]*)"\} 1\.0$', text, re.MULTILINE)
    return m.group(1) if status == 200 and m else ""


def _write(f: Path, text: str) -> None:
    """Write ``text`` whole (a rename, as a ConfigMap update does) with a new mtime."""
    tmp = f.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, f)


async def _reload_events(api: client.ApiClient) -> list[client.EventsV1Event]:
    evs = await client.EventsV1Api(api).list_namespaced_event("healer-system")
    return [e for e in evs.items if e.reason == "PolicyReloadFailed"]


@pytest.mark.timeout(240)
async def test_live_reload_applies_a_valid_change_and_survives_invalid_ones(
        fleet: Fleet) -> None:
    d = fleet.start("--policy-reload-interval", "0.5", "--policy-load-timeout", "30",
                    "--policy-load-memory", "256")
    await fleet.ready(d)
    unhealthy: list[int] = []

    async def watch_healthz() -> None:
        while True:
            status, _ = await d.get("/healthz")
            if status != 200:
                unhealthy.append(status)
            await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch_healthz())
    try:
        first = await _digest(d)
        assert first
        policy = fleet.policies / "policy.yaml"
        # a valid change: picked up, a new digest
        text = policy.read_text()
        changed_text = text.replace("drain:\n      deadline: 10m", "drain:\n      deadline: 20m")
        assert changed_text != text, text  # the builder's layout: a silent no-op fails here
        _write(policy, changed_text)

        async def changed() -> bool:
            return await _digest(d) not in ("", first)

        await wait_for(changed, timeout=60, description="the new digest on /metrics")
        second = await _digest(d)
        before = {e.metadata.name for e in await _reload_events(fleet.api)}

        async def failures(reason: str, n: int) -> bool:
            got = await d.metric("healer_policy_reload_failures_total", reason=reason)
            return (got or 0) >= n

        # an invalid policy (the recursive alias that crash-looped the daemon): kept, counted
        bad = fleet.policies / "bad.yaml"
        _write(bad, "a: &a [*a]\n")
        await wait_for(lambda: failures("invalid", 1), timeout=60,
                       description="the invalid policy counted")
        assert await _digest(d) == second
        # the same broken file written again: counted again, logged and emitted once
        _write(bad, "a: &a [*a]\n")
        await wait_for(lambda: failures("invalid", 2), timeout=60,
                       description="the same failure counted again")
        # a billion laughs: kept, counted (rejected by the loader, or by its memory budget)
        _write(bad, BILLION_LAUGHS)

        async def laughs_counted() -> bool:
            total = 0.0
            for reason in ("invalid", "memory", "timeout", "crash"):
                total += await d.metric("healer_policy_reload_failures_total",
                                        reason=reason) or 0
            return total >= 3

        await wait_for(laughs_counted, timeout=90, description="the billion laughs counted")
        assert await _digest(d) == second
        assert await d.metric("healer_policy_last_reload_success") == 0

        async def two_events() -> bool:
            new = [e for e in await _reload_events(fleet.api)
                   if e.metadata.name not in before]
            return len(new) >= 2

        await wait_for(two_events, timeout=60, description="a PolicyReloadFailed Event each")
        new = [e for e in await _reload_events(fleet.api) if e.metadata.name not in before]
        assert len(new) == 2, [e.note for e in new]  # two distinct failures, one Event each
        assert all(e.type == "Warning" for e in new)
        assert all(e.regarding.kind in ("Lease", "Pod") for e in new)
        assert any("bad.yaml:1" in e.note for e in new)
        logged = [line for line in d.log.read_text().splitlines()
                  if "policy reload failed" in line]
        assert len(logged) == 2, logged  # once per distinct failure
        # the file fixed: reloaded, back to the digest of the same content
        bad.unlink()

        async def back() -> bool:
            return await d.metric("healer_policy_last_reload_success") == 1

        await wait_for(back, timeout=60,
                       description="the policies reloaded once the bad file is gone")
        assert await _digest(d) == second
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    assert unhealthy == []  # /healthz answered 200 all along
    assert d.proc.poll() is None  # and the daemon is still running
    assert d.terminate() == 0


@pytest.mark.timeout(120)
async def test_start_up_failures_exit_2_with_one_clear_line_and_no_traceback(
        fleet: Fleet) -> None:
    """A broken policy (a crash loop of tracebacks before) and a port already taken: the daemon
    exits 2 and says why in one log line."""
    bad = fleet.dir / "bad-policies"
    bad.mkdir()
    (bad / "p.yaml").write_text("a: &a [*a]\n")
    broken = fleet.start("--policies", str(bad))
    taken = fleet.start()
    await fleet.ready(taken)
    in_use = fleet.start("--http-port", str(taken.port))

    async def exited(d: Daemon) -> bool:
        return d.proc.poll() is not None

    for d, says in ((broken, "cannot start: the policies cannot be loaded"),
                    (in_use, f"cannot serve HTTP on 127.0.0.1:{taken.port}")):
        await wait_for(lambda d=d: exited(d), timeout=60, description="the daemon's exit")
        assert d.proc.returncode == 2, d.tail()
        log = d.log.read_text()
        assert "Traceback" not in log
        errors = [line for line in log.splitlines() if '"level": "error"' in line]
        assert len(errors) == 1, errors
        assert says in errors[0]
    assert "p.yaml:1" in broken.log.read_text()
    assert taken.terminate() == 0
