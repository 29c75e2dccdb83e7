"""The ``healer / Spare capacity and held nodes`` dashboard
(``dashboards/spare-capacity.json``), panel by panel."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from healer_dev.grafana.panels import PanelBuilder, Q, bargauge, dashboard, stat, table, timeseries

FILE = "spare-capacity.json"
DESCRIPTION = (
    "Free warm spares by accelerator (NVLink) domain and the nodes held out of service waiting "
    "for one. A domain whose spares are all claimed has no healer_spare_pool_free series, so it "
    "disappears from the per-domain panels.")

PANELS: list[PanelBuilder] = [
    stat(
        "Free warm spares",
        "Free spares in the whole fleet (max across replicas).",
        "sum(max by (domain) (healer_spare_pool_free)) or vector(0)",
        thresholds=[("red", None), ("orange", 1), ("green", 2)],
        w=6,
        h=5),
    stat(
        "Domains with a free spare",
        "Accelerator domains that still have one.",
        "count(max by (domain) (healer_spare_pool_free) > 0) or vector(0)",
        w=6,
        h=5),
    stat(
        "Nodes held for capacity",
        "Drained and cordoned, waiting for a spare.",
        "max(healer_held_for_capacity and on (job, instance) (healer_leader == 1))",
        thresholds=[("green", None), ("orange", 1)],
        w=6,
        h=5),
    stat(
        "Longest hold",
        "The longest time a node has been held for capacity.",
        ('max(healer_remediation_phase_seconds{phase="HeldForCapacity"} and on (job, instance) '
         "(healer_leader == 1)) or vector(0)"),
        unit="s",
        w=6,
        h=5),
    bargauge(
        "Free spares by domain",
        ("Right now. A domain that had a free spare in the time range and has none now shows 0 "
         "(healer exports no series for a domain without a free spare)."),
        Q(("max by (domain) (healer_spare_pool_free) or max by (domain) "
           "(max_over_time(healer_spare_pool_free[$__range])) * 0"),
          "{{domain}}")),
    timeseries(
        "Free spares by domain over time",
        "",
        Q("max by (domain) (healer_spare_pool_free)", "{{domain}}"),
        w=16),
    timeseries(
        "Held for capacity and waiting for a spare",
        "Nodes held, and open remediations in Cordoned/Swapping/HeldForCapacity.",
        Q("max(healer_held_for_capacity and on (job, instance) (healer_leader == 1))",
          "held for capacity"),
        Q(('sum by (phase) (healer_remediations{phase=~"Cordoned|Swapping|HeldForCapacity"} and '
           "on (job, instance) (healer_leader == 1))"),
          "{{phase}}")),
    table(
        "Held nodes",
        ("Each node held for capacity, its incident and how long it has waited. It leaves the "
         "hold when a spare joins the pool (a repaired node) or the policy's swap.holdTimeout "
         "escalates it."),
        ('max by (node, incident) (healer_remediation_phase_seconds{phase="HeldForCapacity"} '
         "and on (job, instance) (healer_leader == 1))"),
        unit="s"),
]



def build() -> Dashboard:
    return dashboard("healer-capacity", "Spare capacity and held nodes", DESCRIPTION,
                     ['capacity'], PANELS)
