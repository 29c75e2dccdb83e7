"""``healer status``: open and recent remediations, read from the API server.

Every failure is a one-line :class:`~healer.errors.HealerError` for the CLI to print: a bad
kubeconfig, an unreachable API server, no permission, or no NodeRemediation CRD installed."""

from __future__ import annotations

import json

from healer.adapters.clock import SYSTEM_CLOCK
from healer.adapters.kube.client import make_api_client
from healer.adapters.kube.crd import reason_of
from healer.adapters.kube.store import CRStateStore
from healer.core.machine import releases
from healer.core.model import NodeRecord
from healer.core.text import printable
from healer.core.timefmt import format_duration
from healer.errors import ConfigError, NotFoundError


def _age(seconds: float) -> str:
    """An age as kubectl writes one: its largest unit, whole (``5d``, ``3h``, ``45s``)."""
    return format_duration(int(max(seconds, 0)), units=1)


def _spare(r: NodeRecord) -> str:
    """The spare, and how far it is when it is not in the node's NVLink domain."""
    p = r.spare_placement
    if not r.spare:
        return "-"
    if p is None or p.same_domain:
        return r.spare
    return f"{r.spare} ({p.level}, {p.spare_domain or 'no domain'})"


async def status(kubeconfig: str | None, *, show_all: bool = False, as_json: bool = False) -> int:
    api = await make_api_client(kubeconfig)
    try:
        stored = await CRStateStore(api).list()
    except NotFoundError as e:
        raise ConfigError(f"the NodeRemediation CRD (noderemediations.healer.io) is not "
                          f"installed on this cluster ({e}); apply deploy/crds/") from None
    finally:
        await api.close()
    now = SYSTEM_CLOCK.now()
    rows = sorted(stored, key=lambda s: s.record.incident.opened_at, reverse=True)
    if not show_all:
        rows = [s for s in rows if not releases(s.record)
                or now - s.record.phase_since < 86400]
    if as_json:
        print(json.dumps([{"name": s.name, **s.record.to_dict()} for s in rows], indent=2))
        return 0
    header = (f"{'NAME':38} {'NODE':16} {'PHASE':16} {'AGE':>5} {'IN PHASE':>8}  "
              f"{'SPARE':24} REASON")
    print(header)
    for s in rows:  # records hold others' text (reasons, answers): shown printable only
        r = s.record
        print(f"{printable(s.name[:38]):38} {printable(r.node[:16]):16} {r.phase.value:16} "
              f"{_age(now - r.incident.opened_at):>5} {_age(now - r.phase_since):>8}  "
              f"{printable(_spare(r)):24} {printable(reason_of(r))}")
    if not rows:
        print("(no remediations)")
    return 0
