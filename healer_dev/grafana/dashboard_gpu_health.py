"""The ``healer / Fleet GPU health`` dashboard
(``dashboards/gpu-health.json``), panel by panel."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from healer_dev.grafana.panels import (
    PanelBuilder,
    Q,
    dashboard,
    dcgm,
    gpu_node_variable,
    row,
    stat,
    state_timeline,
    table,
    timeseries,
)

FILE = "gpu-health.json"
DESCRIPTION = (
    "DCGM-exporter health fields for every GPU, by node and GPU. Works with both dcgm-exporter "
    "host-label spellings (Hostname in released versions, hostname on newer builds): both are "
    "normalised to a `node` label.")


def gpu_max(metric: str) -> str:
    """Per node and GPU, a dcgm-exporter gauge."""
    return f"max by (node, gpu) ({dcgm(metric)})"


def gpu_rate(metric: str) -> str:
    """Per node and GPU, the per-second rate of a dcgm-exporter counter."""
    return f"sum by (node, gpu) ({dcgm(metric, 'rate', '$__rate_interval')})"


def gpus_over_zero(per_gpu: str) -> str:
    """How many GPUs have a value above zero (0 when none)."""
    return f"count({per_gpu} > 0) or vector(0)"

PANELS: list[PanelBuilder] = [
    row("Overview"),
    stat(
        "GPUs reporting",
        "GPUs with a temperature sample (every GPU the exporters see).",
        "count(" + gpu_max("DCGM_FI_DEV_GPU_TEMP") + ")"),
    stat(
        "GPUs whose last XID is non-zero",
        "DCGM_FI_DEV_XID_ERRORS keeps the last XID a GPU reported (until the driver reloads).",
        gpus_over_zero(gpu_max("DCGM_FI_DEV_XID_ERRORS")),
        thresholds=[("green", None), ("orange", 1)]),
    stat(
        "Double-bit ECC errors (range)",
        "GPUs whose volatile double-bit ECC counter grew in the dashboard's time range.",
        gpus_over_zero("max by (node, gpu) ("
                       + dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "increase", "$__range") + ")"),
        thresholds=[("green", None), ("red", 1)],
        instant=True),
    stat(
        "Row remap pending",
        "GPUs that need a reset to apply a row remap.",
        gpus_over_zero(gpu_max("DCGM_FI_DEV_ROW_REMAP_PENDING")),
        thresholds=[("green", None), ("orange", 1)]),
    stat(
        "Row remap failed",
        "GPUs whose row remapping failed (replace the GPU).",
        gpus_over_zero(gpu_max("DCGM_FI_DEV_ROW_REMAP_FAILURE")),
        thresholds=[("green", None), ("red", 1)]),
    stat(
        "Hottest GPU",
        "The highest GPU temperature in the fleet.",
        "max(" + dcgm("DCGM_FI_DEV_GPU_TEMP") + ")",
        unit="celsius",
        thresholds=[("green", None), ("orange", 80), ("red", 90)]),
    row("XID errors"),
    table(
        "Last XID per GPU",
        ("GPUs whose last reported XID is non-zero, with the exporter's err_code/err_msg. "
         "`healer xid <code>` explains a code and what healer does about it."),
        "max by (node, gpu, err_code, err_msg) (" + dcgm("DCGM_FI_DEV_XID_ERRORS") + ") > 0",
        w=10),
    timeseries(
        "XID occurrences in the exporter window",
        ("DCGM_EXP_XID_ERRORS_COUNT: occurrences per XID within dcgm-exporter's sliding window "
         "(--xid-count-window-size, default 5m); needs the XID count collector."),
        Q("sum by (node, gpu, xid) ("
          + dcgm("DCGM_EXP_XID_ERRORS_COUNT", where='xid!=""') + ")",
          "{{node}} GPU {{gpu}} XID {{xid}}"),
        w=14),
    row("Memory: ECC and row remapping"),
    timeseries(
        "Single-bit ECC errors /s (volatile)",
        "Corrected errors; a rising rate is a degrading GPU.",
        Q(gpu_rate("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
          "{{node}} GPU {{gpu}}"),
        unit="cps"),
    timeseries(
        "Double-bit ECC errors /s (volatile)",
        "Uncorrectable errors: the running job was likely hit.",
        Q(gpu_rate("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
          "{{node}} GPU {{gpu}}"),
        unit="cps"),
    timeseries(
        "Aggregate ECC errors (lifetime)",
        "Persistent (aggregate) ECC counters.",
        Q(gpu_max("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
          "{{node}} GPU {{gpu}} SBE"),
        Q(gpu_max("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
          "{{node}} GPU {{gpu}} DBE"),
        w=8),
    state_timeline(
        "Row remap pending",
        "1 while a row remap waits for a GPU reset.",
        Q(gpu_max("DCGM_FI_DEV_ROW_REMAP_PENDING"),
          "{{node}} GPU {{gpu}}"),
        mappings={0: ("ok", "green"), 1: ("pending", "orange")},
        w=8),
    state_timeline(
        "Row remap failure",
        "1 once row remapping failed.",
        Q(gpu_max("DCGM_FI_DEV_ROW_REMAP_FAILURE"),
          "{{node}} GPU {{gpu}}"),
        mappings={0: ("ok", "green"), 1: ("failed", "red")},
        w=8),
    timeseries(
        "Remapped rows",
        "Rows remapped for correctable and uncorrectable errors.",
        Q(gpu_max("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),
          "{{node}} GPU {{gpu}} correctable"),
        Q(gpu_max("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
          "{{node}} GPU {{gpu}} uncorrectable")),
    timeseries(
        "Retired pages (pre-Ampere)",
        "Page retirement counters (GPUs before Ampere; newer GPUs remap rows instead).",
        Q(gpu_max("DCGM_FI_DEV_RETIRED_SBE"),
          "{{node}} GPU {{gpu}} SBE"),
        Q(gpu_max("DCGM_FI_DEV_RETIRED_DBE"),
          "{{node}} GPU {{gpu}} DBE"),
        Q(gpu_max("DCGM_FI_DEV_RETIRED_PENDING"),
          "{{node}} GPU {{gpu}} pending")),
    row("Interconnect: NVLink and PCIe"),
    timeseries(
        "NVLink CRC errors /s",
        "Flow-control (flit) and data CRC errors.",
        Q(gpu_rate("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
          "{{node}} GPU {{gpu}} flit"),
        Q(gpu_rate("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
          "{{node}} GPU {{gpu}} data"),
        unit="cps",
        w=8),
    timeseries(
        "NVLink replay and recovery errors /s",
        "Link-level retries and recoveries.",
        Q(gpu_rate("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
          "{{node}} GPU {{gpu}} replay"),
        Q(gpu_rate("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
          "{{node}} GPU {{gpu}} recovery"),
        unit="cps",
        w=8),
    timeseries(
        "PCIe replays /s",
        "PCIe link retries.",
        Q(gpu_rate("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
          "{{node}} GPU {{gpu}}"),
        unit="cps",
        w=8),
    row("Thermal and power"),
    timeseries(
        "GPU temperature",
        "Core temperature per GPU.",
        Q(gpu_max("DCGM_FI_DEV_GPU_TEMP"),
          "{{node}} GPU {{gpu}}"),
        unit="celsius"),
    timeseries(
        "Power draw",
        "Board power per GPU.",
        Q(gpu_max("DCGM_FI_DEV_POWER_USAGE"),
          "{{node}} GPU {{gpu}}"),
        unit="watt"),
    timeseries(
        "Thermal violation (share of time throttled)",
        ("DCGM_FI_DEV_THERMAL_VIOLATION grows by the nanoseconds a GPU was clocked down for "
         "heat; its rate / 1e9 is the share of time throttled."),
        Q(gpu_rate("DCGM_FI_DEV_THERMAL_VIOLATION") + " / 1e9",
          "{{node}} GPU {{gpu}}"),
        unit="percentunit",
        minimum=0),
    timeseries(
        "Power violation (share of time capped)",
        "DCGM_FI_DEV_POWER_VIOLATION in ns per second / 1e9: the share of time power-capped.",
        Q(gpu_rate("DCGM_FI_DEV_POWER_VIOLATION") + " / 1e9",
          "{{node}} GPU {{gpu}}"),
        unit="percentunit",
        minimum=0),
]



def build() -> Dashboard:
    return dashboard("healer-gpu-health", "Fleet GPU health", DESCRIPTION,
                     ['gpu', 'dcgm'], PANELS, [gpu_node_variable()])
