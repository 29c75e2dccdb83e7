"""Observability: logging, metrics and the HTTP endpoints."""
