"""The policy file format, layer two: cross-field rules, then compilation into core types.

Layer one (:mod:`healer.policy.schema`) checked every field on its own. Here we check what
relates fields (exactly one matcher per rule, a webhook hook needs a URL, XID groups exist in
the catalog, names are unique, ...) and turn the validated model into the frozen types of
:mod:`healer.core.rules`: durations in seconds, regular expressions compiled, XID groups
resolved to codes. Every problem carries the path of the offending field so the loader can
name its line.
"""

from __future__ import annotations

from dataclasses import dataclass

from healer.core import rules as core
from healer.core.model import FenceProvider, Severity
from healer.core.selector_logic import conflict
from healer.core.signals import default_stale_after
from healer.core.xid import XidCatalog
from healer.policy import schema as s
from healer.policy.checks import check_promql, compile_regex
from healer.policy.promql_labels import check_keeps
from healer.policy.promql_limits import check_limits
from healer.policy.spare_validation import compile_spare_validation

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Issue:
    path: Path
    message: str


class CompileErrors(Exception):
    def __init__(self, issues: list[Issue]) -> None:
        super().__init__("; ".join(i.message for i in issues))
        self.issues = issues


def _quantity(text: str) -> core.Quantity:
    if text.endswith("%"):
        return core.Quantity(float(text[:-1]), percent=True)
    return core.Quantity(float(text))


def _selector(sel: s.Selector, path: Path, issues: list[Issue], *,
              require: bool) -> core.LabelSelector:
    if require and not sel.match_labels and not sel.match_expressions:
        issues.append(Issue(path, "expected at least one matchLabels entry or matchExpression: "
                                  "an empty selector would select every node, control plane "
                                  "included"))
    exprs: list[tuple[str, str, frozenset[str]]] = []
    for i, e in enumerate(sel.match_expressions):
        p = (*path, "matchExpressions", i, "values")
        if e.operator in ("In", "NotIn") and not e.values:
            issues.append(Issue(p, f"operator {e.operator} expects a non-empty values list"))
        if e.operator in ("Exists", "DoesNotExist") and e.values:
            issues.append(Issue(p, f"operator {e.operator} expects no values"))
        exprs.append((e.key, e.operator, frozenset(e.values)))
    out = core.LabelSelector(dict(sel.match_labels), tuple(exprs))
    key = conflict(out)
    if key:
        issues.append(Issue(path, f"this selector can match no node: its requirements on "
                                  f"label {key!r} contradict each other"))
    return out


def _spare_selector(sel: s.Selector, path: Path, issues: list[Issue]) -> core.LabelSelector:
    """A spare selector: a selector with matchLabels, which a claim takes off the spare (a
    selector of matchExpressions alone would pick spares a claim cannot take out of the pool,
    so healer counts no node as a spare by it)."""
    out = _selector(sel, path, issues, require=True)
    if sel.match_expressions and not sel.match_labels:
        issues.append(Issue((*path, "matchLabels"),
                            "expected at least one matchLabels entry: claiming a spare removes "
                            "its matchLabels, and a spare selector without any picks no spare"))
    return out


def _guardrails(g: s.GuardrailsSpec, path: Path, issues: list[Issue]) -> core.Guardrails:
    keys = [fd.key for fd in g.failure_domains]
    for i, k in enumerate(keys):
        if k in keys[:i]:
            issues.append(Issue((*path, "failureDomains", i, "key"),
                                f"failure domain {k!r} is listed twice"))
    breaker = None
    if g.breaker is not None:
        q = _quantity(g.breaker.threshold)
        if (not q.percent and q.value < 2) or q.value <= 0:
            issues.append(Issue((*path, "breaker", "threshold"),
                                "expected a threshold of at least 2 nodes (or a percentage > 0%):"
                                " one bad node is a failure, not a storm"))
        breaker = core.Breaker(window=g.breaker.window, threshold=q, cooldown=g.breaker.cooldown)
    budget = None
    if g.retry_budget is not None:
        rb = g.retry_budget
        budget = core.RetryBudget(per_node=rb.per_node, per_gpu_serial=rb.per_gpu_serial,
                                  window=rb.window)
    return core.Guardrails(
        max_concurrent=g.max_concurrent,
        max_unavailable=_quantity(g.max_unavailable) if g.max_unavailable is not None else None,
        failure_domains=tuple(core.FailureDomain(fd.key, fd.max_unavailable)
                              for fd in g.failure_domains),
        breaker=breaker,
        retry_budget=budget,
    )


