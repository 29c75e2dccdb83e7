"""argparse types for healer's flags: each rejects a bad value with one line naming what was
expected (argparse prefixes the flag), so no command starts with a NaN interval, a port out of
range, a URL without a host or a file that is not there. Used by ``healer.cli`` and by every
subcommand's own flags; stdlib only, so any layer may use it.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import re
import stat
from collections.abc import Callable
from urllib.parse import urlsplit

_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_PROM_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")


def _fail(msg: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(msg)


def _show(text: str) -> str:
    return repr(text[:80] + ("…" if len(text) > 80 else ""))


def seconds(lo: float = 0.0, hi: float = 86400.0, *, zero: bool = False
            ) -> Callable[[str], float]:
    """A duration in seconds: finite, ``lo`` ≤ x ≤ ``hi`` (``zero``: 0 is allowed too)."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise _fail(f"expected a number of seconds, got {_show(text)}") from None
        if not math.isfinite(v):
            raise _fail(f"expected a finite number of seconds, got {_show(text)}")
        if (v == 0 and zero) or lo <= v <= hi:
            return v
        raise _fail(f"expected seconds from {lo:g} to {hi:g}, got {text.strip()}")

    parse.__name__ = "seconds"
    return parse


def number(lo: float, hi: float) -> Callable[[str], float]:
    """A number: finite, ``lo`` ≤ x ≤ ``hi``."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise _fail(f"expected a number, got {_show(text)}") from None
        if not math.isfinite(v) or not lo <= v <= hi:
            raise _fail(f"expected a number from {lo:g} to {hi:g}, got {text.strip()}")
        return v

    parse.__name__ = "number"
    return parse


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0,
                   "w": 7 * 86400.0}


def duration(lo: float, hi: float) -> Callable[[str], float]:
    """A duration as people write it (``90s``, ``5m``, ``1h30m``, ``7d``, ``2w``; a bare
    number is seconds), ``lo`` ≤ x ≤ ``hi`` seconds."""
    def parse(text: str) -> float:
        t = text.strip()
        if re.fullmatch(r"\d+(\.\d+)?", t):
            v = float(t)
        elif len(t) <= 64 and re.fullmatch(f"(?:{_DURATION_PART.pattern})+", t):
            v = sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART.findall(t))
        else:
            raise _fail(f"expected a duration such as 90s, 5m, 12h, 7d or 2w, got {_show(text)}")
        if not lo <= v <= hi:
            raise _fail(f"expected a duration from {lo:g}s to {hi / 86400:g}d, got {_show(text)}")
        return v

    parse.__name__ = "duration"
    return parse


def integer(lo: int, hi: int) -> Callable[[str], int]:
    """A whole number with ``lo`` ≤ n ≤ ``hi``."""
    def parse(text: str) -> int:
        try:
            v = int(text.strip(), 10)
        except ValueError:
            raise _fail(f"expected a whole number, got {_show(text)}") from None
        if not lo <= v <= hi:
            raise _fail(f"expected a number from {lo} to {hi}, got {v}")
        return v

    parse.__name__ = "integer"
    return parse


def port(text: str) -> int:
    """A TCP port, 0 (any free port) to 65535."""
    return integer(0, 65535)(text)


def host(text: str) -> str:
    """An IPv4/IPv6 address or an RFC 1123 host name."""
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        t = t[1:-1]
    try:
        ipaddress.ip_address(t)
        return t
    except ValueError:
        pass
    if t and len(t) <= 253 and not re.fullmatch(r"[0-9.]+", t) \
            and all(_HOST_LABEL.match(part) for part in t.rstrip(".").split(".")):
        return t
    raise _fail(f"expected an IP address or a host name, got {_show(text)}")


def _no_userinfo(text: str) -> str:
    """``text`` with any ``user:password@`` replaced, for error messages."""
    return re.sub(r"//[^/@]*@", "//***@", text)


def url(text: str) -> str:
    """An http(s) URL with a host, a valid port and no whitespace or control characters;
    empty means unset. Errors never repeat a ``user:password@`` part."""
    if text == "":
        return text
    try:
        return _url(text)
    except argparse.ArgumentTypeError as e:
        raise _fail(_no_userinfo(str(e))) from None


def _url(text: str) -> str:
    if _CONTROL.search(text):
        raise _fail(f"expected a URL without spaces or control characters, got {_show(text)}")
    try:
        parts = urlsplit(text)
        p = parts.port  # raises ValueError when out of range or not a number
    except ValueError as e:
        raise _fail(f"expected an http(s) URL ({e}), got {_show(text)}") from None
    if parts.scheme not in ("http", "https"):
        raise _fail(f"expected an http:// or https:// URL, got {_show(text)}")
    if not parts.hostname:
        raise _fail(f"expected a URL with a host, got {_show(text)}")
    host(parts.hostname)
    if p == 0:
        raise _fail(f"expected a URL with a port from 1 to 65535, got {_show(text)}")
    return text


def regular_file(text: str) -> str:
    """An existing, readable regular file (not a directory, FIFO or device); empty: unset."""
    if text == "":
        return text
    try:
        st = os.stat(text)
    except OSError as e:
        raise _fail(f"{text}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _fail(f"{text}: not a regular file")
    if not os.access(text, os.R_OK):
        raise _fail(f"{text}: not readable (permission denied)")
    return text


def dns_label(text: str) -> str:
    """A Kubernetes namespace-style name (RFC 1123 label: lower case, digits, '-')."""
    if not _DNS_LABEL.match(text):
        raise _fail(f"expected a lower-case RFC 1123 name of at most 63 characters, got "
                    f"{_show(text)}")
    return text


def dns_subdomain(text: str) -> str:
    """A Kubernetes object name (RFC 1123 subdomain); empty means unset."""
    if text and not _DNS_SUBDOMAIN.match(text):
        raise _fail(f"expected a lower-case RFC 1123 name of at most 253 characters, got "
                    f"{_show(text)}")
    return text


def secret_ref(text: str) -> str:
    """``NAMESPACE/NAME[:KEY]``; empty means unset."""
    if text == "":
        return text
    ref, colon, key = text.partition(":")  # a key as Kubernetes allows (not ".", "..", "..x")
    ns, slash, name = ref.partition("/")
    if not slash or not _DNS_LABEL.match(ns) or not name or not _DNS_SUBDOMAIN.match(name) \
            or (colon and (not re.fullmatch(r"[-._A-Za-z0-9]{1,253}", key) or key == "."
                       or key.startswith(".."))):
        raise _fail(f"expected NAMESPACE/NAME[:KEY] of a Secret, got {_show(text)}")
    return text


def label_name(text: str) -> str:
    """A Prometheus label name."""
    if not _PROM_LABEL.match(text):
        raise _fail(f"expected a Prometheus label name ([A-Za-z_][A-Za-z0-9_]*), got "
                    f"{_show(text)}")
    return text


def text_value(max_len: int = 253) -> Callable[[str], str]:
    """Free text without control characters, at most ``max_len`` characters."""
    def parse(text: str) -> str:
        if len(text) > max_len or re.search(r"[\x00-\x1f\x7f]", text):
            raise _fail(f"expected at most {max_len} printable characters, got {_show(text)}")
        return text

    parse.__name__ = "text"
    return parse
