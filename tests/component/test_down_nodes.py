"""A DOWN Slurm node (docs/adr/0016), through the runtime on fakes: DOWN with no job counts as
drained; someone else's DOWN reason is never overwritten and holds the swap (the default), or
is carried over to the replacement word for word (``swap.foreignReason: carryOver``); Slurm's
own ``Not responding`` is nobody's hold."""

from __future__ import annotations

from typing import Any

import pytest

from healer.core import rules as cp
from healer.core.phases import Phase
from tests.builders import policies, policy
from tests.component.test_controller import make


def swap_policy(foreign: cp.ForeignReason) -> cp.PolicySet:
    return policies(policy(steps=cp.Steps(poll_interval=5, swap=cp.SwapStep(
        foreign_reason=foreign))))


@pytest.mark.parametrize("reason", ["Not responding", "ops: PSU failing, do not use"])
async def test_a_down_node_counts_as_drained(reason: str) -> None:
    h = await make(swap_policy(cp.ForeignReason.HOLD))
    slurm: Any = h.fakes["slurm"]
    try:
        slurm.set_down("gpu-1", reason)
        await h.xid("gpu-1")
        await h.run(40)
        rec = next(r for r, _ in h.store.objects.values() if r.node == "gpu-1")
        assert Phase.CORDONED in [t.target for t in rec.history]  # no drain deadline to wait for
        st = await slurm.state("gpu-1")
        assert st.reason in (reason, "")  # never replaced by healer's
        assert not any(e[0] == "drain" for e in slurm.log)
        if reason == "Not responding":  # Slurm's own: nobody's hold, the swap goes on
            assert h.phase("gpu-1") in (Phase.SWAPPING, Phase.ANNOTATING, Phase.UNDRAINING,
                                        Phase.REPAIR)
        else:  # an admin's: held, and said why
            assert h.phase("gpu-1") is Phase.SWAPPING
            step = rec.step("move-workload")
            assert step is not None
            assert not step.done
            assert "drained or down by someone else" in step.error
            assert "StepHeld" in h.fakes["events"].reasons("gpu-1")  # type: ignore[attr-defined]
    finally:
        await h.close()


async def test_carry_over_puts_their_reason_on_the_replacement() -> None:
    h = await make(swap_policy(cp.ForeignReason.CARRY_OVER))
    slurm: Any = h.fakes["slurm"]
    try:
        slurm.set_down("gpu-1", "ops: PSU failing, do not use")
        await h.xid("gpu-1")
        await h.run(60)
        assert h.phase("gpu-1") is Phase.REPAIR
        rec = next(r for r, _ in h.store.objects.values() if r.node == "gpu-1")
        assert rec.carried == "ops: PSU failing, do not use"
        st = await slurm.state("gpu-1")  # the same Slurm node, now on the spare
        assert slurm.node_state("gpu-1")["host"] == "spare-a"
        assert st.drain
        assert st.reason == "ops: PSU failing, do not use"  # word for word: still theirs
        assert ["hold", "gpu-1", "ops: PSU failing, do not use"] in slurm.log
        undrain = rec.step("undrain")
        assert undrain is not None
        assert "undrain=not-ours" in undrain.detail  # healer never clears it
        assert "ReasonCarriedOver" in h.fakes["events"].reasons("gpu-1")  # type: ignore[attr-defined]
    finally:
        await h.close()
