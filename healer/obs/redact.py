"""Redaction of secrets, by key and by value, for ``/debug/state`` and every log line.

Keys: a key is secret when its last name segment (split at ``-``, ``_``, ``.``, spaces and
camelCase humps) is one of :data:`SECRET_WORDS`, or the whole key, normalised, is one of
:data:`SECRET_KEYS` — so ``slurmToken``, ``X-Auth-Token`` and ``clientSecret`` go, while a node
called ``gpu-token-3`` or a ``bearerTokenFile`` path stays.

Values: every string is scanned, whatever its key, for credentials inside URLs (userinfo, and
``token=``-style query parameters), ``Bearer``/``Basic`` credentials, PEM blocks and JWTs; each is
replaced by ``<redacted>``. The patterns are linear (no nested quantifiers) and long strings are
scanned in full but only once.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"
SECRET_WORDS = frozenset({
    "token", "tokens", "password", "passwd", "passphrase", "secret", "secrets", "authorization",
    "jwt", "apikey", "credential", "credentials", "cookie", "hmac", "signature", "privatekey",
})
SECRET_KEYS = frozenset({
    "apikey", "accesskey", "secretkey", "privatekey", "clientsecret", "accesstoken",
    "refreshtoken", "bearertoken", "authtoken", "xauthtoken", "sessionid", "setcookie",
    "xhealersignature", "tlskey", "keydata", "clientkeydata",
})

_SPLIT = re.compile(r"[-_.\s/:]+|(?<=[a-z0-9])(?=[A-Z])")
_VALUE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"-----BEGIN [A-Z0-9 ]{1,64}-----.*?-----END [A-Z0-9 ]{1,64}-----", re.S),
     REDACTED),
    (re.compile(r"-----BEGIN [A-Z0-9 ]{0,64}PRIVATE KEY-----[^\n]*(?:\n[^\n]*)*"), REDACTED),
    (re.compile(r"(?i)([a-z][a-z0-9+.-]{0,31}://)[^/\s@?#]{1,256}@"), r"\1" + REDACTED + "@"),
    (re.compile(r"(?i)([?&;](?:access_token|refresh_token|id_token|token|api_key|apikey|key|"
                r"password|passwd|pwd|secret|client_secret|signature|sig|auth|jwt|"
                r"x-amz-signature|x-amz-credential|x-amz-security-token)=)[^&#\s\"']*"),
     r"\1" + REDACTED),
    (re.compile(r"\b((?i:bearer)\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1" + REDACTED),
    (re.compile(r"\b(Basic\s+)[A-Za-z0-9+/]{8,}={0,2}"), r"\1" + REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"), REDACTED),
)
MAX_DEPTH = 64


def secret_key(key: object) -> bool:
    """Is a field of this name a secret (by its last segment or its whole name)?"""
    text = str(key)
    parts = [p.lower() for p in _SPLIT.split(text) if p]
    if not parts:
        return False
    return parts[-1] in SECRET_WORDS or "".join(parts) in SECRET_KEYS


def redact_text(text: str) -> str:
    """``text`` with every credential-looking value replaced."""
    for pattern, repl in _VALUE_PATTERNS:
        text = pattern.sub(repl, text)
    return text


def redact(obj: Any, _depth: int = 0) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples, strings) with secrets replaced."""
    if _depth > MAX_DEPTH:
        return REDACTED
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, dict):
        return {k: (REDACTED if secret_key(k) else redact(v, _depth + 1))
                for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [redact(v, _depth + 1) for v in obj]
    return obj