_MATCHERS = ("xid", "metric", "condition", "notReady", "staleness", "slurm")


def _rule(r: s.RuleSpec, path: Path, catalog: XidCatalog, issues: list[Issue]) -> core.Rule | None:
    present = [m for m, v in zip(_MATCHERS, (r.xid, r.metric, r.condition, r.not_ready,
                                             r.staleness, r.slurm), strict=True) if v is not None]
    if len(present) != 1:
        issues.append(Issue(path, "expected exactly one of xid, metric, condition, notReady, "
                                  f"staleness, slurm; got {', '.join(present) or 'none'}"))
        return None
    kind = present[0]
    if kind == "staleness":
        if r.severity is not None:
            issues.append(Issue((*path, "severity"), "a staleness rule takes no severity: stale "
                                                     "telemetry can alert but never disrupts"))
        assert r.staleness is not None
        return core.StalenessRule(r.name, r.staleness.after, frozenset(r.staleness.sources))
    if r.severity is None:
        issues.append(Issue((*path, "severity"), "expected a severity: degrading or failed"))
        return None
    sev = Severity.parse(r.severity)
    if r.xid is not None:
        x, p = r.xid, (*path, "xid")
        for i, g in enumerate(x.groups):
            if g not in catalog.groups:
                issues.append(Issue((*p, "groups", i), f"unknown XID group {g!r} (expected one of "
                                                       f"{', '.join(sorted(catalog.groups))})"))
        for i, c in enumerate(x.codes):
            if catalog.get(c) is None:
                issues.append(Issue((*p, "codes", i), f"XID {c} is not in the catalog (see "
                                                      "`healer xid --list`)"))
        known_groups = [g for g in x.groups if g in catalog.groups]
        codes = catalog.resolve(known_groups, x.codes, x.exclude)
        if not codes and not any(i.path[:len(p)] == p for i in issues):
            issues.append(Issue(p, "the groups and codes select no XID at all"))
        return core.XidRule(r.name, sev, codes, x.count, x.within)
    if r.metric is not None:
        return _metric(r.name, sev, r.metric, (*path, "metric"), issues)
    if r.slurm is not None:
        return _slurm(r.name, sev, r.slurm, (*path, "slurm"), issues)
    if r.condition is not None:
        cond, cp = r.condition, (*path, "condition")
        pattern = None
        if cond.reason is not None:
            try:
                pattern = compile_regex(cond.reason)
            except ValueError as e:
                issues.append(Issue((*cp, "reason"), str(e)))
        if (cond.count > 0) != (cond.within > 0):
            issues.append(Issue(cp, "count and within go together (N transitions within a "
                                    "window); set both or neither"))
        stale_after = (default_stale_after(cond.type) if cond.stale_after is None
                       else cond.stale_after)
        return core.ConditionRule(r.name, sev, cond.type, frozenset(cond.status), pattern,
                                  cond.hold_for, cond.count, cond.within, stale_after)
    assert r.not_ready is not None
    return core.ConditionRule(r.name, sev, "Ready", frozenset({"False", "Unknown"}), None,
                              r.not_ready.hold_for)


def _metric(name: str, sev: Severity, m: s.MetricMatch, p: Path,
            issues: list[Issue]) -> core.MetricRule | None:
    given = [k for k, v in (("field", m.field), ("series", m.series), ("promql", m.promql))
             if v is not None]
    if len(given) != 1:
        issues.append(Issue(p, "expected exactly one of field, series or promql; got "
                               f"{', '.join(given) or 'none'}"))
        return None
    if m.matchers and m.series is None:
        issues.append(Issue((*p, "matchers"), "matchers go with series (write them into a "
                                              "promql expression; a field is per GPU)"))
    for what, value in (("per", m.per), ("nodeLabel", m.node_label)):
        if value and m.field is not None:
            issues.append(Issue((*p, what), f"{what} goes with series or promql (a field is "
                                            "judged per GPU, named by the exporter's labels)"))
    if len(set(m.per)) != len(m.per):
        issues.append(Issue((*p, "per"), "expected distinct labels"))
    if m.promql is not None:
        try:
            check_limits(check_promql(m.promql))
            node_labels = (m.node_label,) if m.node_label else core.HOST_LABELS
            check_keeps(m.promql, node_labels, m.per)
        except ValueError as e:
            issues.append(Issue((*p, "promql"), str(e)))
        if m.aggregation != "value":
            issues.append(Issue((*p, "aggregation"), "aggregation applies to field or series, "
                                                     "not promql (write the function into "
                                                     "the expression)"))
    return core.MetricRule(name, sev, field=m.field or m.series or name, op=core.Op(m.op),
                           threshold=m.threshold, hold_for=m.hold_for,
                           aggregation=core.Aggregation(m.aggregation), window=m.window,
                           promql=m.promql or "", series=m.series is not None,
                           matchers=tuple(sorted(m.matchers.items())), per=tuple(m.per),
                           node_label=m.node_label or "")


