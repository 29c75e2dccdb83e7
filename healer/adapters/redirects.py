"""No redirect is followed with a credential or a signed body.

aiohttp follows a 307/308 by re-sending the request, body and headers, to wherever the
``Location`` points, another host and https to http included; it drops only ``Authorization``.
A webhook's ``X-Healer-Signature``, slurmrestd's ``X-SLURM-USER-TOKEN`` and a topograph request
that may hold provider credentials would go along. So every such request is sent with
``allow_redirects=False`` and a 3xx is a :class:`~healer.errors.PermanentError` whose message
(:func:`refused_redirect`, the step's result) says where it was sent and why it was not
followed. (Prometheus is read through ``requests``, which drops the bearer token on a redirect
to another host or scheme, and sends no body.)
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["refused_redirect"]


def refused_redirect(what: str, url: str, status: int, headers: Mapping[str, str]) -> str:
    """What a step reports when ``what`` at ``url`` answered a redirect (``status``)."""
    location = "".join(c if c.isprintable() else "?" for c in headers.get("Location", "")[:200])
    return (f"{what} {url}: HTTP {status} redirect to {location or '(no Location)'} not "
            "followed: healer never re-sends a signed or authenticated request to another URL; "
            "set the URL to where the receiver is")
