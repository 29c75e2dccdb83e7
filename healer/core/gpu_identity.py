"""GPU identity in a node condition: the agent's machine-readable block, and using it.

healer's agent ends its ``GPUHealthy`` message with one block naming every GPU it read (at
most :data:`MAX_GPUS`), those with a finding marked ``*``::

    GPU 2 GPU-5d3c…: XID 79 GPU_HAS_FALLEN_OFF_THE_BUS
    [healer.io/gpus v1 *2:GPU-5d3c…:1651… 0:GPU-1a…:1650…]

(one line; wrapped here).

Format ``v1``: the tag (:data:`healer.core.vocabulary.GPU_IDENTITY_TAG`), the version, then
space-separated entries ``[*]index:uuid:serial``; a field may be empty (unknown), and a field
holds only ``A-Z a-z 0-9 . _ -`` (an index only digits). The block is the message's last
``[tag …]``. Another version, a block over :data:`MAX_BLOCK_CHARS` or more than
:data:`MAX_GPUS` entries is ignored whole; a malformed entry is skipped. A node's conditions
are writable by whoever may patch the node, so :func:`split_message` and :func:`parse_entries`
are total: any text gives an answer, never an exception. What conflicts identifies nothing:
a message with two blocks, a block in which one index, UUID or serial names two GPUs. The
block is read only from the agent's own condition (``GPUHealthy``, its message written by the
agent's field manager, one such condition on the node: :func:`healer.core.signals.
identity_condition`).

A CONDITION signal carries its block's entries (:data:`DETAIL_KEY`): :func:`signal_identities`
reads them back and :func:`serials_by_uuid` joins UUIDs to serials; every verdict's GPUs are
named from them (:mod:`healer.core.verdict_gpus`).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from healer.core.model import GpuRef, Signal, SignalKind
from healer.core.vocabulary import GPU_IDENTITY_TAG

#: The format written and the only one read.
VERSION = "v1"
#: At most this many GPUs in one block (affected ones first when a node has more).
MAX_GPUS = 16
#: The longest field (a UUID is 40 characters, a board serial 13).
MAX_FIELD = 64
#: The longest block read (a longer one is ignored whole).
MAX_BLOCK_CHARS = len(GPU_IDENTITY_TAG) + 8 + MAX_GPUS * (2 * MAX_FIELD + 8)
#: ``detail`` key of a CONDITION signal holding its block's entries.
DETAIL_KEY = "gpus"

_OPEN = f"[{GPU_IDENTITY_TAG} "
_FIELD = re.compile(rf"[A-Za-z0-9._-]{{0,{MAX_FIELD}}}")
_INDEX = re.compile(r"[0-9]{0,4}")


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """One GPU the block names; ``affected``: it has a finding (marked ``*``)."""

    gpu: GpuRef
    affected: bool = False


def _clean(text: str) -> str:
    return text if _FIELD.fullmatch(text) else ""


def format_entries(gpus: Iterable[GpuIdentity]) -> str:
    """The entries of a block (``*2:GPU-…:1651 3:GPU-…:1652``): affected GPUs first, then by
    index, at most :data:`MAX_GPUS`; a field that does not fit the format is left empty."""
    chosen = sorted(gpus, key=lambda g: (not g.affected, g.gpu.index, g.gpu.uuid))[:MAX_GPUS]
    out = []
    for g in chosen:
        index = str(g.gpu.index) if 0 <= g.gpu.index <= 9999 else ""
        out.append(f"{'*' if g.affected else ''}{index}:{_clean(g.gpu.uuid)}:"
                   f"{_clean(g.gpu.serial)}")
    return " ".join(out)


def format_block(gpus: Iterable[GpuIdentity]) -> str:
    """The block the agent appends to its message (``[healer.io/gpus v1 …]``)."""
    entries = format_entries(gpus)
    return f"{_OPEN}{VERSION}{' ' + entries if entries else ''}]"


def with_block(message: str, gpus: Iterable[GpuIdentity]) -> str:
    """``message`` followed by the block of ``gpus``."""
    return f"{message} {format_block(gpus)}" if message else format_block(gpus)


@functools.lru_cache(maxsize=1024)  # keys are bounded (MAX_BLOCK_CHARS): about 2 MiB at most
def parse_entries(text: str) -> tuple[GpuIdentity, ...]:
    """The entries of a block (or of a signal's :data:`DETAIL_KEY`); malformed ones skipped,
    duplicates (same index, UUID and serial) once; ``()`` for too many or too long. Memoised:
    a node's block is read again at every evaluation and rarely changes."""
    if len(text) > MAX_BLOCK_CHARS:
        return ()
    tokens = text.split()
    if len(tokens) > MAX_GPUS:
        return ()
    out: dict[GpuRef, bool] = {}
    for token in tokens:
        affected = token.startswith("*")
        fields = token.removeprefix("*").split(":")
        if len(fields) != 3:
            continue
        index, uuid, serial = fields
        if not (_INDEX.fullmatch(index) and _FIELD.fullmatch(uuid) and _FIELD.fullmatch(serial)):
            continue
        if not (index or uuid or serial):
            continue
        ref = GpuRef(int(index) if index else -1, uuid, serial)
        out[ref] = out.get(ref, False) or affected
    if _conflicting(out):
        return ()
    return tuple(GpuIdentity(ref, affected) for ref, affected in out.items())


def _conflicting(refs: Iterable[GpuRef]) -> bool:
    """Does one index, UUID or serial stand for two different GPUs? (A block that says so
    identifies nothing: no identity beats the wrong one.)"""
    seen: tuple[dict[object, GpuRef], ...] = ({}, {}, {})
    for ref in refs:
        for by, key in zip(seen, (ref.index if ref.index >= 0 else None, ref.uuid or None,
                                  ref.serial or None), strict=True):
            if key is None:
                continue
            other = by.setdefault(key, ref)
            if other != ref:
                return True
    return False


def split_message(message: str) -> tuple[str, str]:
    """``message`` without its block, and the block's entries (``""`` when it has none, or
    the block is not a readable ``v1`` one: then the message is returned as it is)."""
    start = message.rfind(_OPEN)
    if start < 0:
        return message, ""
    if message.find(_OPEN) != start:  # two blocks: which one is true is anyone's guess
        return message, ""
    end = message.find("]", start)
    if end < 0 or end - start > MAX_BLOCK_CHARS:
        return message, ""
    body = message[start + len(_OPEN):end]
    version, _, entries = body.partition(" ")
    if version != VERSION:
        return message, ""
    parsed = parse_entries(entries)
    if entries.strip() and not parsed:
        return message, ""
    rest = (message[:start].rstrip() + " " + message[end + 1:].lstrip()).strip()
    return rest, format_entries(parsed)


def signal_identities(s: Signal) -> tuple[GpuIdentity, ...]:
    """The GPUs a CONDITION signal's block named (``()`` for any other signal)."""
    if s.kind is not SignalKind.CONDITION:
        return ()
    entries = s.get(DETAIL_KEY)
    return parse_entries(entries) if entries else ()


def serials_by_uuid(signals: Iterable[Signal]) -> dict[str, str]:
    """UUID → serial from the newest block of each condition type among ``signals``."""
    newest: dict[str, Signal] = {}
    for s in signals:
        if s.kind is SignalKind.CONDITION and s.get(DETAIL_KEY):
            old = newest.get(s.key)
            if old is None or s.observed_at >= old.observed_at:
                newest[s.key] = s
    out: dict[str, str] = {}
    for s in newest.values():
        for g in signal_identities(s):
            if g.gpu.uuid and g.gpu.serial:
                out.setdefault(g.gpu.uuid, g.gpu.serial)
    return out
