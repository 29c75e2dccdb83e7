"""What slurmrestd served, read back from its own log: the record tests check callers against.

slurmrestd (24.11, 26.05) logs every request at its default verbosity as a pair of lines::

    [2026-11-28T04:40:34.970] operations_router: [127.0.0.1:41339(fd:9)] DELETE /slurm/v0.0.45/job/9
    [2026-11-28T04:40:34.970] rest_auth/jwt: slurm_rest_auth_p_authenticate: [127.0.0.1:41339(fd:9)]
        attempting user_name root token authentication pass through

(one line each; ``slurmrestd: `` instead of the time stamp when it logs to a terminal). The
second says whether the client sent ``X-SLURM-USER-NAME`` (healer's drivers do, SchedMD's
operator does not: its token alone names ``slurm``). The query string is not logged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RestdRequest", "parse_restd_log", "read_restd_log"]

_PREFIX = r"^(?:\[(?P<at>[^\]]+)\]|slurmrestd:)\s+"
_ROUTER = re.compile(_PREFIX + r"operations_router: \[(?P<conn>.+?\(fd:\d+\))\] (?P<method>[A-Z]+) "
                               r"(?P<path>\S+)")
_AUTH = re.compile(_PREFIX + r"rest_auth/jwt: \S+ \[(?P<conn>.+?\(fd:\d+\))\] attempting "
                             r"(?:user_name (?P<user>\S+) )?token authentication")


@dataclass(frozen=True, slots=True)
class RestdRequest:
    at: str  # slurmrestd's time stamp ("" when it logged none)
    method: str
    path: str  # without the query string
    user_name: str  # the X-SLURM-USER-NAME header ("" when the client sent none)


def parse_restd_log(text: str) -> list[RestdRequest]:
    """Every request in a slurmrestd log, in order (an auth line completes its request)."""
    out: list[RestdRequest] = []
    open_: dict[str, int] = {}  # connection -> index of its request awaiting an auth line
    for line in text.splitlines():
        m = _ROUTER.match(line)
        if m:
            open_[m.group("conn")] = len(out)
            out.append(RestdRequest(m.group("at") or "", m.group("method"), m.group("path"), ""))
            continue
        a = _AUTH.match(line)
        if a and a.group("conn") in open_:
            i = open_.pop(a.group("conn"))
            r = out[i]
            out[i] = RestdRequest(r.at, r.method, r.path, a.group("user") or "")
    return out


def read_restd_log(path: Path) -> list[RestdRequest]:
    try:
        return parse_restd_log(path.read_text(errors="replace"))
    except OSError:
        return []