def _slurm(name: str, sev: Severity, m: s.SlurmMatch, p: Path,
           issues: list[Issue]) -> core.SlurmRule:
    if len(set(m.states)) != len(m.states):
        issues.append(Issue((*p, "states"), "expected distinct states"))
    pattern = None
    if m.reason is not None:
        try:
            pattern = compile_regex(m.reason)
        except ValueError as e:
            issues.append(Issue((*p, "reason"), str(e)))
    return core.SlurmRule(name, sev, frozenset(m.states), pattern, m.hold_for)


def _dead(d: s.DeadNodeSpec | None, path: Path, issues: list[Issue]) -> core.DeadNode:
    if d is None:
        return core.DeadNode()
    if len(set(d.signals)) != len(d.signals):
        issues.append(Issue((*path, "signals"), "expected distinct signals"))
    f = d.fencing
    if len(set(f.providers)) != len(f.providers):
        issues.append(Issue((*path, "fencing", "providers"), "expected distinct providers"))
    if "webhook" in f.providers:
        _webhook(f, (*path, "fencing"), "the webhook fencing provider", issues)
    elif f.url or f.secret_ref:
        issues.append(Issue((*path, "fencing", "url" if f.url else "secretRef"),
                            "url and secretRef go with the webhook provider (add webhook to "
                            "providers, or remove them)"))
    m = d.mass_death
    for name, q in (("maxShare", m.max_share), ("maxSharePerDomain", m.max_share_per_domain)):
        if _quantity(q).value <= 0:
            issues.append(Issue((*path, "massDeath", name), "expected more than 0: with 0 "
                                "every dead node would be a mass death, and none replaced"))
    return core.DeadNode(
        enabled=d.enabled, after=d.dead_after,
        signals=frozenset(core.DeadSignal(x) for x in d.signals),
        match=core.DeadMatch(d.match),
        fencing=core.Fencing(providers=frozenset(FenceProvider(x) for x in f.providers),
                             deadline=f.deadline, url=f.url or "",
                             secret_ref=f.secret_ref or ""),
        mass_death=core.MassDeath(window=m.window, max_share=_quantity(m.max_share),
                                  max_share_per_domain=_quantity(m.max_share_per_domain),
                                  domains=tuple(dict.fromkeys(m.domains))))


def _hook_url(url: str | None, path: Path, what: str, issues: list[Issue]) -> None:
    if not url:
        issues.append(Issue(path, f"{what} needs a url"))
    elif not url.startswith(("https://", "http://")):
        issues.append(Issue(path, f"expected an http(s) URL, got {url!r}"))


def _webhook(spec: s.CheckpointSpec | s.RepairSpec | s.FencingSpec, path: Path, what: str,
             issues: list[Issue]) -> None:
    """A webhook hook: a URL, https unless allowInsecureHttp, and its own HMAC key."""
    _hook_url(spec.url, (*path, "url"), what, issues)
    if spec.url and spec.url.startswith("http://") and not spec.allow_insecure_http:
        issues.append(Issue((*path, "url"), f"expected an https:// URL, got {spec.url!r} "
                                            "(set allowInsecureHttp: true to send over http)"))
    if not spec.secret_ref:  # its form is the schema's (checks.check_secret_ref)
        issues.append(Issue((*path, "secretRef"), f"{what} needs secretRef "
                            "(NAMESPACE/NAME[:KEY] of the Secret with its HMAC key)"))


