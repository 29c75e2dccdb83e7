"""Slurm as a detector: what Slurm says about a node (DOWN, NOT_RESPONDING, FAIL, drained with
someone's reason) as one SLURM signal per node, delivered only when it changes.

The runtime's Slurm feed (:mod:`healer.runtime.slurm_feed`) hands every node's state to
:func:`next_finding` with the node's previous :class:`SlurmFinding`; when the finding changed it
sends :func:`finding_signal` (``None`` → a "nothing any more" signal). ``slurm:`` policy rules
(:class:`healer.core.rules.SlurmRule`) match it in :mod:`healer.core.health` through
:func:`finding_of`.

What counts (:func:`out_states`):

* ``DOWN`` (base state), ``NOT_RESPONDING``, ``FAIL`` (or FAILING) and ``DRAIN`` (not UNDRAIN);
* a drain whose reason is healer's own (``healer: ``) or the Slinky operator's
  (``slurm-operator: ``: a Kubernetes cordon mirrored, a pod being terminated) is bookkeeping,
  never a finding, so healer never reacts to its own drain (no feedback loop); the operator's
  ``DOWN`` (its preStop while a slurmd pod is deleted, e.g. during healer's own swap) neither;
* DOWN, NOT_RESPONDING and FAIL are Slurm's own findings whoever wrote the reason: when
  healer's drain replaces Slurm's reason on a DOWN node, the finding keeps the reason it had
  (the owner's words stay the evidence) instead of turning into a new one.

Each state carries the time the feed first saw it (``since``), the reason the time it last
changed, so ``for:`` is judged per state and reason without keeping any history. Text from
Slurm is bounded and made printable (:func:`bounded`): no reason, however long or hostile, can
grow a record, an Event or a log line.

Pure: no I/O, no clock (``now`` is passed in).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from healer.core.model import Signal, SignalKind
from healer.core.model import SlurmFinding as SlurmFinding  # its home is the model
from healer.core.text import bounded as _bounded
from healer.core.vocabulary import SLURM_REASON_PREFIX

#: The Slurm states a ``slurm:`` rule can name, in the order they are shown.
SLURM_STATES = ("DOWN", "NOT_RESPONDING", "FAIL", "DRAIN")
#: The prefix SchedMD's slurm-operator puts on every reason it writes.
OPERATOR_REASON_PREFIX = "slurm-operator: "
#: Without one of these flags (upper case, as every driver reports them) and not DOWN, a node
#: has no finding: the Slurm feed skips it without looking further.
OUT_FLAGS = frozenset({"NOT_RESPONDING", "FAIL", "FAILING", "DRAIN"})
#: The signal's source and key.
SOURCE = "slurm"
KEY = "slurm-state"
#: At most this many characters of a reason are kept (Slinky cuts its reasons at 256 too).
REASON_LIMIT = 256
#: At most this many characters of the reason's user and time.
WHO_LIMIT = 64
#: Longer input is cut before it is looked at, so the cost is bounded too.
_SCAN_LIMIT = 4 * REASON_LIMIT


def bounded(text: str, limit: int = REASON_LIMIT) -> str:
    """``text`` stripped, made printable (:func:`healer.core.text.bounded`: every character
    that does not print becomes U+FFFD) and cut to ``limit`` characters. Total."""
    return _bounded(text, limit, scan=_SCAN_LIMIT)


def reason_owner(reason: str) -> str:
    """Who wrote ``reason``: ``healer``, ``slurm-operator``, or "" (someone else: an admin,
    Slurm's HealthCheckProgram, slurmctld itself)."""
    if reason.startswith(SLURM_REASON_PREFIX):
        return "healer"
    if reason.startswith(OPERATOR_REASON_PREFIX):
        return "slurm-operator"
    return ""


def out_states(base: str, flags: AbstractSet[str], reason: str) -> frozenset[str]:
    """The :data:`SLURM_STATES` Slurm shows for a node, less healer's and the operator's own
    (see the module docstring)."""
    base = base.upper()
    flags = frozenset(f.upper() for f in flags)
    out: set[str] = set()
    if base == "DOWN":
        out.add("DOWN")
    if "NOT_RESPONDING" in flags:
        out.add("NOT_RESPONDING")
    if flags & {"FAIL", "FAILING"}:
        out.add("FAIL")
    if "DRAIN" in flags and "UNDRAIN" not in flags:
        out.add("DRAIN")
    owner = reason_owner(reason)
    if owner:
        out.discard("DRAIN")
    if owner == "slurm-operator":
        out.discard("DOWN")
    return frozenset(out)


def next_finding(previous: SlurmFinding | None, *, base: str, flags: AbstractSet[str],
                 reason: str = "", user: str = "", reason_time: str = "",
                 now: float) -> SlurmFinding | None:
    """The node's finding now (None: Slurm finds nothing wrong), given the one before."""
    states = out_states(base, flags, reason)
    if not states:
        return None
    before = dict(previous.states) if previous is not None else {}
    since = tuple((s, before.get(s, now)) for s in SLURM_STATES if s in states)
    if reason_owner(reason):  # healer's (or the operator's) words over a state Slurm found
        text, who, when = ((previous.reason, previous.user, previous.reason_time)
                           if previous is not None else ("", "", ""))
    else:
        text, who, when = bounded(reason), bounded(user, WHO_LIMIT), bounded(reason_time,
                                                                             WHO_LIMIT)
    kept = previous is not None and previous.reason == text
    reason_since = previous.reason_since if previous is not None and kept else now
    return SlurmFinding(since, text, reason_since, who, when)


def finding_signal(node: str, finding: SlurmFinding | None, now: float) -> Signal:
    """The SLURM signal of ``node``'s finding (None: Slurm finds nothing wrong any more)."""
    if finding is None:
        return Signal(node, SOURCE, SignalKind.SLURM, KEY, now, now, None, (("states", ""),))
    detail = {"states": ",".join(finding.names), "reason": finding.reason,
              "reasonSince": repr(finding.reason_since), "user": finding.user,
              "reasonTime": finding.reason_time}
    detail.update({f"since.{s}": repr(t) for s, t in finding.states})
    return Signal(node, SOURCE, SignalKind.SLURM, KEY, finding.since, now, None,
                  Signal.details(**detail), finding=finding)


def finding_of(signal: Signal) -> SlurmFinding | None:
    """The finding a SLURM signal carries (None: nothing). A signal made by
    :func:`finding_signal` carries it typed (``Signal.finding``) and is read as it is; only a
    signal read back from the wire (a record's evidence, a recorded scenario) is parsed from
    its detail, where unknown states and unreadable times are left out."""
    if signal.finding is not None:
        return signal.finding
    names = [s for s in signal.get("states").split(",") if s in SLURM_STATES]
    states = tuple((s, t) for s in names if (t := _time(signal.get(f"since.{s}"))) is not None)
    if not states:
        return None
    return SlurmFinding(states, signal.get("reason"), _time(signal.get("reasonSince")) or 0.0,
                        signal.get("user"), signal.get("reasonTime"))


def _time(text: str) -> float | None:
    try:
        t = float(text)
    except ValueError:
        return None
    return t if t == t and abs(t) < 1e12 else None
