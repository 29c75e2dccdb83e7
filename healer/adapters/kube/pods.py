"""Pod eviction through the eviction API, honouring PodDisruptionBudgets."""

from __future__ import annotations

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from healer.adapters.kube.client import translate
from healer.errors import NotFoundError


class Evicted:
    """Outcome of an eviction request."""

    DONE = "evicted"
    BLOCKED = "blocked by a PodDisruptionBudget"
    GONE = "already gone"


async def evict(api: client.ApiClient, namespace: str, name: str, uid: str | None = None) -> str:
    """Ask to evict a pod. 429 means a PDB does not allow it now (try later); a changed uid
    (the pod was replaced) or a missing pod means there is nothing to evict."""
    core = client.CoreV1Api(api)
    body: dict[str, object] = {"apiVersion": "policy/v1", "kind": "Eviction",
                               "metadata": {"name": name, "namespace": namespace}}
    if uid:
        body["deleteOptions"] = {"preconditions": {"uid": uid}}
    try:
        await core.create_namespaced_pod_eviction(name, namespace, body)  # type: ignore[arg-type]
    except ApiException as e:
        if e.status == 429:
            return Evicted.BLOCKED
        if e.status in (404, 409):
            return Evicted.GONE
        raise translate(e, f"evict pod {namespace}/{name}") from e
    except NotFoundError:
        return Evicted.GONE
    except Exception as e:
        raise translate(e, f"evict pod {namespace}/{name}") from e
    return Evicted.DONE
