"""The pure core: domain model, health evaluation, the state machine and the guardrails.

Nothing here performs I/O or reads a clock; ``make lint`` enforces it with import-linter.
"""
