"""The chart grants what the policies' SlurmNodeSet documents need (issue 14 item 4): in each
Slinky NodeSet's namespace the same Role as in ``slurm.namespace`` (read slurmd pods and
NodeSets, evict a drained slurmd), and ``get`` on exactly each slurmrestd token Secret; nothing
for a namespace no document names. Rendered by the real helm."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.integration.test_helm import ROOT, Helm, by_kind, helm, values_file

__all__ = ["helm"]  # the fixture, imported for pytest

Obj = dict[str, object]


def _roles(objs: list[Obj]) -> dict[tuple[str, str], list[Obj]]:
    out: dict[tuple[str, str], list[Obj]] = {}
    for r in by_kind(objs, "Role"):
        meta = r["metadata"]
        assert isinstance(meta, dict)
        rules = r["rules"]
        assert isinstance(rules, list)
        out[(str(meta["namespace"]), str(meta["name"]))] = rules
    return out


def test_each_slurm_nodeset_namespace_and_token_is_granted(helm: Helm, tmp_path: Path) -> None:
    policies = {"default.yaml": (ROOT / "policies" / "default.yaml").read_text(),
                "two-clusters.yaml": (ROOT / "policies" / "examples" /
                                      "two-clusters.yaml").read_text()}
    objs = helm.template("-f", str(values_file(tmp_path, {"policies": policies})))
    roles = _roles(objs)
    slurm_rules = roles[("slurm", "healer-slurm")]
    for ns in ("slurm-west", "slurm-east"):  # both NodeSets' namespaces, as slurm.namespace
        assert roles[(ns, "healer-slurm")] == slurm_rules, ns
        bindings = [b for b in by_kind(objs, "RoleBinding")
                    if b["metadata"]["namespace"] == ns]  # type: ignore[index]
        assert "healer-slurm" in [b["roleRef"]["name"] for b in bindings]  # type: ignore[index]
    # west's slurmrestd token: get on exactly that Secret; east names none
    assert roles[("slurm-west", "healer-hooks")] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["slurm-token-healer"],
         "verbs": ["get"]}]
    assert ("slurm-east", "healer-hooks") not in roles
    # without SlurmNodeSet documents nothing of it is rendered
    plain = _roles(helm.template())
    assert not [k for k in plain if k[0] in ("slurm-west", "slurm-east")]
    rendered = yaml.safe_dump_all(objs)
    assert "slurm-west" in rendered
