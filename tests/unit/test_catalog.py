"""The shipped XID catalog."""

from __future__ import annotations

import pytest

from healer.core.model import Severity
from healer.core.xid import XidAction
from healer.errors import ConfigError
from healer.policy.catalog import default_catalog, parse_catalog


def test_catalog_has_the_data_center_xids() -> None:
    cat = default_catalog()
    for code in (13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140):
        assert cat.get(code) is not None, code
    e79 = cat.get(79)
    assert e79 is not None
    assert e79.severity is Severity.FAILED
    assert e79.action is XidAction.REBOOT
    assert cat.get(13).severity is None  # type: ignore[union-attr]


def test_groups_partition_by_severity() -> None:
    cat = default_catalog()
    fatal, degrading = cat.group("fatal"), cat.group("degrading")
    assert not fatal & degrading
    for code, e in cat.entries.items():
        assert (code in fatal) == (e.severity is Severity.FAILED), code
        assert (code in degrading) == (e.severity is Severity.DEGRADING), code


def test_resolve_groups_codes_and_exclusions() -> None:
    cat = default_catalog()
    got = cat.resolve(["fatal"], [13], [74])
    assert 13 in got
    assert 74 not in got
    assert 79 in got
    with pytest.raises(KeyError):
        cat.group("nope")


@pytest.mark.parametrize(("data", "message"), [
    ({"format": 2}, "format: 1"),
    ({"format": 1, "groups": {}}, "groups"),
    ({"format": 1, "groups": {"a": "x"}, "xids": [{"code": 1}]}, r"xids\[0\]"),
    ({"format": 1, "groups": {"a": "x"}, "xids": [
        {"code": 1, "mnemonic": "M", "meaning": "m", "severity": "none", "action": "ignore",
         "groups": ["b"]}]}, "unknown groups"),
])
def test_bad_catalog_data_is_rejected(data: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_catalog(data)
