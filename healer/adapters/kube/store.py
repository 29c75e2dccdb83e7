"""Records as ``NodeRemediation`` objects: the StateStore port on a real API server, and
:func:`ensure_crd`, which makes sure the API server serves them before the daemon starts."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from kubernetes_asyncio import client

from healer.adapters.kube.client import call, plain_json, to_dict
from healer.adapters.kube.crd import GROUP, PLURAL, VERSION, crd_manifest, from_object, to_object
from healer.adapters.kube.nodes import _ts
from healer.core.model import NodeRecord
from healer.errors import ConfigError, ConflictError, HealerError, NotFoundError, PermanentError
from healer.ports import StoredRecord


async def ensure_crd(api: client.ApiClient, install: bool) -> None:
    """The NodeRemediation CRD is installed and served; with ``install``, install it when it
    is not. A CRD that is missing (without ``install``) or unreadable is a ConfigError."""
    ext = client.ApiextensionsV1Api(api)
    body = crd_manifest()
    name = body["metadata"]["name"]
    try:
        await call(f"get CRD {name}", lambda: ext.read_custom_resource_definition(name))
        return
    except NotFoundError as e:
        if not install:
            raise ConfigError(f"the {name} CustomResourceDefinition is not installed "
                              f"({e}); apply deploy/crds/ first") from e
    except HealerError as e:  # unreachable, refused, forbidden: say so, not "not installed"
        raise ConfigError(f"cannot read the {name} CustomResourceDefinition from the API "
                          f"server: {e}") from e
    with contextlib.suppress(ConflictError):
        await call(f"create CRD {name}", lambda: ext.create_custom_resource_definition(body))  # type: ignore[arg-type]
    co = client.CustomObjectsApi(api)
    for _ in range(100):  # wait until the new resource is served
        try:
            await co.list_cluster_custom_object(GROUP, VERSION, PLURAL)
            return
        except Exception:
            await asyncio.sleep(0.1)  # polls the API server at start-up, in real time
    raise ConfigError(f"{name} was created but is not served")


def _stored(raw: dict[str, Any]) -> StoredRecord:
    meta = raw["metadata"]
    try:
        record = from_object(raw)
    except (ValueError, KeyError, TypeError) as e:
        # e.g. written by a newer healer (formatVersion): never guess, never overwrite it
        raise PermanentError(f"NodeRemediation {meta.get('name')}: cannot be read: "
                             f"{e!s}") from e
    return StoredRecord(record, str(meta["name"]), str(meta.get("resourceVersion", "")),
                        _ts(meta.get("creationTimestamp")))


class CRStateStore:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.co = client.CustomObjectsApi(api)

    async def list(self) -> list[StoredRecord]:
        raw = to_dict(self.api, await call("list noderemediations", lambda:
                                           self.co.list_cluster_custom_object(
                                               GROUP, VERSION, PLURAL)))
        return [_stored(i) for i in raw.get("items") or []]

    async def get(self, name: str) -> StoredRecord:
        raw = await call(f"get noderemediation {name}", lambda:
                         self.co.get_cluster_custom_object(GROUP, VERSION, PLURAL, name))
        return _stored(to_dict(self.api, raw))

    async def save(self, record: NodeRecord, previous: StoredRecord | None) -> StoredRecord:
        name = previous.name if previous is not None else record.incident.id
        if previous is None:
            body = to_object(record, name)
            try:
                created = await call(f"create noderemediation {name}", lambda: plain_json(
                    lambda **kw: self.co.create_cluster_custom_object(
                        GROUP, VERSION, PLURAL, body, **kw)))
                rv = str(created["metadata"]["resourceVersion"])
            except ConflictError:
                # it exists already (we crashed after creating it): write status over it
                current = await self.get(name)
                if current.record.incident.id != record.incident.id:
                    raise
                rv = current.resource_version
            previous = StoredRecord(record, name, rv)
        body = to_object(record, name, previous.resource_version)
        try:
            updated = await call(f"update noderemediation {name} status", lambda: plain_json(
                lambda **kw: self.co.replace_cluster_custom_object_status(
                    GROUP, VERSION, PLURAL, name, body, **kw)))
        except NotFoundError:
            # deleted under us (an admin removed it): recreate so intent is never lost
            return await self.save(record, None)
        meta = updated["metadata"]
        return StoredRecord(record, name, str(meta["resourceVersion"]),
                            _ts(meta.get("creationTimestamp")))

    async def delete(self, name: str) -> None:
        try:
            await call(f"delete noderemediation {name}", lambda:
                       self.co.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name))
        except NotFoundError:
            return
