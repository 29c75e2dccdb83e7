"""Records as ``NodeRemediation`` objects: the StateStore port on a real API server."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from healer.adapters.kube.client import call, to_dict
from healer.adapters.kube.crd import GROUP, PLURAL, VERSION, from_object, to_object
from healer.adapters.kube.nodes import _ts
from healer.core.model import NodeRecord
from healer.errors import ConflictError, NotFoundError, PermanentError
from healer.ports import StoredRecord


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
                created = await call(f"create noderemediation {name}", lambda:
                                     self.co.create_cluster_custom_object(
                                         GROUP, VERSION, PLURAL, body))
                rv = str(to_dict(self.api, created)["metadata"]["resourceVersion"])
            except ConflictError:
                # it exists already (we crashed after creating it): write status over it
                current = await self.get(name)
                if current.record.incident.id != record.incident.id:
                    raise
                rv = current.resource_version
            previous = StoredRecord(record, name, rv)
        body = to_object(record, name, previous.resource_version)
        try:
            updated = await call(f"update noderemediation {name} status", lambda:
                                 self.co.replace_cluster_custom_object_status(
                                     GROUP, VERSION, PLURAL, name, body))
        except NotFoundError:
            # deleted under us (an admin removed it): recreate so intent is never lost
            return await self.save(record, None)
        meta = to_dict(self.api, updated)["metadata"]
        return StoredRecord(record, name, str(meta["resourceVersion"]),
                            _ts(meta.get("creationTimestamp")))

    async def delete(self, name: str) -> None:
        try:
            await call(f"delete noderemediation {name}", lambda:
                       self.co.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name))
        except NotFoundError:
            return
