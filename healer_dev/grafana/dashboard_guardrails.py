"""The ``healer / Guardrails and breaker`` dashboard
(``dashboards/guardrails.json``), panel by panel."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from healer_dev.grafana.panels import (
    PanelBuilder,
    Q,
    dashboard,
    stat,
    state_timeline,
    table,
    timeseries,
)

FILE = "guardrails.json"
DESCRIPTION = (
    "The limits checked before a node is taken out: the storm breaker, maxUnavailable, "
    "maxConcurrent, retry budgets per GPU serial, and the admissions they held.")

PANELS: list[PanelBuilder] = [
    stat(
        "Breaker",
        "1 while a breaker is tripped (any scope).",
        "max(healer_breaker_tripped and on (job, instance) (healer_leader == 1))",
        thresholds=[("green", None), ("red", 1)],
        mappings={0: ("closed", "green"), 1: ("TRIPPED", "red")},
        w=6,
        h=5),
    stat(
        "Breaker utilisation",
        "Nodes gone bad in the window / trip threshold.",
        "max(healer_breaker_utilisation and on (job, instance) (healer_leader == 1))",
        unit="percentunit",
        thresholds=[("green", None), ("orange", 0.75), ("red", 1)],
        w=6,
        h=5),
    stat(
        "Unavailable / maxUnavailable",
        "The fullest scope.",
        ("max(sum by (scope) (healer_unavailable_nodes and on (job, instance) (healer_leader == "
         "1)) / max by (scope) (healer_max_unavailable and on (job, instance) (healer_leader == "
         "1)))"),
        unit="percentunit",
        thresholds=[("green", None), ("orange", 0.75), ("red", 1)],
        w=6,
        h=5),
    stat(
        "Active / maxConcurrent",
        "The fullest scope.",
        ("max(max by (scope) (healer_active_remediations and on (job, instance) (healer_leader "
         "== 1)) / max by (scope) (healer_max_concurrent and on (job, instance) (healer_leader "
         "== 1)))"),
        unit="percentunit",
        thresholds=[("green", None), ("orange", 0.75), ("red", 1)],
        w=6,
        h=5),
    state_timeline(
        "Breaker by scope",
        "",
        Q("max by (scope) (healer_breaker_tripped and on (job, instance) (healer_leader == 1))",
          "{{scope}}"),
        mappings={0: ("closed", "green"), 1: ("tripped", "red")}),
    timeseries(
        "Breaker utilisation by scope",
        "1.0 = at the trip threshold.",
        Q(("max by (scope) (healer_breaker_utilisation and on (job, instance) (healer_leader == "
           "1))"),
          "{{scope}}"),
        unit="percentunit"),
    timeseries(
        "Unavailable nodes vs maxUnavailable",
        ("Nodes counted unavailable by the guardrails (they cannot take jobs, in Kubernetes or "
         "in Slurm, whoever caused it) and the limit."),
        Q("sum by (scope) (healer_unavailable_nodes and on (job, instance) (healer_leader == 1))",
          "{{scope}} unavailable"),
        Q("max by (scope) (healer_max_unavailable and on (job, instance) (healer_leader == 1))",
          "{{scope}} max")),
    timeseries(
        "Active remediations vs maxConcurrent",
        "",
        Q(("max by (scope) (healer_active_remediations and on (job, instance) (healer_leader == "
           "1))"),
          "{{scope}} active"),
        Q("max by (scope) (healer_max_concurrent and on (job, instance) (healer_leader == 1))",
          "{{scope}} max")),
    timeseries(
        "Guardrail blocks",
        "Admissions held, by guardrail and policy.",
        Q("sum by (guardrail, policy) (increase(healer_guardrail_blocks_total[$__rate_interval]))",
          "{{guardrail}} {{policy}}"),
        decimals=0),
    table(
        "Guardrail blocks in range",
        "",
        "sum by (guardrail, policy) (increase(healer_guardrail_blocks_total[$__range]))"),
    timeseries(
        "GPU serials with repeated incidents",
        ("Incidents per GPU serial in the retention window (serials with two or more). A serial "
         "over its retry budget is escalated, not swapped back in."),
        Q(("max by (serial) (healer_gpu_serial_incidents and on (job, instance) (healer_leader "
           "== 1))"),
          "{{serial}}"),
        decimals=0),
    table(
        "GPU serials with repeated incidents (now)",
        "",
        ("max by (serial) (healer_gpu_serial_incidents and on (job, instance) (healer_leader == "
         "1))")),
    timeseries(
        "Unavailable nodes by cause",
        ("Why the counted nodes cannot take jobs: healer's own hold, a cordon, NotReady, or "
         "Slurm (DOWN, NOT_RESPONDING, FAIL, drained by anyone, rebooting, powering down, "
         "MAINT)."),
        Q(("sum by (scope, cause) (healer_unavailable_nodes and on (job, instance) "
           "(healer_leader == 1)) > 0"),
          "{{scope}} {{cause}}")),
    timeseries(
        "Replaced nodes and Slurm's view",
        ("Nodes in Repair whose spare serves in their place (not counted as unavailable), and "
         "whether healer can read Slurm's node states (0: admissions under maxUnavailable or "
         "failure-domain limits are held) with the age of the last read, per NodeSet too "
         "(0: its cluster unreachable or its token Secret missing)."),
        Q("max by (scope) (healer_replaced_nodes and on (job, instance) (healer_leader == 1))",
          "{{scope}} replaced"),
        Q("max(healer_slurm_view_known and on (job, instance) (healer_leader == 1))",
          "Slurm view known"),
        Q(("time() - max(healer_slurm_view_last_success_timestamp_seconds and on (job, "
           "instance) (healer_leader == 1))"),
          "seconds since Slurm was read"),
        Q(("min by (nodeset, cluster) (healer_nodeset_slurm_readable and on (job, instance) "
           "(healer_leader == 1))"),
          "{{nodeset}} ({{cluster}}) Slurm readable")),
    timeseries(
        "Mass-death breaker",
        ("1 while a policy's mass-death breaker holds: more of its nodes (or of one failure "
         "domain) went NotReady together than deadNode.massDeath allows; suspect the control "
         "plane or the network: nothing is fenced or swapped there until they answer again "
         "(docs/runbooks/HealerMassDeath.md)."),
        Q("max by (scope) (healer_mass_death_tripped and on (job, instance) (healer_leader == 1))",
          "{{scope}}"),
        decimals=0,
        w=24),
]



def build() -> Dashboard:
    return dashboard("healer-guardrails", "Guardrails and breaker", DESCRIPTION,
                     ['guardrails'], PANELS)
