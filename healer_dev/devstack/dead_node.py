"""A node that dies outright, on the local stack: what makes it look dead to everything that
watches it (kube-controller-manager, the slurm-operator, Slurm, healer).

* :func:`stop_heartbeat`: kwok stops heartbeating the Node, and finishes no deletion of the
  pods bound to it (each gets the annotation :data:`~healer_dev.devstack.kwok.DEAD_NODE_POD`,
  which kwok's pod-gone Stage skips: kwok decides whom a Node belongs to from its own copy of
  the Lease, and was seen finishing a graceful deletion there 20 s after the takeover, which
  looked like a force delete). Its Lease is taken over by
  :data:`DEAD_HOLDER` for an hour and never renewed: kwok then treats the Node (and the pods
  bound to it) as someone else's and leaves them alone, and kube-controller-manager's node
  lifecycle controller, seeing the Lease's renewTime stand still, marks the Node
  ``Ready=Unknown`` after its ``--node-monitor-grace-period`` and taints it
  ``node.kubernetes.io/unreachable``, as for a real dead kubelet.
* :func:`resume_heartbeat`: the kubelet is back: its pods lose the annotation (kwok finishes
  a deletion that waited, as the returning kubelet would), the Lease is released (kwok takes a Lease
  nobody holds at its next renewal, within a quarter of the Lease's duration) and the Node
  posts ``Ready=True`` again, as a restarted kubelet does (kwok writes Ready only when it
  first sees a Node).

The pod side (no preStop, slurmds killed or frozen) is the pod runtime's
(:meth:`healer_dev.devstack.podruntime.PodRuntime.kill_node`);
:meth:`healer_dev.devstack.slinky_stack.SlinkyStack.kill_node` does both.
"""

from __future__ import annotations

import time
from typing import Any

from healer.errors import ConfigError
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import DEAD_NODE_POD

__all__ = ["DEAD_HOLDER", "mark_pods", "resume_heartbeat", "stop_heartbeat"]

#: The holder of a dead Node's Lease (kwok's is a random identity per process).
DEAD_HOLDER = "devstack-dead-node"
_LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def _update(kube: KubeStack, path: str, change: Any, what: str) -> dict[str, Any]:
    """GET ``path``, ``change`` the object in place, PUT it back (again on a conflict)."""
    for _ in range(20):
        code, obj = kube.request("GET", path)
        if code != 200:
            raise ConfigError(f"cannot read {what}: HTTP {code} {obj}")
        change(obj)
        code, body = kube.request("PUT", path, obj)
        if code == 200:
            return dict(body)
        if code != 409:
            raise ConfigError(f"cannot update {what}: HTTP {code} {body}")
    raise ConfigError(f"cannot update {what}: it kept changing (20 conflicts)")


def mark_pods(kube: KubeStack, node: str, *, dead: bool) -> None:
    """Put :data:`DEAD_NODE_POD` on every pod bound to ``node`` (or take it off)."""
    code, pods = kube.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")
    if code != 200:
        raise ConfigError(f"cannot list the pods of Node {node}: HTTP {code} {pods}")

    def mark(obj: dict[str, Any]) -> None:
        notes = obj["metadata"].setdefault("annotations", {})
        if dead:
            notes[DEAD_NODE_POD] = "true"
        else:
            notes.pop(DEAD_NODE_POD, None)

    for pod in pods.get("items") or []:
        meta = pod["metadata"]
        if (DEAD_NODE_POD in (meta.get("annotations") or {})) == dead:
            continue
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        try:
            _update(kube, path, mark, f"pod {meta['namespace']}/{meta['name']}")
        except ConfigError:
            code, _ = kube.request("GET", path)
            if code != 404:  # gone meanwhile: nothing to mark
                raise


def stop_heartbeat(kube: KubeStack, node: str) -> None:
    """kwok stops heartbeating ``node`` and finishing its pods' deletions (see the module
    docstring)."""
    mark_pods(kube, node, dead=True)

    def take(lease: dict[str, Any]) -> None:
        lease["spec"].update(holderIdentity=DEAD_HOLDER, leaseDurationSeconds=3600,
                             renewTime=_now())

    _update(kube, f"{_LEASES}/{node}", take, f"the Lease of Node {node}")


def resume_heartbeat(kube: KubeStack, node: str) -> None:
    """``node``'s kubelet is back (see the module docstring)."""
    def release(lease: dict[str, Any]) -> None:
        lease["spec"].pop("holderIdentity", None)
        lease["spec"].update(leaseDurationSeconds=40, renewTime=_now())

    mark_pods(kube, node, dead=False)
    _update(kube, f"{_LEASES}/{node}", release, f"the Lease of Node {node}")

    def ready(obj: dict[str, Any]) -> None:
        now = _now().split(".")[0] + "Z"
        conds = [c for c in (obj.get("status") or {}).get("conditions") or []
                 if c.get("type") != "Ready"]
        conds.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                      "message": "kubelet is posting ready status (back from the dead)",
                      "lastHeartbeatTime": now, "lastTransitionTime": now})
        obj.setdefault("status", {})["conditions"] = conds

    _update(kube, f"/api/v1/nodes/{node}/status", ready, f"the status of Node {node}")
