"""The node agent's own API client (:class:`~healer.adapters.kube.lite.LiteClient`), pointed at
the same API server as the same user as a test's ``kubernetes_asyncio`` client."""

from __future__ import annotations

from pathlib import Path

from kubernetes_asyncio import client

from healer.adapters.kube.lite import LiteClient, LiteConfig


def lite_like(api: client.ApiClient) -> LiteClient:
    """A LiteClient with ``api``'s server, CA and client certificate."""
    cfg = api.configuration

    def data(path: str | None) -> bytes | None:
        return Path(path).read_bytes() if path else None

    return LiteClient(LiteConfig(server=str(cfg.host), ca_data=data(cfg.ssl_ca_cert),
                                 cert_data=data(cfg.cert_file), key_data=data(cfg.key_file)))
