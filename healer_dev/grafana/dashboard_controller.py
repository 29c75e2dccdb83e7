"""The ``healer / Controller health`` dashboard
(``dashboards/controller-health.json``), panel by panel."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from healer_dev.grafana.panels import (
    PanelBuilder,
    Q,
    dashboard,
    row,
    stat,
    state_timeline,
    table,
    timeseries,
)

FILE = "controller-health.json"
DESCRIPTION = (
    "healer's own health: replicas, leadership, policies, calls to Kubernetes, Slurm and "
    "Prometheus, and telemetry freshness.")

PANELS: list[PanelBuilder] = [
    stat(
        "Replicas up",
        "Replicas whose event loop answers a scrape.",
        "sum(healer_up)"),
    stat(
        "Leaders",
        "Exactly one replica should lead.",
        "sum(healer_leader)",
        thresholds=[("red", None), ("green", 1), ("red", 2)]),
    stat(
        "Last policy reload",
        "0 when the last reload failed on any replica.",
        "min(healer_policy_last_reload_success)",
        thresholds=[("red", None), ("green", 1)],
        mappings={0: ("FAILED", "red"), 1: ("ok", "green")}),
    stat(
        "Policy digests in force",
        "More than one: replicas disagree on policies.",
        "count(count by (digest) (healer_policy_info))",
        thresholds=[("green", None), ("orange", 2)]),
    stat(
        "API errors /s",
        "Failed calls to Kubernetes, Slurm and Prometheus.",
        "sum(rate(healer_api_call_errors_total[$__rate_interval])) or vector(0)",
        unit="reqps"),
    stat(
        "Stale telemetry (nodes)",
        "Nodes whose telemetry is stale (unknown).",
        "sum(max by (source) (healer_telemetry_stale_nodes)) or vector(0)",
        thresholds=[("green", None), ("orange", 1)]),
    row("Replicas and policies"),
    state_timeline(
        "Up and leading, by replica",
        "",
        Q("max by (instance) (healer_up)", "{{instance}} up"),
        Q("max by (instance) (healer_leader)", "{{instance}} leader"),
        mappings={0: ("no", "transparent"), 1: ("yes", "green")}),
    timeseries(
        "Policy reloads by result",
        "",
        Q("sum by (result) (increase(healer_policy_reloads_total[$__rate_interval]))",
          "{{result}}"),
        Q("sum by (reason) (increase(healer_policy_reload_failures_total[$__rate_interval]))",
          "failed: {{reason}}"),
        decimals=0),
    table(
        "Policy digest per replica",
        "The digest of the policies each replica runs.",
        "max by (instance, digest) (healer_policy_info)"),
    timeseries(
        "Last policy reload succeeded",
        "",
        Q("max by (instance) (healer_policy_last_reload_success)", "{{instance}}"),
        Q(("max by (instance) (healer_policy_last_success_timestamp_seconds) > bool (time() - "
           "3600)"),
          "good load within the hour: {{instance}}"),
        minimum=0),
    row("Calls to Kubernetes, Slurm and Prometheus"),
    timeseries(
        "Calls /s",
        "By system and operation.",
        Q(("sum by (system, operation) "
           "(rate(healer_api_call_duration_seconds_count[$__rate_interval]))"),
          "{{system}} {{operation}}"),
        unit="reqps",
        w=8),
    timeseries(
        "Call latency p99",
        "",
        Q(("histogram_quantile(0.99, sum by (le, system, operation) "
           "(rate(healer_api_call_duration_seconds_bucket[$__rate_interval])))"),
          "{{system}} {{operation}}"),
        unit="s",
        w=8),
    timeseries(
        "Call errors /s",
        "By system, operation and kind.",
        Q(("sum by (system, operation, kind) "
           "(rate(healer_api_call_errors_total[$__rate_interval]))"),
          "{{system}} {{operation}} {{kind}}"),
        unit="reqps",
        w=8),
    row("Telemetry"),
    timeseries(
        "Stale nodes by source",
        "Stale telemetry is unknown, never failed: it alerts and never disrupts.",
        Q("max by (source) (healer_telemetry_stale_nodes)", "{{source}}"),
        decimals=0),
    timeseries(
        "Seconds since the last successful poll",
        "",
        Q("time() - max by (source) (healer_telemetry_last_success_timestamp_seconds)",
          "{{source}}"),
        unit="s"),
    timeseries(
        "Telemetry samples dropped /s",
        ("Samples and answers dropped as unusable (NaN, ±Inf, impossible values, stamps outside "
         "the query's window, answers that are not answers), by source, metric and reason: they "
         "were never read, and only their own series is affected (docs/operations.md)."),
        Q("sum by (source, metric, reason) (rate(healer_telemetry_samples_dropped_total[5m]))",
          "{{source}} {{metric}} {{reason}}"),
        unit="short",
        w=24),
]



def build() -> Dashboard:
    return dashboard("healer-controller", "Controller health", DESCRIPTION,
                     ['controller'], PANELS)
