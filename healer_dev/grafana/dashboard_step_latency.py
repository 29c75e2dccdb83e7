"""The ``healer / Step latencies`` dashboard
(``dashboards/step-latency.json``), panel by panel."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from healer_dev.grafana.panels import (
    PanelBuilder,
    Q,
    dashboard,
    heatmap,
    row,
    stat,
    table,
    timeseries,
    variable,
)

FILE = "step-latency.json"
DESCRIPTION = (
    "How long each ledger step takes and how long a fault waits for healer's first disruptive "
    "action.")

PANELS: list[PanelBuilder] = [
    timeseries(
        "Step duration p50 by step",
        "histogram_quantile(0.5) of healer_step_duration_seconds per step.",
        Q(("histogram_quantile(0.5, sum by (le, step) "
           '(rate(healer_step_duration_seconds_bucket{step=~"$step"}[$__rate_interval])))'),
          "{{step}}"),
        unit="s",
        w=8),
    timeseries(
        "Step duration p90 by step",
        "histogram_quantile(0.9) of healer_step_duration_seconds per step.",
        Q(("histogram_quantile(0.9, sum by (le, step) "
           '(rate(healer_step_duration_seconds_bucket{step=~"$step"}[$__rate_interval])))'),
          "{{step}}"),
        unit="s",
        w=8),
    timeseries(
        "Step duration p99 by step",
        "histogram_quantile(0.99) of healer_step_duration_seconds per step.",
        Q(("histogram_quantile(0.99, sum by (le, step) "
           '(rate(healer_step_duration_seconds_bucket{step=~"$step"}[$__rate_interval])))'),
          "{{step}}"),
        unit="s",
        w=8),
    table(
        "Step duration quantiles over the range",
        "p50, p90 and p99 per step over the dashboard's time range.",
        Q(("histogram_quantile(0.5, sum by (le, step) "
           '(increase(healer_step_duration_seconds_bucket{step=~"$step"}[$__range])))'),
          "p50"),
        Q(("histogram_quantile(0.9, sum by (le, step) "
           '(increase(healer_step_duration_seconds_bucket{step=~"$step"}[$__range])))'),
          "p90"),
        Q(("histogram_quantile(0.99, sum by (le, step) "
           '(increase(healer_step_duration_seconds_bucket{step=~"$step"}[$__range])))'),
          "p99"),
        unit="s"),
    timeseries(
        "Mean step duration (since each controller start)",
        "Sum over count of the step histogram.",
        Q(('sum by (step) (healer_step_duration_seconds_sum{step=~"$step"}) / sum by (step) '
           '(healer_step_duration_seconds_count{step=~"$step"})'),
          "{{step}}"),
        unit="s"),
    timeseries(
        "Steps finished /min by outcome",
        "Completed ledger steps.",
        Q(("sum by (step, outcome) "
           '(rate(healer_step_duration_seconds_count{step=~"$step"}[$__rate_interval])) * 60'),
          "{{step}} {{outcome}}")),
    heatmap(
        "Step duration distribution",
        "All selected steps, per histogram bucket.",
        Q(("sum by (le) "
           '(increase(healer_step_duration_seconds_bucket{step=~"$step"}[$__rate_interval]))'),
          "{{le}}")),
    row("Signal to action"),
    timeseries(
        "First signal → first disruptive action",
        ("p50/p90/p99 of healer_signal_to_action_seconds: from the first evidence to the "
         "admission."),
        Q(("histogram_quantile(0.5, sum by (le) "
           "(rate(healer_signal_to_action_seconds_bucket[$__rate_interval])))"),
          "p50"),
        Q(("histogram_quantile(0.9, sum by (le) "
           "(rate(healer_signal_to_action_seconds_bucket[$__rate_interval])))"),
          "p90"),
        Q(("histogram_quantile(0.99, sum by (le) "
           "(rate(healer_signal_to_action_seconds_bucket[$__rate_interval])))"),
          "p99"),
        unit="s"),
    timeseries(
        "Signal → action p90 by policy and severity",
        "",
        Q(("histogram_quantile(0.9, sum by (le, policy, severity) "
           "(rate(healer_signal_to_action_seconds_bucket[$__rate_interval])))"),
          "{{policy}} {{severity}}"),
        unit="s"),
    stat(
        "Signal → action p90 (range)",
        "Over the dashboard's time range.",
        ("histogram_quantile(0.9, sum by (le) "
         "(increase(healer_signal_to_action_seconds_bucket[$__range])))"),
        unit="s",
        instant=True,
        w=6,
        h=5),
    stat(
        "Admissions (range)",
        "Remediations admitted (first disruptive action) in the time range.",
        "sum(increase(healer_signal_to_action_seconds_count[$__range]))",
        decimals=0,
        instant=True,
        w=6,
        h=5),
]



def build() -> Dashboard:
    return dashboard("healer-latency", "Step latencies", DESCRIPTION,
                     ['latency'], PANELS,
                     [variable("step", "Step",
                               "label_values(healer_step_duration_seconds_count, step)")])
