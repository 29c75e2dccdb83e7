"""``POST /v1/hooks/ack``: a webhook receiver's signed, late answer, written to the Node.

The contract (docs/checkpoint-hooks.md):

* ``Content-Type: application/json``, a body of at most :data:`MAX_BODY` bytes;
* the body is one JSON object ``{"incident", "node", "kind", "timestamp", "nonce"}`` (plus
  ``"result": "passed"|"failed"|"no-fault"`` for ``kind: repair``; ``no-fault``: passed, and
  the repair found nothing to fix; ``kind: fenced``: a dead node's fencing webhook says its
  machine is off, accepted only while the incident waits for fencing); ``timestamp`` is Unix
  seconds and must
  be within :data:`WINDOW` of healer's clock; ``nonce`` is 16 to 128 characters, never reused;
* ``X-Healer-Signature: sha256=<hex HMAC-SHA256 of the body>`` with the key of *that kind's*
  webhook in the incident's policy (the checkpoint hook's ``secretRef`` for a checkpoint ack,
  the repair hook's for a repair result);
* the incident must be one healer knows, and ``node`` must be its node.

Every bad request gets a 4xx and writes nothing; a valid one writes exactly one annotation.
Replays are refused by a nonce cache that holds each nonce only while its timestamp could
still be accepted, and never more than :data:`MAX_NONCES` of them (beyond that: 429), so
nothing grows with uptime. A failure to read the key or to write the Node is a 503.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from healer.adapters.clock import SYSTEM_CLOCK
from healer.core.machine.triggers import REPAIR_NO_FAULT
from healer.core.model import FenceProvider
from healer.core.phases import Phase
from healer.core.vocabulary import (
    CHECKPOINT_ACK,
    FENCE_ACK,
    REPAIR_INCIDENT,
    REPAIR_RESULT,
    StepName,
)
from healer.errors import HealerError
from healer.ports import Clock, HookKind, NodeAPI

from .hooks import verify

MAX_BODY = 16 * 1024
WINDOW = 300.0
MAX_NONCES = 10_000
KINDS = ("checkpoint", "repair", "fenced")

log = structlog.get_logger("healer.acks")


class KeySource(Protocol):
    async def key(self, ref: str) -> bytes: ...


@dataclass(frozen=True)
class AckTarget:
    """What healer knows about an incident: its node and the secretRef of each webhook."""

    node: str
    secret_refs: Mapping[str, str] = field(default_factory=dict)  # kind → namespace/name[:key]
    awaiting_fence: bool = False  # the incident's dead node waits for a fencing provider


def target_of(record: Any, policy: Any) -> AckTarget | None:
    """The :class:`AckTarget` of a NodeRecord under its compiled policy (None: unknown)."""
    if record is None or policy is None:
        return None
    st = policy.steps
    refs = {k: h.secret_ref for k, h in (("checkpoint", st.checkpoint), ("repair", st.repair))
            if h.hook is HookKind.WEBHOOK and h.secret_ref}
    fencing = policy.dead.fencing
    if policy.dead.enabled and FenceProvider.WEBHOOK in fencing.providers and \
            fencing.secret_ref:
        refs["fenced"] = fencing.secret_ref
    fence = record.step(StepName.FENCE)
    awaiting = record.phase in (Phase.DEAD, Phase.HELD_FOR_FENCING) and fence is not None \
        and not fence.done
    return AckTarget(str(record.node), refs, awaiting)


class Reject(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


class NonceCache:
    """Nonces seen, each kept until its timestamp leaves the window; at most ``cap``."""

    def __init__(self, cap: int = MAX_NONCES) -> None:
        self.cap = cap
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce → expiry, in expiry order

    def __len__(self) -> int:
        return len(self._seen)

    def check(self, nonce: str, expires: float, now: float) -> None:
        while self._seen:
            oldest, exp = next(iter(self._seen.items()))
            if exp > now:
                break
            del self._seen[oldest]
        if nonce in self._seen:
            raise Reject(409, "replayed ack: that nonce was already used")
        if len(self._seen) >= self.cap:
            raise Reject(429, "too many acks in the replay window; retry later")

    def add(self, nonce: str, expires: float) -> None:
        self._seen[nonce] = expires
        # keep expiry order (timestamps arrive roughly in order; a late one goes to the end,
        # which only keeps it a little longer than needed)
        self._seen.move_to_end(nonce)

    def discard(self, nonce: str) -> None:
        self._seen.pop(nonce, None)


def _str(msg: Mapping[str, Any], name: str, lo: int = 1, hi: int = 253) -> str:
    v = msg.get(name)
    if not isinstance(v, str) or not lo <= len(v) <= hi or not v.isprintable():
        raise Reject(400, f"{name}: expected a string of {lo}-{hi} printable characters")
    return v


def parse(body: bytes, content_type: str) -> dict[str, Any]:
    """The request's JSON object, or :class:`Reject` (415, 413, 400) saying what is wrong."""
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise Reject(415, "expected Content-Type: application/json")
    if len(body) > MAX_BODY:
        raise Reject(413, f"body over {MAX_BODY} bytes")
    try:
        msg = json.loads(body.decode("utf-8"))  # UTF-8 only (RFC 8259), no BOM sniffing
    except (ValueError, RecursionError):
        raise Reject(400, "expected a JSON object in UTF-8") from None
    if not isinstance(msg, dict):
        raise Reject(400, "expected a JSON object")
    return msg


