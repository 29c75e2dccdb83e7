"""The node agent's own metrics, in their own registry (served on the agent's ``/metrics``).

Counters count what happened (XIDs and other NVML events per GPU, failed NVML calls, condition
writes, Events, API errors). Everything that describes the GPUs now (the counters NVML keeps
since the driver loaded, temperature, the per-GPU verdict) is computed at scrape time from the
latest reading and assessment, so it can never drift from what the agent publishes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from healer.agent.findings import Assessment, GpuEvent, GpuInfo, GpuReading

#: XID (or NVML event) received → the condition that reflects it written, in seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

#: name → (type, help): every metric the agent exports.
AGENT_METRICS: dict[str, tuple[str, str]] = {
    "healer_agent_gpu_xid_total": ("counter", "XID events received from NVML, per GPU and XID."),
    "healer_agent_gpu_events_total": ("counter", "NVML events received, per GPU and kind."),
    "healer_agent_nvml_errors_total": ("counter", "NVML calls that failed (other than "
                                       "NOT_SUPPORTED), per GPU, operation and error."),
    "healer_agent_condition_writes_total": ("counter", "GPUHealthy condition writes, by result."),
    "healer_agent_k8s_events_total": ("counter", "Kubernetes Events about GPUs, by reason and "
                                      "result (emitted, dropped)."),
    "healer_agent_api_errors_total": ("counter", "Failed calls to the API server, by kind."),
    "healer_agent_event_to_condition_seconds": ("histogram", "An NVML event received to the "
                                                "GPUHealthy condition written."),
    "healer_agent_up": ("gauge", "1 while the agent's event loop is alive."),
    "healer_agent_info": ("gauge", "1, labelled with the node and the NVIDIA driver version."),
    "healer_agent_gpus": ("gauge", "GPUs NVML enumerated."),
    "healer_agent_healthy": ("gauge", "1 if the GPUHealthy condition is True (labelled with "
                             "its reason)."),
    "healer_agent_gpu_healthy": ("gauge", "1 if the GPU has no finding, else 0."),
    "healer_agent_gpu_finding": ("gauge", "1 per finding on a GPU (reason, severity)."),
    "healer_agent_gpu_lost": ("gauge", "1 if NVML answered NVML_ERROR_GPU_IS_LOST."),
    "healer_agent_gpu_ecc_errors": ("gauge", "ECC error counts NVML keeps (error_type, "
                                    "counter: volatile since driver load, aggregate lifetime)."),
    "healer_agent_gpu_retired_pages": ("gauge", "Retired memory pages by cause."),
    "healer_agent_gpu_retired_pages_pending": ("gauge", "1 while a page retirement is pending."),
    "healer_agent_gpu_remapped_rows": ("gauge", "Remapped memory rows by kind."),
    "healer_agent_gpu_row_remap_pending": ("gauge", "1 while a row remap is pending (reset)."),
    "healer_agent_gpu_row_remap_failure": ("gauge", "1 if row remapping failed."),
    "healer_agent_gpu_nvlink_errors": ("gauge", "NVLink error counters summed over the active "
                                       "links."),
    "healer_agent_gpu_nvlink_active_links": ("gauge", "Active NVLinks."),
    "healer_agent_gpu_pcie_replays": ("gauge", "PCIe replay counter."),
    "healer_agent_gpu_temperature_celsius": ("gauge", "GPU temperature."),
    "healer_agent_gpu_power_watts": ("gauge", "GPU power draw."),
    "healer_agent_gpu_clocks_event_reason": ("gauge", "1 per active clocks-event (throttle) "
                                             "reason."),
    "healer_agent_last_read_timestamp_seconds": ("gauge", "When NVML was last read."),
    "healer_agent_last_write_timestamp_seconds": ("gauge", "When the condition was last "
                                                  "written."),
}

GPU_LABELS = ("gpu", "uuid")


def _help(name: str) -> str:
    return AGENT_METRICS[name][1]


def _counter_name(name: str) -> str:
    """prometheus-client adds ``_total`` to a Counter's name itself."""
    return name.removesuffix("_total")


