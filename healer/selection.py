"""``healer validate --kubeconfig``: what each NodeSet (and policy) selects on the cluster now.

One label-only list of the Nodes (``list nodes`` through the kubeconfig's identity), counted by
:func:`healer.core.selection.census`: per ``SlurmNodeSet`` the nodes it selects and serves and
the warm spares it may claim; per policy the serving nodes it selects. A node that is both a
NodeSet's node and a warm spare, or a NodeSet that serves nothing, is a problem naming the
document. Failures (kubeconfig, API server, RBAC) are a one-line HealerError for the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass

from healer.adapters.kube.client import make_api_client
from healer.adapters.kube.nodes import KubeNodes
from healer.core.rules import PolicySet
from healer.core.selection import Census, census

__all__ = ["LiveReport", "live_report"]


@dataclass(frozen=True, slots=True)
class LiveReport:
    lines: tuple[str, ...]
    problems: tuple[str, ...]  # ``file:line: field: what`` each


async def live_report(policies: PolicySet, kubeconfig: str,
                      context: str | None = None) -> LiveReport:
    """List the cluster's Nodes once and count what ``policies`` select among them."""
    api = await make_api_client(kubeconfig, context)
    try:
        items, _ = await KubeNodes(api).list_raw()
    finally:
        await api.close()
    counted = census(policies, ((str((i.get("metadata") or {}).get("name", "")),
                                 dict((i.get("metadata") or {}).get("labels") or {}))
                                for i in items))
    return LiveReport(tuple(_lines(counted)), tuple(
        f"{ns.source}: spec.nodeSelector: {what}" for ns, what in counted.problems()))


def _lines(c: Census) -> list[str]:
    out = [f"cluster: {c.nodes} nodes, {c.fleet_spares} warm spares by the fleet's "
           "spareSelector"]
    for n in c.nodesets:
        taken = n.selected - n.serving
        note = f" ({taken} of its selected nodes belong to an earlier NodeSet)" if taken else ""
        out.append(f"nodeset {n.nodeset.name:20s} nodes={n.serving} spares={n.spares}{note}")
    for name, count in sorted(c.policies.items()):
        out.append(f"policy  {name:28s} nodes={count}")
    return out