class AckReceiver:
    """``POST /v1/hooks/ack``; ``target`` looks an incident up (None: unknown)."""

    def __init__(self, nodes: NodeAPI, secrets: KeySource,
                 target: Callable[[str], AckTarget | None], *,
                 clock: Clock = SYSTEM_CLOCK, window: float = WINDOW,
                 max_nonces: int = MAX_NONCES) -> None:
        self.nodes = nodes
        self.secrets = secrets
        self.target = target
        self.clock = clock
        self.window = window
        self.nonces = NonceCache(max_nonces)

    async def handle(self, body: bytes, signature: str,
                     content_type: str = "application/json") -> tuple[int, str]:
        try:
            return await self._handle(body, signature, content_type)
        except Reject as r:
            return r.status, r.text
        except HealerError as e:  # the key or the Node could not be read or written
            log.warning("ack not processed", error=str(e)[:300])
            return 503, "healer could not process the ack now; retry later"

    async def _handle(self, body: bytes, signature: str, content_type: str) -> tuple[int, str]:
        msg = parse(body, content_type)
        incident, node = _str(msg, "incident"), _str(msg, "node")
        kind = msg.get("kind")
        if kind not in KINDS:
            raise Reject(400, "kind: expected checkpoint, repair or fenced")
        raw_ts = msg.get("timestamp")
        try:
            if isinstance(raw_ts, bool) or not isinstance(raw_ts, int | float):
                raise ValueError
            ts = float(raw_ts)
            if not math.isfinite(ts):
                raise ValueError
        except (ValueError, OverflowError):
            raise Reject(400, "timestamp: expected Unix seconds (a number)") from None
        nonce = _str(msg, "nonce", 16, 128)
        result = ""
        if kind == "repair":
            result = msg.get("result")  # type: ignore[assignment]
            if result not in ("passed", "failed", REPAIR_NO_FAULT):
                raise Reject(400, f"result: expected passed, failed or {REPAIR_NO_FAULT}")
        tgt = self.target(incident)
        if tgt is None:
            raise Reject(404, f"unknown incident {incident!r}")
        ref = tgt.secret_refs.get(kind)
        if not ref:
            raise Reject(403, f"the incident's policy has no {kind} webhook")
        if not isinstance(signature, str) or not verify(await self.secrets.key(ref), body,
                                                        signature):
            raise Reject(403, "bad or missing signature")
        now = self.clock.now()
        if abs(now - ts) > self.window:
            raise Reject(403, f"timestamp outside ±{self.window:g}s of healer's clock")
        self.nonces.check(nonce, ts + self.window, now)
        if node != tgt.node:
            raise Reject(409, f"incident {incident} is on another node")
        if kind == "fenced" and not tgt.awaiting_fence:
            raise Reject(409, f"incident {incident} is not waiting for fencing")
        if kind == "repair":
            view = await self.nodes.get(node)
            if view.annotations.get(REPAIR_INCIDENT) != incident:
                raise Reject(409, "that node is not in repair for this incident")
        self.nonces.add(nonce, ts + self.window)  # before the write: a concurrent replay loses
        try:
            if kind == "checkpoint":
                await self.nodes.patch_metadata(node, annotations={CHECKPOINT_ACK: incident})
            elif kind == "fenced":
                await self.nodes.patch_metadata(node, annotations={FENCE_ACK: incident})
            else:
                await self.nodes.patch_metadata(node, annotations={REPAIR_RESULT: result})
        except BaseException:
            self.nonces.discard(nonce)  # not written: the sender may retry with the same nonce
            raise
        log.info("ack", incident=incident, node=node, kind=kind, result=result or None)
        return 200, "ok"
