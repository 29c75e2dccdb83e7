"""The isolated policy loader and the reload loop (healer.runtime.policy_reload): a reload
never harms the daemon, whatever the files hold and however the loader fails."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from healer.core.rules import PolicySet
from healer.errors import PolicyError, PolicyLoadError
from healer.runtime.policy_reload import Budget, PolicyReloader, _answer, load_isolated

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = (ROOT / "policies" / "default.yaml").read_text()
BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi",
                                                                 strict=True))


class Observer:
    def __init__(self) -> None:
        self.outcomes: list[tuple[str, bool, str]] = []

    def policies_loaded(self, digest: str, ok: bool, reason: str = "invalid") -> None:
        self.outcomes.append((digest, ok, reason))


class Harness:
    def __init__(self, tmp: Path, budget: Budget | None = None) -> None:
        self.dir = tmp / "policies"
        self.dir.mkdir()
        (self.dir / "default.yaml").write_text(DEFAULT)
        self.applied: list[PolicySet] = []
        self.events: list[tuple[str, str]] = []
        self.observer = Observer()
        self.reloader = PolicyReloader([str(self.dir)], apply=self.applied.append,
                                       observer=self.observer, emit=self.emit,
                                       budget=budget or Budget(seconds=60))

    async def emit(self, reason: str, note: str) -> None:
        self.events.append((reason, note))

    def write(self, name: str, text: str) -> None:
        f = self.dir / name
        f.write_text(text)
        st = f.stat()  # a distinct mtime even on coarse file systems
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


async def test_a_valid_change_is_applied_and_nothing_else_happens(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.reloader.prime()
    assert await h.reloader.check() is None  # unchanged: not even loaded
    h.write("default.yaml", DEFAULT.replace("mode: observe", "mode: dryRun", 1))
    assert await h.reloader.check() is True
    assert len(h.applied) == 1
    assert h.observer.outcomes == [(h.applied[0].digest, True, "invalid")]
    assert h.events == []


async def test_an_invalid_policy_keeps_the_previous_and_is_reported_once(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.reloader.prime()
    h.write("bad.yaml", "a: &a [*a]\n")  # the recursive alias that crashed the daemon
    assert await h.reloader.check() is False
    h.write("bad.yaml", "a: &a [*a]\n")  # the same failure again (rewritten)
    assert await h.reloader.check() is False
    assert h.applied == []
    assert [o[1:] for o in h.observer.outcomes] == [(False, "invalid")] * 2  # counted twice
    assert len(h.reloader.failures) == 1  # logged once
    assert [e[0] for e in h.events] == ["PolicyReloadFailed"]
    assert "bad.yaml:1" in h.events[0][1]
    (h.dir / "bad.yaml").unlink()  # fixed
    assert await h.reloader.check() is True
    h.write("bad.yaml", "a: &a [*a]\n")  # broken again after a success: reported again
    assert await h.reloader.check() is False
    assert len(h.events) == 2


async def test_a_load_over_its_memory_budget_fails_and_the_loop_keeps_running(
        tmp_path: Path) -> None:
    # 1 MiB of address space: the child cannot even read a file of 1,000,000 bytes
    h = Harness(tmp_path, Budget(seconds=60, memory_bytes=1 << 20))
    await h.reloader.prime()
    h.write("big.yaml", ("#" * 99 + "\n") * 10_000)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    t = asyncio.create_task(ticker())
    try:
        assert await h.reloader.check() is False
    finally:
        t.cancel()
    assert ticks > 1  # the event loop ran while the child loaded
    assert h.observer.outcomes[-1][1:] == (False, "memory")
    assert "MiB of memory" in h.events[0][1]
    assert h.applied == []


async def test_a_billion_laughs_is_rejected_and_the_previous_policies_stay(
        tmp_path: Path) -> None:
    h = Harness(tmp_path, Budget(seconds=60, memory_bytes=256 << 20))
    await h.reloader.prime()
    h.write("laughs.yaml", BILLION_LAUGHS)
    assert await h.reloader.check() is False  # rejected by the loader, or by its budget
    assert h.observer.outcomes[-1][1] is False
    assert h.applied == []
    assert len(h.events) == 1


async def test_a_load_over_its_time_budget_is_stopped(tmp_path: Path) -> None:
    h = Harness(tmp_path, Budget(seconds=0.001))  # no child can answer within 1 ms
    await h.reloader.prime()
    h.write("default.yaml", DEFAULT + "\n")
    assert await h.reloader.check() is False
    assert h.observer.outcomes[-1][1:] == (False, "timeout")
    assert "longer than 0.001 s" in h.events[0][1]


async def test_load_isolated_returns_the_same_policies_as_loading_in_process() -> None:
    from healer.policy.load import load_policy_set

    got = await load_isolated([str(ROOT / "policies")])
    want = load_policy_set([str(ROOT / "policies")])
    assert got.digest == want.digest
    assert [(p.name, p.mode, len(p.rules)) for p in got.policies] == [
        (p.name, p.mode, len(p.rules)) for p in want.policies]


@pytest.mark.parametrize(("out", "err", "code", "kind", "text"), [
    (b"", b"", -9, "crash", "the policy loader died (signal 9)"),
    (b"", b"Fatal Python error: Segmentation fault\n", -11, "crash", "Segmentation fault"),
    (b"\x80garbage", b"", 1, "crash", "exit code 1"),
    (b"", b"Traceback ...\nMemoryError\n", 1, "memory", "MiB of memory"),
])
def test_every_way_the_child_can_fail_is_a_policy_load_error(
        out: bytes, err: bytes, code: int, kind: str, text: str) -> None:
    with pytest.raises(PolicyLoadError) as e:
        _answer(out, err, code, "p.yaml", Budget())
    assert e.value.kind == kind
    assert isinstance(e.value, PolicyError)
    assert text in str(e.value)


async def test_a_failing_apply_or_event_never_escapes(tmp_path: Path) -> None:
    h = Harness(tmp_path)

    def boom(_: PolicySet) -> None:
        raise RuntimeError("apply exploded")

    async def no_api(reason: str, note: str) -> None:
        raise ConnectionError("API server down")

    h.reloader.apply, h.reloader.emit = boom, no_api
    await h.reloader.prime()
    h.write("default.yaml", DEFAULT + "\n")
    assert await h.reloader.check() is False
    assert h.observer.outcomes[-1][1:] == (False, "crash")
    assert "apply exploded" in h.reloader.failures[0]


def test_a_switch_that_fails_half_way_is_undone() -> None:
    """switch_policies: the followers first, then the controller; a failure switches back
    the followers already switched, so nothing is half-applied."""
    from healer.runtime.policy_reload import switch_policies

    class Holder:
        def __init__(self, policies: object, fail: bool = False) -> None:
            self.policies, self.fail = policies, fail

        def set_policies(self, new: object) -> None:
            if self.fail:
                raise RuntimeError("cannot plan")
            self.policies = new

    ctl, a, b = Holder("old"), Holder("old"), Holder("old", fail=True)
    with pytest.raises(RuntimeError):
        switch_policies("new", ctl, [a, b])  # type: ignore[arg-type]
    assert (ctl.policies, a.policies, b.policies) == ("old", "old", "old")
    b.fail = False
    switch_policies("new", ctl, [a, b])  # type: ignore[arg-type]
    assert (ctl.policies, a.policies, b.policies) == ("new", "new", "new")


def test_the_policies_in_force_move_on_only_with_the_controller() -> None:
    """The holder the readers built before the controller read (the spare validator, the
    NodeSets' ports) takes a reloaded set once the controller did; never a refused one."""
    from healer.runtime.policy_reload import PoliciesInForce, switch_policies

    class Ctl:
        def __init__(self) -> None:
            self.policies: object = "old"
            self.fail = True

        def set_policies(self, new: object) -> None:
            if self.fail:
                raise RuntimeError("cannot plan")
            self.policies = new

    ctl, in_force = Ctl(), PoliciesInForce("old")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        switch_policies("new", ctl, [], in_force)  # type: ignore[arg-type]
    assert in_force() == "old"
    ctl.fail = False
    switch_policies("new", ctl, [], in_force)  # type: ignore[arg-type]
    assert in_force() == ctl.policies == "new"


ROUND_TWO = sorted((ROOT / "tests" / "unit" / "policy_corpus").glob("1[0-9][0-9]-*.yaml"))
TWO_NODESETS = (ROOT / "policies" / "examples" / "two-clusters.yaml").read_text()


@pytest.mark.parametrize("bad", ROUND_TWO, ids=[p.stem for p in ROUND_TWO])
async def test_a_reload_with_a_round_two_hostile_document_keeps_the_nodesets_in_force(
        tmp_path: Path, bad: Path) -> None:
    """Issue 22: an overlapping NodeSet, a costly PromQL rule, a literal-brace regex, a YAML
    tag, a field that used to fail mid-incident: a reload refuses it (file:line in the Event)
    and the NodeSets in force keep serving."""
    h = Harness(tmp_path)
    await h.reloader.prime()
    h.write("nodesets.yaml", TWO_NODESETS)
    assert await h.reloader.check() is True
    in_force = h.applied[-1]
    assert {n.name for n in in_force.nodesets.items} == {"h100-west", "h200-east"}
    text = await asyncio.to_thread(bad.read_text)
    h.write("bad.yaml", text)
    assert await h.reloader.check() is False
    assert h.applied == [in_force]
    assert h.events[-1][0] == "PolicyReloadFailed"
    line = text.splitlines()[0].split("|")[0].split(":")[1].strip()
    assert f"bad.yaml:{line}" in h.events[-1][1], h.events[-1][1]
