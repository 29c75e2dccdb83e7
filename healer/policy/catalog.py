"""Load the XID catalog shipped as data (``healer/data/xid-catalog.yaml``)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml

from healer.core.model import Severity
from healer.core.xid import XidAction, XidCatalog, XidEntry
from healer.errors import ConfigError

CATALOG_RESOURCE = "xid-catalog.yaml"


def parse_catalog(data: Any, source: str = CATALOG_RESOURCE) -> XidCatalog:
    if not isinstance(data, dict) or data.get("format") != 1:
        raise ConfigError(f"{source}: expected a mapping with format: 1")
    groups = data.get("groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(f"{source}: groups: expected a non-empty mapping")
    entries: dict[int, XidEntry] = {}
    for i, raw in enumerate(data.get("xids") or []):
        where = f"{source}: xids[{i}]"
        try:
            code = int(raw["code"])
            sev_text = str(raw["severity"])
            severity = None if sev_text == "none" else Severity.parse(sev_text)
            action = XidAction(raw["action"])
            entry_groups = frozenset(str(g) for g in raw["groups"])
            entry = XidEntry(code=code, mnemonic=str(raw["mnemonic"]),
                             meaning=str(raw["meaning"]), severity=severity, action=action,
                             groups=entry_groups)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {e}") from e
        unknown = entry_groups - set(groups)
        if unknown:
            raise ConfigError(f"{where}: unknown groups {sorted(unknown)}")
        if code in entries:
            raise ConfigError(f"{where}: duplicate code {code}")
        entries[code] = entry
    return XidCatalog(entries=entries, groups={str(k): str(v) for k, v in groups.items()})


@cache
def default_catalog() -> XidCatalog:
    text = resources.files("healer.data").joinpath(CATALOG_RESOURCE).read_text("utf-8")
    return parse_catalog(yaml.safe_load(text))
