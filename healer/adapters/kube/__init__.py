"""Kubernetes adapters (kubernetes_asyncio): nodes, events, NodeRemediation records, spares,
leases. Library errors never leave this package: they become healer.errors."""
