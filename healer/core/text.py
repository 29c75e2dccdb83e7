"""Text written by others (node conditions, Slurm reasons, webhook and API answers), made safe
to keep and to show. Pure.

Whoever may patch a node's status, drain a Slurm node or answer a webhook chooses that text: a
newline that forges a second log or status line, an ANSI escape that rewrites a terminal, a NUL,
a right-to-left override that reverses what a reader sees. Every such character (control,
format, line and paragraph separators, unassigned: what :meth:`str.isprintable` refuses, the
space aside) becomes U+FFFD before the text reaches a signal's details, an Event, a
NodeRemediation or ``healer status``; the cost is bounded by cutting long input first.
"""

from __future__ import annotations

__all__ = ["REPLACEMENT", "bounded", "printable"]

REPLACEMENT = "\ufffd"


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with every character that does not print replaced by U+FFFD; cut to ``limit``
    characters (``…`` marks a cut) when given. Printable text comes back as it is."""
    text = str(text)
    if limit is not None and len(text) > limit:
        text = text[:max(limit - 1, 0)] + "…"
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else REPLACEMENT for c in text)


def bounded(text: str, limit: int, *, scan: int | None = None) -> str:
    """``text`` with surrounding blanks stripped, made :func:`printable` and cut to ``limit``
    characters (``…`` marks a cut); at most ``scan`` characters (default 4 x ``limit``) are
    looked at. Total."""
    raw = str(text)
    scan = 4 * limit if scan is None else scan
    clean = printable(raw[:scan].strip())
    if len(clean) > limit or len(raw) > scan:
        clean = clean[:max(limit - 1, 0)] + "…"
    return clean