@dataclass
class AgentState:
    """What the scrape-time collector reads (the agent keeps it current)."""

    node: str = ""
    driver: str = ""
    gpus: Sequence[GpuInfo] = ()
    readings: Sequence[GpuReading] = ()
    assessment: Assessment | None = None
    last_read: float | None = None
    last_write: float | None = None


def _gpu(info: GpuInfo) -> list[str]:
    return [str(info.index), info.uuid]


class _StateCollector(Collector):
    def __init__(self, state: Callable[[], AgentState]) -> None:
        self.state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        st = self.state()
        yield GaugeMetricFamily("healer_agent_up", _help("healer_agent_up"), value=1)
        info = GaugeMetricFamily("healer_agent_info", _help("healer_agent_info"),
                                 labels=["node", "driver"])
        info.add_metric([st.node, st.driver], 1)
        yield info
        yield GaugeMetricFamily("healer_agent_gpus", _help("healer_agent_gpus"),
                                value=len(st.gpus))
        yield from self._assessment(st.assessment)
        yield from _readings(st.readings)
        for name, value in (("healer_agent_last_read_timestamp_seconds", st.last_read),
                            ("healer_agent_last_write_timestamp_seconds", st.last_write)):
            fam = GaugeMetricFamily(name, _help(name))
            if value is not None:
                fam.add_metric([], value)
            yield fam

    @staticmethod
    def _assessment(a: Assessment | None) -> Iterator[GaugeMetricFamily]:
        node = GaugeMetricFamily("healer_agent_healthy", _help("healer_agent_healthy"),
                                 labels=["reason"])
        healthy = GaugeMetricFamily("healer_agent_gpu_healthy", _help("healer_agent_gpu_healthy"),
                                    labels=list(GPU_LABELS))
        finding = GaugeMetricFamily("healer_agent_gpu_finding", _help("healer_agent_gpu_finding"),
                                    labels=[*GPU_LABELS, "reason", "severity"])
        if a is not None:
            node.add_metric([a.reason.value], 1 if a.healthy else 0)
            for g in a.gpus:
                labels = [str(g.gpu.index), g.gpu.uuid]
                healthy.add_metric(labels, 1 if g.healthy else 0)
                for f in g.findings:
                    sev = f.severity
                    finding.add_metric([*labels, f.reason.value,
                                        "" if sev is None else sev.label], 1)
        yield node
        yield healthy
        yield finding


def _family(name: str, extra: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, _help(name), labels=[*GPU_LABELS, *extra])


