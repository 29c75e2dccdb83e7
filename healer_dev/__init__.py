"""healer_dev: the development side of healer, never shipped (not in the wheel, not in the image).

The local real stack (``devstack``), the demo, the bench, the DCGM exporter simulator and the
test doubles of every port (``testing``). Importable from a checkout (run from the repository
root); shipped code never imports it (an import-linter contract in pyproject.toml).
"""
