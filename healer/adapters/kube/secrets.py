"""Credentials from Secrets: the slurmrestd JWT (Slinky's ``Token`` writes it to a Secret)."""

from __future__ import annotations

import base64
import time

from kubernetes_asyncio import client

from healer.adapters.kube.client import call, to_dict
from healer.errors import ConfigError

DEFAULT_KEY = "SLURM_JWT"


def parse_ref(ref: str) -> tuple[str, str, str]:
    """``namespace/name[:key]`` → (namespace, name, key)."""
    key = DEFAULT_KEY
    if ":" in ref:
        ref, key = ref.rsplit(":", 1)
    if ref.count("/") != 1:
        raise ConfigError(f"expected a Secret reference NAMESPACE/NAME[:KEY], got {ref!r}")
    ns, name = ref.split("/")
    return ns, name, key


class SecretToken:
    """A TokenProvider reading one key of a Secret, re-read after ``ttl`` seconds or when the
    driver reports the token was refused (Slinky refreshes the Secret before it expires)."""

    def __init__(self, api: client.ApiClient, ref: str, ttl: float = 60.0) -> None:
        self.core = client.CoreV1Api(api)
        self.api = api
        self.namespace, self.name, self.key = parse_ref(ref)
        self.ttl = ttl
        self._value = ""
        self._at = 0.0

    async def token(self) -> str:
        # a cache's age in real elapsed time (monotonic), not the daemon's clock
        if self._value and time.monotonic() - self._at < self.ttl:
            return self._value
        raw = to_dict(self.api, await call(
            f"read Secret {self.namespace}/{self.name}",
            lambda: self.core.read_namespaced_secret(self.name, self.namespace)))
        data = raw.get("data") or {}
        if self.key not in data:
            raise ConfigError(f"Secret {self.namespace}/{self.name} has no key {self.key!r}")
        try:
            self._value = base64.b64decode(data[self.key]).decode().strip()
        except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
            raise ConfigError(f"Secret {self.namespace}/{self.name} key {self.key!r} is not "
                              "UTF-8 text (expected a printable token or HMAC key)") from None
        self._at = time.monotonic()
        return self._value

    def invalidate(self) -> None:
        self._value = ""

    def __repr__(self) -> str:  # never print the token
        return f"SecretToken({self.namespace}/{self.name}:{self.key})"
