"""Telemetry through a real Prometheus scraping the DCGM simulator."""
