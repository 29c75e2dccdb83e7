"""Text from others never reaches an Event, a NodeRemediation or ``healer status`` with a
control character in it (issue 22 item 5): whatever a condition, a Slurm reason or a webhook's
answer said (a newline, an ANSI escape, a NUL, a right-to-left override), the sinks write it
printable."""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace
from typing import Any

import pytest

from healer import status as status_cmd
from healer.adapters.kube.crd import reason_of, to_object
from healer.adapters.kube.events import KubeEvents
from healer.core.model import RecordOutcome, StepOutcome, StepRecord
from healer.core.phases import Phase
from healer.core.text import bounded, printable
from healer_dev.testing import ManualClock
from tests.builders import record

EVIL = ["a\nforged: line", "\x1b[2J\x1b[31mred", "nul\x00x", "rtl\u202etxt", "cr\rx",
        "tab\tx", "sep\u2028x", "del\x7fx", "c1\x9bx"]


def _strings(v: Any) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, dict):
        return [s for x in v.values() for s in _strings(x)]
    if isinstance(v, list):
        return [s for x in v for s in _strings(x)]
    return []


@pytest.mark.parametrize("evil", EVIL)
def test_printable_and_bounded_leave_no_control_character(evil: str) -> None:
    assert printable(evil).isprintable()
    assert bounded(evil * 1000, 50).isprintable()
    assert len(bounded(evil * 1000, 50)) <= 50
    assert printable("plain text, ünïcode ok") == "plain text, ünïcode ok"


@pytest.mark.parametrize("evil", EVIL)
def test_a_noderemediation_object_holds_no_control_character(evil: str) -> None:
    rec = record(Phase.DRAINING, ledger=(StepRecord("checkpoint", 1.0, 2, 2.0,
                                                    StepOutcome.FAILED, f"webhook: {evil}"),),
                 outcome=RecordOutcome.ESCALATED, outcome_detail=evil)
    rec = replace(rec, incident=replace(rec.incident, summary=f"NHC: {evil}"))
    obj = to_object(rec, "n1-x")
    bad = [s for s in _strings(obj) if not s.isprintable()]
    assert bad == []
    assert reason_of(rec).isprintable()


class _Writer:
    """An EventWriter that keeps what it is asked to create."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def create(self, namespace: str, body: dict[str, Any], what: str) -> None:
        self.bodies.append(body)

    async def patch(self, namespace: str, name: str, body: dict[str, Any], what: str) -> None:
        raise AssertionError("one Event: no series update expected")


@pytest.mark.parametrize("evil", EVIL)
async def test_an_event_note_holds_no_control_character(evil: str) -> None:
    fake = _Writer()
    ev = KubeEvents(fake, instance="h", clock=ManualClock(0.0))
    await ev.emit(key="k", node="n1", reason="IncidentOpened", note=f"XID 79: {evil}")
    (body,) = fake.bodies
    assert body["note"].isprintable()


async def test_healer_status_prints_records_without_control_characters(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rec = replace(record(Phase.DRAINING, outcome=None, spare="spare\x1b[1m"),
                  incident=replace(record(Phase.DRAINING).incident,
                                   summary="\x1b[2Jwiped\nSECOND LINE"))

    class Stored:
        name, record = "n1-abc", rec

    class Store:
        def __init__(self, api: object) -> None: ...

        async def list(self) -> list[Stored]:
            return [Stored()]

    class Api:
        async def close(self) -> None: ...

    async def client(*a: object) -> Api:
        return Api()

    monkeypatch.setattr(status_cmd, "make_api_client", client)
    monkeypatch.setattr(status_cmd, "CRStateStore", Store)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert await status_cmd.status("kubeconfig") == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # the header and one row: no forged second line
    assert all(line.isprintable() for line in lines)
