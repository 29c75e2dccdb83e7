"""The ``healer / Remediation funnel and per-node timeline`` dashboard
(``dashboards/remediation.json``), panel by panel."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from healer_dev.grafana.panels import (
    PanelBuilder,
    Q,
    bargauge,
    dashboard,
    row,
    stat,
    state_timeline,
    table,
    timeseries,
    variable,
)

FILE = "remediation.json"
DESCRIPTION = (
    "Where remediations are in the state machine, how they move, and each node's timeline. "
    "Controller-state gauges are read from the leader only (a follower may hold a stale copy).")

PANELS: list[PanelBuilder] = [
    row("Now"),
    stat(
        "Open remediations",
        "Remediations that are not closed (any phase).",
        "sum(healer_remediations and on (job, instance) (healer_leader == 1)) or vector(0)"),
    stat(
        "Past their phase deadline",
        "Open remediations whose current phase outlived its deadline (HealerRemediationOverdue).",
        "max(healer_remediation_overdue and on (job, instance) (healer_leader == 1))",
        thresholds=[("green", None), ("red", 1)]),
    stat(
        "Held for capacity",
        "Drained and cordoned, waiting for a warm spare.",
        "max(healer_held_for_capacity and on (job, instance) (healer_leader == 1))",
        thresholds=[("green", None), ("orange", 1)]),
    stat(
        "Escalated, waiting for a human",
        "Open remediations in Escalated.",
        ('sum(healer_remediations{phase="Escalated"} and on (job, instance) (healer_leader == '
         "1)) or vector(0)"),
        thresholds=[("green", None), ("orange", 1)]),
    stat(
        "Incidents opened (range)",
        "Incidents opened in the dashboard's time range.",
        "sum(increase(healer_incidents_total[$__range])) or vector(0)",
        decimals=0,
        instant=True),
    stat(
        "Escalations (range)",
        "Remediations escalated to a human in the time range.",
        "sum(increase(healer_escalations_total[$__range])) or vector(0)",
        decimals=0,
        thresholds=[("green", None), ("orange", 1)],
        instant=True),
    row("Funnel"),
    bargauge(
        "Open remediations by phase",
        "The funnel right now: how many open remediations sit in each phase.",
        Q("sum by (phase) (healer_remediations and on (job, instance) (healer_leader == 1))",
          "{{phase}}")),
    timeseries(
        "Open remediations by phase",
        "The funnel over time.",
        Q("sum by (phase) (healer_remediations and on (job, instance) (healer_leader == 1))",
          "{{phase}}"),
        w=8),
    timeseries(
        "Open remediations by policy",
        "Which policies are acting.",
        Q("sum by (policy) (healer_remediations and on (job, instance) (healer_leader == 1))",
          "{{policy}}"),
        w=8),
    timeseries(
        "Phase transitions /min",
        "Transitions of the state machine.",
        Q("sum by (source, target) (rate(healer_transitions_total[$__rate_interval])) * 60",
          "{{source}} → {{target}}"),
        unit="short"),
    table(
        "Transitions in range",
        "Transitions in the dashboard's time range, by source and target phase.",
        "sum by (source, target) (increase(healer_transitions_total[$__range]))"),
    timeseries(
        "Incidents opened",
        "By severity, rule and XID.",
        Q("sum by (severity, rule, xid) (increase(healer_incidents_total[$__rate_interval]))",
          "{{severity}} {{rule}} XID {{xid}}"),
        decimals=0,
        w=8),
    timeseries(
        "Escalations",
        "Remediations handed to a human, by policy.",
        Q("sum by (policy) (increase(healer_escalations_total[$__rate_interval]))", "{{policy}}"),
        decimals=0,
        w=8),
    timeseries(
        "Actions /min by result",
        "Ledger actions run and their status.",
        Q("sum by (action, status) (rate(healer_actions_total[$__rate_interval])) * 60",
          "{{action}} {{status}}"),
        w=8),
    row("Per-node timeline"),
    state_timeline(
        "Phase by node",
        ("One row per node and phase while an open remediation is in it (the value is the "
         "seconds spent in the phase)."),
        Q(('max by (node, phase) (healer_remediation_phase_seconds{node=~"$node"} and on (job, '
           "instance) (healer_leader == 1))"),
          "{{node}} · {{phase}}"),
        unit="s",
        w=24,
        h=9),
    table(
        "Open remediations",
        ("Node, phase, incident and seconds in the phase; `kubectl get nrem` and `healer "
         "status` show the same records."),
        ('max by (node, phase, incident) (healer_remediation_phase_seconds{node=~"$node"} and '
         "on (job, instance) (healer_leader == 1))"),
        unit="s"),
    timeseries(
        "Seconds in the current phase",
        "Per node; a line that keeps rising is a remediation waiting on something.",
        Q(('max by (node, phase) (healer_remediation_phase_seconds{node=~"$node"} and on (job, '
           "instance) (healer_leader == 1))"),
          "{{node}} {{phase}}"),
        unit="s"),
    row("Dead nodes"),
    stat(
        "Held for fencing",
        ("Dead nodes no fencing provider has said are off or cut off by the fence deadline: "
         "nothing of them is force-deleted (docs/runbooks/HealerNodesHeldForFencing.md)."),
        "max(healer_held_for_fencing and on (job, instance) (healer_leader == 1))",
        thresholds=[("green", None), ("orange", 1)],
        w=6),
    stat(
        "Cordoned in repair",
        ("Nodes healer keeps cordoned in Repair: replaced by a spare (not counted as "
         "unavailable) or repaired in place."),
        "max(healer_repair_cordoned_nodes and on (job, instance) (healer_leader == 1))",
        thresholds=[("green", None), ("orange", 10)],
        w=6),
    timeseries(
        "Dead nodes by phase",
        ("Remediations of dead nodes: waiting for a fence (Dead), held for one "
         "(HeldForFencing), taken out of service (OutOfService); one line at 0 (none) "
         "while there is none."),
        Q(('sum by (phase) (healer_remediations{phase=~"Dead|HeldForFencing|OutOfService"} '
           "and on (job, instance) (healer_leader == 1)) "
           'or on () label_replace(vector(0), "phase", "none", "", "")'),
          "{{phase}}"),
        decimals=0,
        h=4),
]



def build() -> Dashboard:
    return dashboard("healer-remediation", "Remediation funnel and per-node timeline", DESCRIPTION,
                     ['remediation'], PANELS,
                     [variable("node", "Node",
                               "label_values(healer_remediation_phase_seconds, node)")])
