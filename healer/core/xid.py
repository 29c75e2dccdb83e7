"""The XID catalog as a value; :mod:`healer.policy.catalog` loads it from the shipped data."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from healer.core.model import Severity


class XidAction(enum.Enum):
    """NVIDIA's recommended immediate action for an XID."""

    RESTART_APP = "restart-app"
    RESET_GPU = "reset-gpu"
    REBOOT = "reboot"
    DRAIN_AND_REPLACE = "drain-and-replace"
    IGNORE = "ignore"


@dataclass(frozen=True, slots=True)
class XidEntry:
    code: int
    mnemonic: str
    meaning: str
    severity: Severity | None  # None: not a node fault
    action: XidAction
    groups: frozenset[str]


@dataclass(frozen=True, slots=True)
class XidCatalog:
    entries: Mapping[int, XidEntry]
    groups: Mapping[str, str]  # group name -> description

    def get(self, code: int) -> XidEntry | None:
        return self.entries.get(code)

    def group(self, name: str) -> frozenset[int]:
        if name not in self.groups:
            raise KeyError(name)
        return frozenset(c for c, e in self.entries.items() if name in e.groups)

    def resolve(self, groups: Iterable[str], codes: Iterable[int] = (),
                exclude: Iterable[int] = ()) -> frozenset[int]:
        """The codes named by ``groups`` plus ``codes``, minus ``exclude``."""
        out: set[int] = set(codes)
        for g in groups:
            out |= self.group(g)
        return frozenset(out - set(exclude))