def _steps(st: s.StepsSpec, path: Path, issues: list[Issue]) -> core.Steps:
    cp = st.checkpoint
    cp_hook, rp_hook = core.HookKind(cp.hook), core.HookKind(st.repair.hook)
    if cp.enabled and cp_hook is core.HookKind.WEBHOOK:
        _webhook(cp, (*path, "checkpoint"), "a webhook checkpoint hook", issues)
    if cp.enabled and cp_hook is core.HookKind.JOB and not cp.job_template:
        issues.append(Issue((*path, "checkpoint", "jobTemplate"),
                            "a job checkpoint hook needs a jobTemplate"))
    if cp.enabled and cp.deadline >= st.drain.deadline:
        issues.append(Issue((*path, "checkpoint", "deadline"),
                            f"expected a checkpoint deadline shorter than the drain deadline "
                            f"({cp.deadline:g}s ≥ {st.drain.deadline:g}s)"))
    v = st.validation
    if v.enabled and not v.image:
        issues.append(Issue((*path, "validation", "image"), "validation needs an image"))
    if v.enabled and not v.command:
        issues.append(Issue((*path, "validation", "command"), "validation needs a command"))
    rp = st.repair
    if rp_hook is core.HookKind.WEBHOOK:
        _webhook(rp, (*path, "repair"), "a webhook repair hook", issues)
    if rp_hook is core.HookKind.JOB and not rp.job_template:
        issues.append(Issue((*path, "repair", "jobTemplate"),
                            "a job repair hook needs a jobTemplate"))
    return core.Steps(
        checkpoint=core.CheckpointStep(
            enabled=cp.enabled, hook=cp_hook, signal=cp.signal.removeprefix("SIG"),
            deadline=cp.deadline, on_timeout=core.CheckpointTimeout(cp.on_timeout),
            severities=frozenset(Severity.parse(x) for x in cp.severities),
            url=cp.url or "", secret_ref=cp.secret_ref or "", job_template=cp.job_template or ""),
        drain=core.DrainStep(deadline=st.drain.deadline,
                             on_timeout=core.DrainTimeout(st.drain.on_timeout),
                             requeue_grace=st.drain.requeue_grace),
        swap=core.SwapStep(enabled=st.swap.enabled, deadline=st.swap.deadline,
                           hold_timeout=st.swap.hold_timeout,
                           require_same_domain=st.swap.require_same_domain,
                           foreign_reason=core.ForeignReason(st.swap.foreign_reason)),
        validation=core.ValidationStep(enabled=v.enabled, image=v.image or "",
                                       command=tuple(v.command), deadline=v.deadline),
        repair=core.RepairStep(hook=rp_hook, url=rp.url or "",
                               secret_ref=rp.secret_ref or "", job_template=rp.job_template or "",
                               deadline=rp.deadline),
        step_deadline=st.step_deadline, max_attempts=st.max_attempts,
        poll_interval=st.poll_interval,
    )


def compile_policy(doc: s.RemediationPolicy, catalog: XidCatalog,
                   source: str = "") -> core.Policy:
    issues: list[Issue] = []
    spec = doc.spec
    sel = _selector(spec.node_selector, ("spec", "nodeSelector"), issues, require=True)
    rules: list[core.Rule] = []
    names: dict[str, int] = {}
    for i, r in enumerate(spec.rules):
        path: Path = ("spec", "rules", i)
        if r.name in names:
            issues.append(Issue((*path, "name"), f"rule name {r.name!r} is already used by "
                                                 f"rules[{names[r.name]}]"))
        names.setdefault(r.name, i)
        rule = _rule(r, path, catalog, issues)
        if rule is not None:
            rules.append(rule)
    if rules and all(isinstance(r, core.StalenessRule) for r in rules):
        issues.append(Issue(("spec", "rules"), "expected at least one rule that can find a "
                                               "fault (staleness rules only alert)"))
    steps = _steps(spec.steps, ("spec", "steps"), issues)
    guardrails = _guardrails(spec.guardrails, ("spec", "guardrails"), issues)
    dead = _dead(spec.dead_node, ("spec", "deadNode"), issues)
    if issues:
        raise CompileErrors(issues)
    return core.Policy(name=doc.metadata.name, selector=sel, rules=tuple(rules), steps=steps,
                       guardrails=guardrails, mode=core.Mode(spec.mode), priority=spec.priority,
                       source=source, dead=dead)


def compile_fleet(doc: s.FleetGuardrails, source: str = "") -> core.FleetRules:
    issues: list[Issue] = []
    sel = _spare_selector(doc.spec.spare_selector, ("spec", "spareSelector"), issues)
    g = _guardrails(doc.spec.guardrails, ("spec", "guardrails"), issues)
    sv = compile_spare_validation(doc.spec.spare_validation, ("spec", "spareValidation"),
                                  lambda p, m: issues.append(Issue(p, m)))
    if issues:
        raise CompileErrors(issues)
    return core.FleetRules(guardrails=g, spare_selector=sel, paused=doc.spec.paused,
                                source=source, spare_validation=sv)
