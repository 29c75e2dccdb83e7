"""The ``healer / Outcomes`` dashboard
(``dashboards/outcomes.json``), panel by panel."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from healer_dev.grafana.panels import PanelBuilder, Q, dashboard, row, stat, timeseries

FILE = "outcomes.json"
DESCRIPTION = (
    "Outcomes, measured: time to detect and to replacement, GPU-hours of capacity lost, and the "
    "remediations that found nothing (healer's false-positive rate). Per incident: healer report "
    "--since 7d.")

PANELS: list[PanelBuilder] = [
    row("Over the time range"),
    stat(
        "Incidents finished",
        "Incidents that reached Done, Escalated or Cancelled in the range.",
        Q("sum(increase(healer_remediations_finished_total[$__range]))", "finished"),
        decimals=0,
        graph=False,
        instant=True,
        w=6,
        h=5),
    stat(
        "False-positive rate",
        ("Finished incidents whose signal cleared on its own "
         "(healer_remediations_found_nothing_total) / finished incidents, over the range."),
        Q(("sum(increase(healer_remediations_found_nothing_total[$__range])) / "
           "clamp_min(sum(increase(healer_remediations_finished_total[$__range])), 1)"),
          "found nothing / finished"),
        unit="percentunit",
        decimals=1,
        graph=False,
        instant=True,
        w=6,
        h=5),
    stat(
        "GPU-hours lost",
        ("GPU-hours healer held nodes out of service (first drain or cordon to undrain or "
         "undo), counted as incidents finish."),
        Q("sum(increase(healer_capacity_lost_gpu_hours_total[$__range]))", "GPU-hours"),
        decimals=1,
        graph=False,
        instant=True,
        w=6,
        h=5),
    stat(
        "Time to replacement p90",
        "Incident opened to the replacement spare undrained in Slurm, p90 over the range.",
        Q(("histogram_quantile(0.9, sum by (le) "
           "(increase(healer_time_to_replacement_seconds_bucket[$__range])))"),
          "p90"),
        unit="s",
        graph=False,
        instant=True,
        w=6,
        h=5),
    row("Durations"),
    timeseries(
        "Time to detect (p50 / p90 / p99)",
        ("First sign of the fault (first suspicion or kept evidence) to the incident opened, "
         "observed when incidents finish."),
        Q(("histogram_quantile(0.5, sum by (le) "
           "(rate(healer_time_to_detect_seconds_bucket[$__rate_interval])))"),
          "p50"),
        Q(("histogram_quantile(0.9, sum by (le) "
           "(rate(healer_time_to_detect_seconds_bucket[$__rate_interval])))"),
          "p90"),
        Q(("histogram_quantile(0.99, sum by (le) "
           "(rate(healer_time_to_detect_seconds_bucket[$__rate_interval])))"),
          "p99"),
        unit="s",
        legend_right=False),
    timeseries(
        "Time to replacement (p50 / p90 / p99)",
        "Incident opened to the replacement spare undrained in Slurm.",
        Q(("histogram_quantile(0.5, sum by (le) "
           "(rate(healer_time_to_replacement_seconds_bucket[$__rate_interval])))"),
          "p50"),
        Q(("histogram_quantile(0.9, sum by (le) "
           "(rate(healer_time_to_replacement_seconds_bucket[$__rate_interval])))"),
          "p90"),
        Q(("histogram_quantile(0.99, sum by (le) "
           "(rate(healer_time_to_replacement_seconds_bucket[$__rate_interval])))"),
          "p99"),
        unit="s",
        legend_right=False),
    timeseries(
        "Step duration p90 by step",
        ("histogram_quantile(0.9) of healer_step_duration_seconds per ledger step (the "
         "step-latency dashboard has more)."),
        Q(("histogram_quantile(0.9, sum by (le, step) "
           "(rate(healer_step_duration_seconds_bucket[$__rate_interval])))"),
          "{{step}}"),
        legend_right=False,
        w=24),
    row("What it cost, and what it found"),
    timeseries(
        "Incidents finished by closing",
        "Incidents finished per hour: replaced, repaired, recovered, escalated, cancelled.",
        Q("sum by (closing) (increase(healer_remediations_finished_total[1h]))", "{{closing}}"),
        stack=True,
        legend_right=False),
    timeseries(
        "Found nothing by why",
        ("Finished incidents whose signal cleared on its own, per hour: before any disruptive "
         "step, or after the drain."),
        Q("sum by (why) (increase(healer_remediations_found_nothing_total[1h]))", "{{why}}"),
        stack=True,
        legend_right=False),
    timeseries(
        "GPU-hours lost per day by closing",
        "GPU-hours out of service per day, by how the incident ended.",
        Q("sum by (closing) (increase(healer_capacity_lost_gpu_hours_total[1d]))", "{{closing}}"),
        stack=True,
        legend_right=False),
    timeseries(
        "False-positive rate (1d window)",
        "Found nothing / finished over a sliding day.",
        Q(("sum(increase(healer_remediations_found_nothing_total[1d])) / "
           "clamp_min(sum(increase(healer_remediations_finished_total[1d])), 1)"),
          "found nothing / finished"),
        unit="percentunit",
        legend_right=False),
]



def build() -> Dashboard:
    return dashboard("healer-outcomes", "Outcomes", DESCRIPTION,
                     ['outcomes'], PANELS,
                     since="now-7d", refresh="1m")
