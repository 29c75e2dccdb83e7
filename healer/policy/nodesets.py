"""``kind: SlurmNodeSet`` documents, layer two: compiled into :class:`healer.core.nodesets.
NodeSetRules`, and checked against each other (names, Slinky NodeSets and each Slurm cluster's
endpoint must agree across files)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic.alias_generators import to_camel

from healer.core.nodesets import (
    NodeSetRules,
    SlurmEndpoint,
    Toleration,
    TolerationOperator,
    TopologyKeys,
)
from healer.core.slurm_drivers import spec_of
from healer.errors import Problem
from healer.policy import schema as s
from healer.policy.compile import (
    CompileErrors,
    Issue,
    _guardrails,
    _selector,
    _spare_selector,
)

__all__ = ["check_nodesets", "compile_nodeset"]

#: Where a compiled document came from: its file and the line of a field path in it.
LineOf = Callable[[tuple[str | int, ...]], int]


def compile_nodeset(doc: s.SlurmNodeSet, source: str = "") -> NodeSetRules:
    issues: list[Issue] = []
    spec = doc.spec
    sel = _selector(spec.node_selector, ("spec", "nodeSelector"), issues, require=True)
    spares = None
    if spec.spare_selector is not None:
        spares = _spare_selector(spec.spare_selector, ("spec", "spareSelector"), issues)
    slurm = spec.slurm
    driver = spec_of(slurm.driver)
    needs = [to_camel(f) for f in driver.needs_in_nodeset]
    if any(not getattr(slurm, f) for f in driver.needs_in_nodeset):  # each cluster its own
        where = ("spec", "slurm", *needs) if len(needs) == 1 else ("spec", "slurm")
        issues.append(Issue(where, f"the {driver.kind} driver needs {' and '.join(needs)}"))
    if bool(slurm.slurmrestd_url) != bool(slurm.token_secret):
        issues.append(Issue(("spec", "slurm"), "expected slurmrestdUrl and tokenSecret "
                                               "together (slurmrestd needs its token)"))
    if driver.names_by_pod and spec.node_set is None:
        issues.append(Issue(("spec", "nodeSet"), f"the {driver.kind} driver needs the NodeSet "
                                                 "(namespace and name)"))
    tolerations = []
    for i, t in enumerate(spec.tolerations or ()):
        if t.operator == "Exists" and t.value:
            issues.append(Issue(("spec", "tolerations", i, "value"),
                                "expected no value with operator Exists"))
        if not t.key and t.operator != "Exists":
            issues.append(Issue(("spec", "tolerations", i, "key"),
                                "expected a key (only operator Exists may leave it empty)"))
        tolerations.append(Toleration(t.key or "", TolerationOperator(t.operator), t.value,
                                      t.effect or ""))
    tiers = spec.topology.tiers
    for i, key in enumerate(tiers):
        if key in tiers[:i] or key == spec.topology.domain:
            issues.append(Issue(("spec", "topology", "tiers", i),
                                f"label {key!r} is listed twice"))
    guardrails = _guardrails(spec.guardrails, ("spec", "guardrails"), issues)
    if issues:
        raise CompileErrors(issues)
    ref = spec.node_set
    return NodeSetRules(
        name=doc.metadata.name, selector=sel, cluster=spec.cluster,
        slurm=SlurmEndpoint(slurm.driver, slurm.slurmrestd_url or "", slurm.token_secret or "",
                            slurm.slurm_conf or ""),
        namespace=ref.namespace if ref is not None else "",
        nodeset=ref.name if ref is not None else "", spare_selector=spares,
        tolerations=tuple(tolerations) if spec.tolerations is not None else None,
        topology=TopologyKeys(spec.topology.domain, tuple(tiers)), guardrails=guardrails,
        source=source)


def check_nodesets(found: Sequence[tuple[NodeSetRules, str, LineOf]],
                   problems: list[Problem]) -> None:
    """Across files: one document per name and per Slinky NodeSet, and one endpoint per
    Slurm cluster (the first document of a cluster names it; the others must agree)."""
    names: dict[str, str] = {}
    refs: dict[tuple[str, str], str] = {}
    clusters: dict[str, tuple[SlurmEndpoint, str]] = {}
    for ns, file, line_of in found:
        if ns.name in names:
            problems.append(Problem(file, line_of(("metadata", "name")), "metadata.name",
                                    f"SlurmNodeSet {ns.name!r} is already defined at "
                                    f"{names[ns.name]}"))
        names.setdefault(ns.name, ns.source)
        if ns.nodeset:
            ref = (ns.namespace, ns.nodeset)
            if ref in refs:
                problems.append(Problem(file, line_of(("spec", "nodeSet")), "spec.nodeSet",
                                        f"NodeSet {ref[0]}/{ref[1]} is already served by the "
                                        f"SlurmNodeSet at {refs[ref]}"))
            refs.setdefault(ref, ns.source)
        first = clusters.get(ns.cluster)
        if first is None:
            clusters[ns.cluster] = (ns.slurm, ns.source)
        elif first[0] != ns.slurm:
            problems.append(Problem(file, line_of(("spec", "slurm")), "spec.slurm",
                                    f"Slurm cluster {ns.cluster!r} is reached differently at "
                                    f"{first[1]}: one cluster, one endpoint"))