def _readings(readings: Sequence[GpuReading]) -> Iterator[GaugeMetricFamily]:
    lost = _family("healer_agent_gpu_lost")
    ecc = _family("healer_agent_gpu_ecc_errors", ("error_type", "counter"))
    retired = _family("healer_agent_gpu_retired_pages", ("cause",))
    retired_pending = _family("healer_agent_gpu_retired_pages_pending")
    rows = _family("healer_agent_gpu_remapped_rows", ("kind",))
    rows_pending = _family("healer_agent_gpu_row_remap_pending")
    rows_failure = _family("healer_agent_gpu_row_remap_failure")
    nvlink = _family("healer_agent_gpu_nvlink_errors", ("counter",))
    links = _family("healer_agent_gpu_nvlink_active_links")
    pcie = _family("healer_agent_gpu_pcie_replays")
    temp = _family("healer_agent_gpu_temperature_celsius")
    power = _family("healer_agent_gpu_power_watts")
    clocks = _family("healer_agent_gpu_clocks_event_reason", ("reason",))
    for r in readings:
        g = _gpu(r.gpu)
        lost.add_metric(g, 1 if r.lost else 0)
        if r.lost:
            continue
        for etype, counter, value in (
                ("corrected", "volatile", r.ecc.volatile_corrected),
                ("uncorrected", "volatile", r.ecc.volatile_uncorrected),
                ("corrected", "aggregate", r.ecc.aggregate_corrected),
                ("uncorrected", "aggregate", r.ecc.aggregate_uncorrected)):
            if value is not None:
                ecc.add_metric([*g, etype, counter], value)
        p = r.retired_pages
        if p is not None:
            for cause, n in (("multiple_single_bit", p.multiple_single_bit),
                             ("double_bit", p.double_bit)):
                if n is not None:
                    retired.add_metric([*g, cause], n)
            if p.pending is not None:
                retired_pending.add_metric(g, int(p.pending))
        m = r.remapped_rows
        if m is not None:
            rows.add_metric([*g, "correctable"], m.correctable)
            rows.add_metric([*g, "uncorrectable"], m.uncorrectable)
            rows_pending.add_metric(g, int(m.pending))
            rows_failure.add_metric(g, int(m.failure))
        if r.nvlink is not None:
            links.add_metric(g, r.nvlink.active_links)
            for kind, n in r.nvlink.by_kind().items():
                nvlink.add_metric([*g, kind], n)
        if r.pcie_replays is not None:
            pcie.add_metric(g, r.pcie_replays)
        if r.temperature_c is not None:
            temp.add_metric(g, r.temperature_c)
        if r.power_w is not None:
            power.add_metric(g, r.power_w)
        for reason in sorted(r.clocks_event_reasons or ()):
            clocks.add_metric([*g, reason], 1)
    yield from (lost, ecc, retired, retired_pending, rows, rows_pending, rows_failure, nvlink,
                links, pcie, temp, power, clocks)


def split_error(text: str) -> tuple[str, str]:
    """``"ecc volatile uncorrected: NVML_ERROR_NO_PERMISSION (...)"`` → (operation, error)."""
    operation, _, rest = text.partition(": ")
    error = rest.split(" ", 1)[0] if rest else "unknown"
    return operation or "unknown", error or "unknown"


class AgentMetrics:
    """The agent's registry: event counters plus the scrape-time collector over its state."""

    def __init__(self, state: Callable[[], AgentState],
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        n = "healer_agent_gpu_xid_total"
        self.xids = Counter(_counter_name(n), _help(n), [*GPU_LABELS, "xid"], registry=r)
        n = "healer_agent_gpu_events_total"
        self.events = Counter(_counter_name(n), _help(n), [*GPU_LABELS, "kind"], registry=r)
        n = "healer_agent_nvml_errors_total"
        self.nvml_errors = Counter(_counter_name(n), _help(n), ["gpu", "operation", "error"],
                                   registry=r)
        n = "healer_agent_condition_writes_total"
        self.writes = Counter(_counter_name(n), _help(n), ["result"], registry=r)
        n = "healer_agent_k8s_events_total"
        self.k8s_events = Counter(_counter_name(n), _help(n), ["reason", "result"], registry=r)
        n = "healer_agent_api_errors_total"
        self.api_errors = Counter(_counter_name(n), _help(n), ["kind"], registry=r)
        n = "healer_agent_event_to_condition_seconds"
        self.latency = Histogram(n, _help(n), buckets=LATENCY_BUCKETS, registry=r)
        self.registry.register(_StateCollector(state))

    def event(self, ev: GpuEvent) -> None:
        gpu = [str(ev.index), ev.uuid]
        self.events.labels(*gpu, ev.kind.value).inc()
        if ev.xid is not None:
            self.xids.labels(*gpu, str(ev.xid)).inc()

    def readings(self, readings: Iterable[GpuReading]) -> None:
        """Count the NVML calls that failed in this reading (NOT_SUPPORTED is no failure)."""
        for r in readings:
            for text in r.errors:
                operation, error = split_error(text)
                self.nvml_errors.labels(str(r.gpu.index), operation, error).inc()

    def nvml_failure(self, operation: str, error: str) -> None:
        self.nvml_errors.labels("", operation, error).inc()
