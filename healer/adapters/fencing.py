"""Fencing a dead node (the Fencing port): who says its machine is off or cut off.

Nothing irreversible happens to a dead node (no out-of-service taint, so no pod of it is
force-deleted) until one of its policy's providers says so:

* ``manual``: an admin annotated the Node ``healer.io/fenced=<who and why>``;
* ``cloudShutdown``: the cloud controller manager put its
  ``node.cloudprovider.kubernetes.io/shutdown`` taint on the Node;
* ``nodeDeleted``: the Node object is gone (the cloud deleted the instance);
* ``webhook``: healer POSTs the fencing request once per incident (signed with the fencing
  hook's own key, like every webhook: :class:`healer.adapters.hooks.WebhookHook`; the
  ``healer.io/fence-requested`` annotation records that it was sent, so a new leader does not
  send it again), the receiver powers the machine off through its BMC or cloud API and
  acknowledges ``fenced`` through healer's ack endpoint (:mod:`healer.adapters.acks`), which
  writes ``healer.io/fence-ack: <incident>`` on the Node.

Every answer is read from the Node, so it survives a restart and any system can give it with
the RBAC it already has. A webhook that fails (refused, unreachable) is not the end: the step
stays PENDING, saying so, while the other providers may still answer; the fence deadline then
holds the node (HeldForFencing), and nothing is force-deleted.
"""

from __future__ import annotations

from healer.adapters.clock import SYSTEM_CLOCK
from healer.adapters.hooks import WebhookHook
from healer.core.model import FenceProvider, StepKey
from healer.core.timefmt import rfc3339
from healer.core.vocabulary import (
    CLOUD_SHUTDOWN_TAINT,
    FENCE_ACK,
    FENCE_REQUESTED,
    FENCED_ANNOTATION,
)
from healer.errors import HealerError, NotFoundError
from healer.ports import (
    Clock,
    FenceSpec,
    HookKind,
    HookResult,
    HookSpec,
    NodeAPI,
    StepOutcome,
)

__all__ = ["KubeFencing"]


def _done(provider: FenceProvider, by: str) -> HookResult:
    return HookResult(StepOutcome.DONE, "",
                      {StepKey.PROVIDER: provider.value, StepKey.BY: by[:250]})


class KubeFencing:
    """The Fencing port on the Kubernetes Node (see the module docstring)."""

    def __init__(self, nodes: NodeAPI, webhook: WebhookHook, *, callback_url: str = "",
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock  # a request's sentAt
        self.nodes = nodes
        self.webhook = webhook
        self.callback_url = callback_url

    async def fence(self, incident: str, node: str, spec: FenceSpec) -> HookResult:
        ways = spec.providers
        try:
            view = await self.nodes.get(node)
        except NotFoundError:
            if FenceProvider.NODE_DELETED in ways:
                return _done(FenceProvider.NODE_DELETED, "the Node object was deleted")
            return HookResult(StepOutcome.PENDING, "the Node object is gone, but nodeDeleted "
                                                   "is not one of the policy's fencing "
                                                   "providers")
        ann = view.annotations
        if FenceProvider.MANUAL in ways and ann.get(FENCED_ANNOTATION):
            return _done(FenceProvider.MANUAL, f"{FENCED_ANNOTATION}: {ann[FENCED_ANNOTATION]}")
        if FenceProvider.CLOUD_SHUTDOWN in ways:
            taint = next((t for t in view.taints if t.key == CLOUD_SHUTDOWN_TAINT), None)
            if taint is not None:
                return _done(FenceProvider.CLOUD_SHUTDOWN,
                             f"taint {taint.key}:{taint.effect} (the cloud shut it down)")
        waiting = sorted(p.value for p in ways)
        if FenceProvider.WEBHOOK in ways:
            if ann.get(FENCE_ACK) == incident:
                return _done(FenceProvider.WEBHOOK, "the fencing webhook's receiver "
                                                    "acknowledged: the machine is off")
            if ann.get(FENCE_REQUESTED) != incident:
                try:
                    await self._request(incident, node, spec)
                except HealerError as e:
                    return HookResult(StepOutcome.PENDING, f"the fencing webhook failed "
                                                           f"({e}); waiting for "
                                                           f"{', '.join(waiting)}")
                await self.nodes.patch_metadata(node, annotations={FENCE_REQUESTED: incident})
                return HookResult(StepOutcome.PENDING, "fencing webhook sent; waiting for its "
                                                       "fenced acknowledgement")
        return HookResult(StepOutcome.PENDING, "waiting for a fencing provider ("
                                               f"{', '.join(waiting) or 'none'}) to say the "
                                               "machine is off or cut off")

    async def _request(self, incident: str, node: str, spec: FenceSpec) -> None:
        await self.webhook.post("fence", HookSpec(HookKind.WEBHOOK, url=spec.url,
                                                  secret_ref=spec.secret_ref), {
            "incident": incident, "node": node, "action": "fence",
            "deadline": rfc3339(spec.deadline) if spec.deadline else "",
            "callback": self.callback_url, "sentAt": self.clock.now()})
