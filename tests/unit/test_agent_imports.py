"""The node agent imports only what it uses: not kubernetes_asyncio's client (every API group
and model of Kubernetes, ~60 MiB of RSS) and not pydantic (the policy loader's)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("kubernetes_asyncio", "pydantic", "prometheus_api_client", "re2", "promql_parser")


def test_the_agent_does_not_import_the_daemons_heavy_libraries() -> None:
    code = ("import sys, healer.agent.main\n"
            "from healer.policy.catalog import default_catalog\n"
            "default_catalog()\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout
