"""Pure parsing of Slurm's CLI and REST output into :class:`SlurmNodeState` / :class:`SlurmJob`.

No I/O here: the drivers run the commands and hand the text (or decoded JSON) in.

* ``scontrol show node -o``: one line per node, ``Key=value`` fields separated by blanks, where
  some values contain blanks (``OS=Linux 6.1 #1 SMP ...``, ``Reason=XID 79 on GPU 3 [root@...]``).
  The reason is followed by ``[user@timestamp]``; every other field is cut at the next
  `` Key=``. Missing fields get defaults; odd spacing is tolerated. The same parser reads
  Slurm 22.05, 24.11 and 26.05: 26.05 adds ``Topology=`` (only when the node has one; a
  ``Version=`` >= 25.05 says an absent one means none set) and flags such as
  ``INVALID_REG`` and ``DYNAMIC_NORM``.
* ``scontrol --json show node`` (Slurm >= 23.02): the slurmrestd node objects below.
* ``squeue -h -O SQUEUE_FIELDS``: fields separated by the ASCII unit separator (0x1f), so a
  ``|`` or a blank in a job name or comment is just text.
* slurmrestd JSON, v0.0.38 (``"state": "idle"`` + ``"state_flags": ["DRAIN"]``) through v0.0.45
  (``"state": ["IDLE", "DRAIN"]``, and the node's ``topology`` string); jobs with ``job_state``
  as a string or an array.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from healer.core.timefmt import rfc3339
from healer.ports import SlurmJob, SlurmNodeState

__all__ = [
    "BASE_STATES",
    "SEP",
    "SQUEUE_FIELDS",
    "expand_hostlist",
    "parse_job_json",
    "parse_kv_line",
    "parse_node_json",
    "parse_node_line",
    "parse_nodes",
    "parse_squeue",
    "parse_state",
    "scontrol_error_kind",
]

#: Slurm's base node states (``NODE_STATE_BASE``); everything else is a flag.
BASE_STATES = frozenset({"UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE"})

#: sinfo/scontrol suffix characters and the flag each one stands for.
_SUFFIX_FLAGS = {
    "*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "%": "POWERING_DOWN",
    "!": "POWER_DOWN", "$": "MAINTENANCE", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED",
    "-": "PLANNED",
}

#: Compound names some Slurm tools print instead of base+flags.
_COMPOUND = {
    "DRAINED": ("IDLE", "DRAIN"), "DRAIN": ("IDLE", "DRAIN"), "DRNG": ("ALLOCATED", "DRAIN"),
    "DRAINING": ("ALLOCATED", "DRAIN"), "ALLOC": ("ALLOCATED", ""), "MIX": ("MIXED", ""),
    "COMPLETING": ("ALLOCATED", "COMPLETING"), "COMP": ("ALLOCATED", "COMPLETING"),
}

#: Separator of :data:`SQUEUE_FIELDS` (ASCII unit separator: never in names or comments).
SEP = "\x1f"

#: ``squeue -h -O`` fields: job id (``JobID`` = ``%A``, unique per array task), state, node
#: list, requeue flag (0/1), then the free-text name and comment. ``Field:<suffix>`` without a
#: width prints the value unpadded and untruncated followed by the suffix.
SQUEUE_FIELDS = ",".join(f"{f}:{SEP}" for f in ("JobID", "State", "NodeList", "Requeue", "Name")) \
    + ",Comment:"

_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")
_REASON = re.compile(
    r"(?:^|\s)Reason=(?P<reason>.*?)\s*\[(?P<user>[^\]\s@]*)@(?P<when>[^\]]*)\](?=\s|$)")
_REASON_BARE = re.compile(r"(?:^|\s)Reason=(?P<reason>.*?)(?=\s+[A-Z][A-Za-z]*=|\s*$)")


def parse_kv_line(line: str) -> dict[str, str]:
    """``Key=value`` fields of one ``scontrol show ... -o`` line.

    ``Reason`` is cut at its ``[user@time]`` suffix (kept separately as ``ReasonUser`` and
    ``ReasonTime``); every other value runs until the next `` Key=``.
    """
    line = line.strip()
    out: dict[str, str] = {}
    m = _REASON.search(line) or _REASON_BARE.search(line)
    if m:
        out["Reason"] = m.group("reason").strip()
        groups = m.groupdict()
        if groups.get("user") is not None:
            out["ReasonUser"] = groups["user"] or ""
            out["ReasonTime"] = groups.get("when") or ""
        line = (line[:m.start()] + " " + line[m.end():]).strip()
    keys = list(_KEY.finditer(line))
    for i, k in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        out.setdefault(k.group(1), line[k.end():end].strip())
    return out


def parse_state(state: str | Iterable[str],
                flags: Iterable[str] = ()) -> tuple[str, frozenset[str]]:
    """A Slurm state (``MIXED+DRAIN``, ``idle*``, ``drained``, ``["IDLE", "DRAIN"]``) plus any
    extra flags → (base, flags), upper case. Unknown or empty → ``UNKNOWN``."""
    text = isinstance(state, str)
    parts = re.split(r"[+,\s]+", state.strip()) if isinstance(state, str) else list(state)
    parts += list(flags)
    words: list[str] = []
    out: set[str] = set()
    for raw in parts:
        word = str(raw).strip().upper()
        while word and word[-1] in _SUFFIX_FLAGS:
            out.add(_SUFFIX_FLAGS[word[-1]])
            word = word[:-1]
        if word:
            words.append(word)
    base = next((w for w in words if w in BASE_STATES), "")
    if not base and text and words and words[0] in _COMPOUND:
        # sinfo-style names (drained, drng, mix) exist only in CLI text, never in REST arrays
        base, flag = _COMPOUND[words[0]]
        words = [flag, *words[1:]] if flag else words[1:]
    out.update(w for w in words if w and w != base)
    return base or "UNKNOWN", frozenset(out)


def _node(name: str, base: str, flags: frozenset[str], reason: str, user: str,
          topology: str = "", reason_time: str = "", *, reports_topology: bool = False,
          features: frozenset[str] = frozenset(), gres: str = "") -> SlurmNodeState:
    registered = "NOT_RESPONDING" not in flags and base not in ("FUTURE", "UNKNOWN")
    return SlurmNodeState(name=name, base=base, flags=flags, reason=reason, reason_user=user,
                          registered=registered, topology=topology, reason_time=reason_time,
                          reports_topology=reports_topology, features=features, gres=gres)


def _features(raw: Any) -> frozenset[str]:
    """``a,b`` (CLI, v0.0.38) or ``["a", "b"]`` (v0.0.39+) → {"a", "b"}; ``(null)`` → {}."""
    items = raw.split(",") if isinstance(raw, str) else raw if isinstance(raw, list) else []
    return frozenset(str(x).strip() for x in items
                     if str(x).strip() and str(x).strip() != "(null)")


def _gres(raw: Any) -> str:
    text = raw.strip() if isinstance(raw, str) else ""
    return "" if text in ("(null)", "N/A") else text


def _version_at_least(version: str, major: int, minor: int) -> bool:
    m = re.match(r"(\d+)\.(\d+)", version.strip())
    return m is not None and (int(m.group(1)), int(m.group(2))) >= (major, minor)


def parse_node_line(line: str) -> SlurmNodeState:
    """One ``scontrol show node NAME -o`` line → SlurmNodeState (ValueError without NodeName)."""
    kv = parse_kv_line(line)
    name = kv.get("NodeName", "").strip()
    if not name:
        raise ValueError(f"not a `scontrol show node -o` line (no NodeName=): {line[:120]!r}")
    base, flags = parse_state(kv.get("State", ""))
    reason = kv.get("Reason", "")
    if reason in ("(null)", "None"):
        reason = ""
    topology = kv.get("Topology", "").strip()
    return _node(name, base, flags, reason, kv.get("ReasonUser", ""),
                 topology="" if topology == "(null)" else topology,
                 reason_time=kv.get("ReasonTime", "") if reason else "",
                 reports_topology="Topology" in kv or _version_at_least(kv.get("Version", ""),
                                                                        25, 5),
                 features=_features(kv.get("AvailableFeatures", "")),
                 gres=_gres(kv.get("Gres", "")))


def parse_nodes(text: str) -> list[SlurmNodeState]:
    """Every node in ``scontrol show node -o`` output (blank and non-node lines are skipped)."""
    return [parse_node_line(ln) for ln in text.splitlines() if "NodeName=" in ln]


_RANGE = re.compile(r"\[([^\]]*)\]")


def expand_hostlist(hostlist: str) -> tuple[str, ...]:
    """``gpu-[0-2,5],cpu-1`` → ``("gpu-0", "gpu-1", "gpu-2", "gpu-5", "cpu-1")`` (zero padding
    kept: ``n[08-10]`` → n08, n09, n10). Empty, ``(null)`` and ``None assigned`` → ()."""
    hostlist = hostlist.strip()
    if not hostlist or hostlist in ("(null)", "None assigned", "n/a"):
        return ()
    items: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(hostlist):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(hostlist[start:i])
            start = i + 1
    items.append(hostlist[start:])
    out: list[str] = []
    for item in (x.strip() for x in items):
        if item:
            out.extend(_expand_one(item))
    return tuple(out)


def _expand_one(item: str) -> list[str]:
    m = _RANGE.search(item)
    if not m:
        return [item]
    head, tail = item[:m.start()], item[m.end():]
    names: list[str] = []
    for part in m.group(1).split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            width = len(lo) if lo.startswith("0") else 0
            names += [f"{head}{n:0{width}d}" for n in range(int(lo), int(hi) + 1)]
        elif part:
            names.append(f"{head}{part}")
    return [x for n in names for x in _expand_one(n + tail)]


def parse_squeue(text: str) -> list[SlurmJob]:
    """``squeue -h -O SQUEUE_FIELDS`` output → jobs (lines that do not parse are skipped)."""
    jobs: list[SlurmJob] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(SEP)]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        parts += [""] * (6 - len(parts))
        comment = SEP.join(parts[5:]).strip()
        jobs.append(SlurmJob(
            id=int(parts[0]), state=parts[1].upper(), nodes=expand_hostlist(parts[2]),
            requeue=parts[3] in ("1", "yes", "true"), name=_null(parts[4]), comment=_null(comment)))
    return jobs


def _null(text: str) -> str:
    return "" if text in ("(null)", "N/A") else text


# ---------------------------------------------------------------------------------------------
# slurmrestd JSON (v0.0.38 .. v0.0.45)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, Mapping):  # never expected for text fields, tolerate it
        return ""
    return str(value)


def parse_node_json(obj: Mapping[str, Any]) -> SlurmNodeState:
    """A node object of ``GET /slurm/v0.0.XX/node(s)``: ``state`` as a string (v0.0.38) or an
    array (v0.0.39+), ``state_flags`` (v0.0.38), ``reason``, ``reason_set_by_user``,
    ``features``, ``gres`` and ``topology`` (v0.0.44, Slurm >= 25.05: the node's dynamic
    topology string, as set by ``topology_str``; absent, null or not a string → "" = not
    reported)."""
    name = _text(obj.get("name"))
    if not name:
        raise ValueError("slurmrestd node object without a name")
    raw = obj.get("state", "")
    state: str | list[str] = raw if isinstance(raw, str) else [str(x) for x in raw or ()]
    extra = [str(x) for x in obj.get("state_flags") or ()]
    base, flags = parse_state(state, extra)
    topo = obj.get("topology")
    return _node(name, base, flags, _text(obj.get("reason")), _text(obj.get("reason_set_by_user")),
                 topo.strip() if isinstance(topo, str) else "",
                 _epoch(obj.get("reason_changed_at")), reports_topology=isinstance(topo, str),
                 features=_features(obj.get("features")), gres=_gres(obj.get("gres")))


def _epoch(raw: Any) -> str:
    """slurmrestd's ``reason_changed_at`` (seconds, or a no-val struct ``{"set", "number"}``)
    as UTC ISO 8601; "" when absent, unset, or not a plausible time (before 2001)."""
    if isinstance(raw, Mapping):
        raw = raw.get("number") if raw.get("set", True) else None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 1e9 <= raw < 1e11:
        return ""
    return rfc3339(raw)


def _job_id(obj: Mapping[str, Any]) -> int:
    raw = obj.get("job_id")
    if isinstance(raw, Mapping):  # no-val struct {"set": true, "number": N}
        raw = raw.get("number")
    if isinstance(raw, bool) or not isinstance(raw, int | str) or not str(raw).isdigit():
        raise ValueError(f"slurmrestd job object without a job_id: {raw!r}")
    return int(raw)


def parse_job_json(obj: Mapping[str, Any]) -> SlurmJob:
    """A job object of ``GET /slurm/v0.0.XX/jobs``: ``job_state`` a string (≤ v0.0.39) or an
    array whose first element is the base state (v0.0.40+), ``nodes`` a hostlist."""
    raw = obj.get("job_state", "")
    if isinstance(raw, str):
        state = raw.upper()
    else:
        states = [str(x).upper() for x in raw or ()]
        state = states[0] if states else ""
    requeue = obj.get("requeue", False)
    return SlurmJob(id=_job_id(obj), state=state, nodes=expand_hostlist(_text(obj.get("nodes"))),
                    name=_text(obj.get("name")), comment=_text(obj.get("comment")),
                    requeue=bool(requeue) if isinstance(requeue, bool | int) else False)


# ---------------------------------------------------------------------------------------------
# scontrol / squeue / scancel error text

_TRANSIENT = (
    "unable to contact slurm controller",
    "slurm_receive_msg",
    "socket timed out",
    "communication connection failure",
    "connection refused",
    "slurm backup controller in standby mode",
    "slurmctld is busy",
    "resource temporarily unavailable",
    "zero bytes were transmitted or received",
    "unexpected message received",
    "could not establish a configuration source",
)
_NOT_FOUND = re.compile(r"invalid node name|\bnode \S+ not found")
_PERMANENT = (
    "invalid job id",
    "invalid user id",
    "access/permission denied",
    "requested operation is presently disabled",
    "only batch jobs are accepted or processed",
    "invalid node state",
)


def scontrol_error_kind(text: str) -> str:
    """Classify a Slurm client's error text: ``"transient"`` (slurmctld unreachable or busy),
    ``"not_found"`` (unknown node), ``"permanent"`` (refused) or ``""`` (unknown)."""
    low = text.lower()
    if any(s in low for s in _TRANSIENT):
        return "transient"
    if _NOT_FOUND.search(low):
        return "not_found"
    if any(s in low for s in _PERMANENT):
        return "permanent"
    return ""
