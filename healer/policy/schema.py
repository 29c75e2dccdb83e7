"""The policy file format, layer one: the field schema (pydantic v2).

Field types, ranges and enumerations live here; rules that relate several fields live in
:mod:`healer.policy.compile` (layer two). This is the only module that imports pydantic.
``policies/schema.json`` is generated from :func:`json_schema`.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

from healer.core.slurm_drivers import DRIVERS, SlurmDriverKind
from healer.core.topology import DOMAIN_LABEL, MAX_TIERS, TIER_PREFIX
from healer.core.vocabulary import ROLE_LABEL, SPARE_ROLE
from healer.policy.checks import (
    MAX_DURATION,
    MAX_QUANTITY,
    check_configmap_ref,
    check_http_url,
    check_image_ref,
    check_label_key,
    check_label_value,
    check_prom_label,
    check_secret_ref,
    check_signal,
)
from healer.policy.promql_limits import MAX_LOOKBACK

API_VERSION = "healer.io/v1alpha1"

_DURATION_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h|d))+$")
_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d))+$"


def parse_duration(value: Any) -> float:
    """``"90s"``, ``"5m"``, ``"1h30m"``, ``"7d"`` → seconds."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError("expected a duration string such as 30s, 5m, 2h or 7d")
    text = value.strip()
    if len(text) > 4096 or not _DURATION_RE.match(text):
        raise ValueError(f"expected a duration such as 30s, 5m, 2h or 7d, got {value!r:.70}")
    seconds = sum(float(n) * _UNITS[u] for n, u in _PART_RE.findall(text))
    if not math.isfinite(seconds) or seconds > MAX_DURATION:
        raise ValueError(f"expected a duration of at most 366d, got {value!r:.70}")
    return seconds


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN,
                    "description": "a duration: 30s, 5m, 1h30m, 7d"}),
]


def _parse_quantity(value: Any) -> str:
    if isinstance(value, bool):
        raise ValueError("expected a count (e.g. 2) or a percentage (e.g. 10%)")
    if isinstance(value, int):
        if not 0 <= value <= MAX_QUANTITY:
            raise ValueError(f"expected a count between 0 and {MAX_QUANTITY}, got {value:.3g}")
        return str(value)
    if (isinstance(value, str) and len(value) <= 32
            and re.fullmatch(r"\d+(\.\d+)?%", value.strip())):
        pct = float(value.strip()[:-1])
        if not 0 <= pct <= 100:
            raise ValueError(f"expected a percentage between 0% and 100%, got {value}")
        return value.strip()
    raise ValueError(f"expected a count (e.g. 2) or a percentage (e.g. 10%), got {value!r:.70}")


Quantity = Annotated[
    str,
    BeforeValidator(_parse_quantity),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_QUANTITY},
                              {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?%$"}],
                    "description": "a count (2) or a percentage of the population (10%)"}),
]


def _int(lo: int, hi: int, **kw: Any) -> Any:
    """An integer field in [lo, hi]; ``true`` is not 1 and ``2.0`` is not 2 (strict)."""
    return Field(strict=True, ge=lo, le=hi, **kw)


Flag = Annotated[bool, Field(strict=True)]  # true/false only: not 1, not "yes"
#: a threshold: finite (no .nan, no .inf) and of a size a telemetry value can have
Number = Annotated[float, Field(ge=-1e15, le=1e15, allow_inf_nan=False)]
LabelKey = Annotated[str, BeforeValidator(check_label_key)]
LabelValue = Annotated[str, BeforeValidator(check_label_value)]
HttpUrl = Annotated[str, BeforeValidator(check_http_url)]
SignalName = Annotated[str, BeforeValidator(check_signal)]
SecretRef = Annotated[str, BeforeValidator(check_secret_ref), WithJsonSchema({
    "type": "string", "maxLength": 600, "description": "NAMESPACE/NAME[:KEY] of a Secret",
    "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?"
               r"(:[-._A-Za-z0-9]{1,253})?$"})]
ConfigMapRef = Annotated[str, BeforeValidator(check_configmap_ref), WithJsonSchema({
    "type": "string", "maxLength": 320, "description": "NAMESPACE/NAME of a ConfigMap",
    "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$"})]
ImageRef = Annotated[str, BeforeValidator(check_image_ref), WithJsonSchema({
    "type": "string", "maxLength": 512,
    "description": "a container image reference: [registry[:port]/]name[:tag][@digest]"})]
_METRIC_NAME = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"
PromLabel = Annotated[str, BeforeValidator(check_prom_label),
                      WithJsonSchema({"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$",
                                      "maxLength": 128,
                                      "description": "a Prometheus label name"})]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True,
                              frozen=True, allow_inf_nan=False)


# ---------------------------------------------------------------------------------------------


class Metadata(Model):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63,
                      description="DNS-1123 label naming the policy")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class SelectorRequirement(Model):
    key: LabelKey = Field(description="a Kubernetes label key ([prefix/]name)")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[LabelValue] = Field(default_factory=list, max_length=256)


class Selector(Model):
    match_labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=64)
    match_expressions: list[SelectorRequirement] = Field(default_factory=list, max_length=64)


class XidMatch(Model):
    groups: list[str] = Field(default_factory=list, description="groups from the XID catalog")
    codes: list[Annotated[int, _int(1, 1024)]] = Field(default_factory=list)
    exclude: list[Annotated[int, _int(1, 1024)]] = Field(default_factory=list)
    count: int = _int(1, 10_000, default=1, description="occurrences needed ...")
    within: Duration = Field(default=3600.0, ge=1, description="... within this window")


class MetricMatch(Model):
    field: str | None = Field(default=None, pattern=_METRIC_NAME, max_length=256,
                              description="a dcgm-exporter metric name (judged per GPU)")
    series: str | None = Field(default=None, pattern=_METRIC_NAME, max_length=256, description=(
        "any Prometheus metric name (node-exporter's node_infiniband_state_id, ...): judged "
        "per node, or per part with per"))
    matchers: dict[PromLabel, Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict, max_length=16,
        description="series: equality label matchers added to its selector")
    promql: str | None = Field(default=None, min_length=1, max_length=4096, description=(
        "a PromQL expression; its series need the node label and, for per-GPU rules, gpu/UUID "
        "labels. Bounded, as it runs every poll: it reads at most 1d back (ranges, subquery "
        "ranges and offsets together), every selector names its metric (by =), a subquery "
        "says its step (at least 10s, at most 1440 steps, none inside another), no @ "
        "modifier, no negative offset"))
    per: list[PromLabel] = Field(default_factory=list, max_length=8, description=(
        "series or promql: the labels that tell the node's parts apart (device, port: per "
        "HCA port); the rule is judged per part and its evidence names the part"))
    node_label: PromLabel | None = Field(default=None, description=(
        "series or promql: the label naming the Kubernetes node (default: the source's host "
        "labels, Hostname or hostname)"))
    aggregation: Literal["value", "increase", "rate", "max_over_time", "changes"] = Field(
        default="value", description="field or series: value (the last sample), increase or "
        "rate of a counter, max_over_time, changes (how often it changed: flaps) in window")
    window: Duration = Field(default=300.0, ge=1, le=MAX_LOOKBACK, description=(
        "the range of increase/rate/max_over_time/changes: 1s to 1d (a longer view belongs "
        "in a recording rule)"))
    op: Literal[">", ">=", "<", "<=", "==", "!="] = ">"
    threshold: Number
    hold_for: Duration = Field(default=0.0, ge=0, alias="for")


class ConditionMatch(Model):
    type: str = Field(min_length=1, max_length=316, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_./]*$",
                      description="node condition type, e.g. GPUHealthy")
    status: list[Literal["True", "False", "Unknown"]] = Field(default=["True"], min_length=1)
    reason: str | None = Field(default=None, max_length=1024, description=(
        "regular expression (RE2 syntax: linear time, no backreferences or lookaround) "
        "searched in the reason"))
    hold_for: Duration = Field(default=0.0, ge=0, alias="for")
    count: int = _int(0, 10_000, default=0, description="N transitions into the status ...")
    within: Duration = Field(default=0.0, ge=0, description="... within this window")
    stale_after: Duration | None = Field(default=None, description=(
        "heartbeat window: a condition whose lastHeartbeatTime is older than this is stale "
        "(its detector stopped): unknown, alerting, never disruptive; 0 never judges it. "
        "Default: 5 missed heartbeats of its detector (GPUHealthy, healer's agent: 2m30s; "
        "any other type, e.g. NPD's: 25m)"))


class NotReadyMatch(Model):
    hold_for: Duration = Field(default=300.0, ge=0, alias="for")


class StalenessMatch(Model):
    after: Duration = Field(gt=0, description="no fresh sample for this long: stale")
    sources: list[Literal["dcgm"]] = Field(default_factory=list, max_length=8, description=(
        "the telemetry sources judged: dcgm (DCGM and any series through Prometheus, the one "
        "source whose samples carry freshness); empty: every source"))


class SlurmMatch(Model):
    states: list[Literal["DOWN", "NOT_RESPONDING", "FAIL", "DRAIN"]] = Field(
        min_length=1, max_length=4, description=(
            "Slurm states that match (any of them): DOWN, NOT_RESPONDING, FAIL, DRAIN. A drain "
            "with healer's reason (healer: ...) or the slurm-operator's never counts"))
    reason: str | None = Field(default=None, max_length=1024, description=(
        "regular expression (RE2 syntax) searched in the reason of whoever took the node out "
        "(an admin, the HealthCheckProgram, e.g. ^NHC:); absent: any reason"))
    hold_for: Duration = Field(default=0.0, ge=0, alias="for", description=(
        "how long the state (and, with reason, that reason) must last"))


class RuleSpec(Model):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    severity: Literal["degrading", "failed"] | None = None
    xid: XidMatch | None = None
    metric: MetricMatch | None = None
    condition: ConditionMatch | None = None
    not_ready: NotReadyMatch | None = None
    staleness: StalenessMatch | None = None
    slurm: SlurmMatch | None = None


class HookEndpoint(Model):
    """Where a webhook or job hook goes (checkpoint and repair share these fields)."""

    url: HttpUrl | None = None
    secret_ref: SecretRef | None = Field(default=None, description=(
        "webhook: NAMESPACE/NAME[:KEY] of the Secret holding this hook's HMAC key (required)"))
    allow_insecure_http: Flag = Field(default=False, description=(
        "webhook: accept an http:// url (default: https only)"))
    job_template: ConfigMapRef | None = Field(default=None, description=(
        "job: NAMESPACE/NAME of the ConfigMap whose key job.yaml holds the Job manifest"))


class CheckpointSpec(HookEndpoint):
    enabled: Flag = False
    hook: Literal["slurm-signal", "webhook", "job"] = "slurm-signal"
    signal: SignalName = Field(default="USR1", description=(
        "a signal a job can catch: HUP INT QUIT ABRT ALRM TERM USR1 USR2 URG CONT TSTP TTIN "
        "TTOU (SIG prefix optional)"))
    deadline: Duration = Field(default=600.0, ge=1)
    on_timeout: Literal["continue", "escalate"] = "continue"
    severities: list[Literal["degrading", "failed"]] = Field(default=["degrading"])


class DrainSpec(Model):
    deadline: Duration = Field(default=7200.0, ge=1)
    on_timeout: Literal["escalate", "requeue"] = "escalate"
    requeue_grace: Duration = Field(default=300.0, gt=0)


class SwapSpec(Model):
    enabled: Flag = True
    deadline: Duration = Field(default=1800.0, ge=1)
    hold_timeout: Duration = Field(default=0.0, ge=0)
    require_same_domain: Flag = Field(default=False, description=(
        "take only a spare in the node's NVLink domain (accelerator.topograph.run/domain); "
        "with none free the node is HeldForCapacity. Default: the nearest spare, reported "
        "(Event SpareFromOtherDomain, status.sparePlacement) when it is in another domain"))
    foreign_reason: Literal["hold", "carryOver"] = Field(default="hold", description=(
        "a Slurm drain or DOWN reason someone else set (an admin, a HealthCheckProgram; not "
        "Slurm's own 'Not responding'), which moving the slurmd would lose: hold (the swap "
        "waits and says why until the owner clears it) or carryOver (the replacement is "
        "drained with that reason, word for word, through Slurm's API). docs/adr/0016"))


class ValidationSpec(Model):
    enabled: Flag = False
    image: ImageRef | None = Field(default=None, description=(
        "the validation Job's container image: [registry[:port]/]name[:tag][@digest]"))
    command: list[str] = Field(default_factory=list, max_length=256)
    deadline: Duration = Field(default=1800.0, ge=1)


class RepairSpec(HookEndpoint):
    hook: Literal["none", "webhook", "job"] = "none"
    deadline: Duration = Field(default=0.0, ge=0)


class StepsSpec(Model):
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    drain: DrainSpec = Field(default_factory=DrainSpec)
    swap: SwapSpec = Field(default_factory=SwapSpec)
    validation: ValidationSpec = Field(default_factory=ValidationSpec)
    repair: RepairSpec = Field(default_factory=RepairSpec)
    step_deadline: Duration = Field(default=900.0, ge=1)
    max_attempts: int = _int(1, 100, default=5)
    poll_interval: Duration = Field(default=10.0, ge=1, le=3600,
                                    description="how often a waiting step is polled: 1s to 1h")


class FencingSpec(Model):
    providers: list[Literal["webhook", "cloudShutdown", "nodeDeleted", "manual"]] = Field(
        default_factory=lambda: ["manual", "cloudShutdown", "nodeDeleted"],  # type: ignore[arg-type]
        min_length=1, max_length=4, description=(
            "who may say a dead node's machine is off or cut off: webhook (healer calls your "
            "fencing endpoint, which powers it off through its BMC or cloud API and "
            "acknowledges fenced through healer's ack endpoint), cloudShutdown (the cloud "
            "controller manager's node.cloudprovider.kubernetes.io/shutdown taint), "
            "nodeDeleted (the cloud deleted the Node), manual (an admin annotates the Node "
            "healer.io/fenced=<who and why>)"))
    deadline: Duration = Field(default=600.0, ge=1, description=(
        "with no provider saying so by then, the node is HeldForFencing (an Event, a "
        "metric, an alert): nothing is force-deleted, ever"))
    url: HttpUrl | None = Field(default=None, description="webhook: the fencing endpoint")
    secret_ref: str | None = Field(default=None, description=(
        "webhook: NAMESPACE/NAME[:KEY] of the Secret holding its own HMAC key (required)"))
    allow_insecure_http: Flag = Field(default=False, description=(
        "webhook: accept an http:// url (default: https only)"))


class MassDeathSpec(Model):
    window: Duration = Field(default=300.0, gt=0, description=(
        "nodes that went NotReady within one window of each other count together, with "
        "those that answered again within the last window"))
    max_share: Quantity = Field(default="10%", description=(
        "more of the policy's nodes than this NotReady together: suspect the control plane "
        "or the network, fence and swap nothing until they answer again"))
    max_share_per_domain: Quantity = Field(default="25%", description=(
        "the same, within one failure domain (a value of each label of domains)"))
    domains: list[LabelKey] = Field(
        default_factory=lambda: [DOMAIN_LABEL], max_length=8,
        description="the labels whose values name the failure domains counted")


class DeadNodeSpec(Model):
    enabled: Flag = Field(default=True, description=(
        "handle nodes that die outright (the block present and enabled: yes)"))
    dead_after: Duration = Field(default=120.0, ge=1, description=(
        "notReady: the Ready condition Unknown or False this long (the node lifecycle "
        "controller sets Unknown once the kubelet's Lease expired)"))
    signals: list[Literal["notReady", "slurmNotResponding", "telemetryStale"]] = Field(
        default_factory=lambda: ["notReady", "slurmNotResponding"],  # type: ignore[arg-type]
        min_length=1, max_length=3, description=(
            "the witnesses: notReady (Kubernetes), slurmNotResponding (Slurm flags the node "
            "NOT_RESPONDING), telemetryStale (every telemetry source for it stale at once)"))
    match: Literal["all", "any"] = Field(default="all", description=(
        "all: every witness listed must agree (the default: two independent witnesses); "
        "any: one is enough"))
    fencing: FencingSpec = Field(default_factory=FencingSpec)
    mass_death: MassDeathSpec = Field(default_factory=MassDeathSpec)


class FailureDomainSpec(Model):
    key: LabelKey = Field(description="the node label whose value names the domain")
    max_unavailable: int = _int(0, MAX_QUANTITY, default=1,
                                description="nodes with one value of key that may be unable "
                                "to take jobs at once (counted as for maxUnavailable)")


class BreakerSpec(Model):
    window: Duration = Field(default=600.0, gt=0)
    threshold: Quantity = "5"
    cooldown: Duration = Field(default=1800.0, gt=0)


class RetryBudgetSpec(Model):
    per_node: int = _int(1, 1000, default=3)
    per_gpu_serial: int = _int(1, 1000, default=2)
    window: Duration = Field(default=7 * 86400.0, gt=0)


class GuardrailsSpec(Model):
    max_concurrent: int | None = _int(0, MAX_QUANTITY, default=None)
    max_unavailable: Quantity | None = Field(
        default=None, description="nodes of the scope that may be unable to take jobs at once, "
        "a count or a percentage: cordoned, NotReady, held by healer, or drained, DOWN, "
        "NOT_RESPONDING... in Slurm, whoever caused it; a node a spare replaced is not "
        "counted, its replacement is (docs/adr/0008-guardrails-count-slurm.md)")
    failure_domains: list[FailureDomainSpec] = Field(default_factory=list, max_length=16)
    breaker: BreakerSpec | None = None
    retry_budget: RetryBudgetSpec | None = None


class PolicySpec(Model):
    mode: Literal["observe", "dryRun", "act"] = Field(
        default="observe", description="observe → dryRun → act (the safety ladder)")
    priority: int = _int(-1_000_000, 1_000_000, default=0)
    node_selector: Selector
    rules: list[RuleSpec] = Field(min_length=1, max_length=256)
    steps: StepsSpec = Field(default_factory=StepsSpec)
    guardrails: GuardrailsSpec = Field(default_factory=GuardrailsSpec)
    dead_node: DeadNodeSpec | None = Field(default=None, description=(
        "nodes that die outright (Ready Unknown, slurmd silent): fenced before anything "
        "irreversible, taken out of service, swapped (docs/adr/0015); absent: off"))


class RemediationPolicy(Model):
    api_version: Literal["healer.io/v1alpha1"]
    kind: Literal["RemediationPolicy"]
    metadata: Metadata
    spec: PolicySpec


GpuModel = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[ -~]+$")]


class SpareValidationSpec(Model):
    max_age: Duration = Field(default=86400.0, ge=60, description=(
        "a spare's validation result older than this is not recent: a claim validates the "
        "spare again first (onClaim) or passes it over"))
    on_claim: Flag = Field(default=True, description=(
        "with no recent result, run the checks on the chosen spare before claiming it (the "
        "remediation waits in its claim step); false: take only spares with a recent result"))
    interval: Duration = Field(default=21600.0, ge=60, description=(
        "idle spares are validated this often (shorter than maxAge)"))
    checks: list[Literal["dcgm-diag", "nccl-loopback"]] = Field(
        default_factory=lambda: ["dcgm-diag"],  # type: ignore[arg-type]
        min_length=1, max_length=2, description=(
            "the Job templates to run, in order (ConfigMaps healer-validation-<check> in "
            "healer's namespace, shipped in deploy/validation)"))
    nccl_bus_bandwidth_gbps: dict[GpuModel, Annotated[float, Field(gt=0, le=100000)]] = Field(
        default_factory=dict, max_length=64, alias="ncclBusBandwidthGBps", description=(
            "nccl-loopback: the least all-reduce bus bandwidth in GB/s per GPU model "
            "(nvidia.com/gpu.product; spaces and dashes alike, any case) and `default` for "
            "the others; required with nccl-loopback"))
    max_parallel: int = _int(1, 64, default=2, description=(
        "idle spares validated at once by the periodic loop"))
    deadline: Duration = Field(default=1800.0, ge=60, le=86400, description=(
        "each check Job's activeDeadlineSeconds"))


class FleetSpec(Model):
    paused: Flag = False
    spare_selector: Selector = Field(
        default_factory=lambda: Selector(match_labels={ROLE_LABEL: SPARE_ROLE}))
    spare_validation: SpareValidationSpec | None = Field(default=None, description=(
        "validate warm spares before a claim and while idle (off when absent)"))
    guardrails: GuardrailsSpec = Field(default_factory=GuardrailsSpec)


class FleetGuardrails(Model):
    api_version: Literal["healer.io/v1alpha1"]
    kind: Literal["FleetGuardrails"]
    metadata: Metadata
    spec: FleetSpec = Field(default_factory=FleetSpec)


_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class SlurmEndpointSpec(Model):
    driver: Annotated[SlurmDriverKind, WithJsonSchema(  # inline, as every closed set here
        {"type": "string", "enum": [str(k) for k in DRIVERS]})] = Field(
        default=SlurmDriverKind.SLINKY,
        description="how healer drains and reads this cluster's Slurm nodes: " + "; ".join(
            f"{k}: {d.summary}" for k, d in DRIVERS.items()))
    slurmrestd_url: HttpUrl | None = Field(
        default=None, description="this cluster's slurmrestd (slurmrestd driver; on Slinky, "
        "for job listing and checkpoint signals)")
    token_secret: SecretRef | None = Field(
        default=None, description="NAMESPACE/NAME[:KEY] of the Secret holding slurmrestd's JWT")
    slurm_conf: str | None = Field(
        default=None, pattern=r"^/[^\x00-\x1f]*$", max_length=4096,
        description="absolute path of this cluster's slurm.conf in healer's container "
        "(scontrol driver)")


class NodeSetRefSpec(Model):
    namespace: str = Field(pattern=_DNS_LABEL, max_length=63)
    name: str = Field(pattern=_DNS_SUBDOMAIN, max_length=253)


class TolerationSpec(Model):
    key: LabelKey | None = Field(default=None, description="empty with Exists: every taint")
    operator: Literal["Equal", "Exists"] = "Equal"
    value: LabelValue = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class TopologyKeysSpec(Model):
    domain: LabelKey = Field(default=DOMAIN_LABEL,
                             description="the label naming a node's NVLink domain")
    tiers: list[LabelKey] = Field(
        default_factory=lambda: [f"{TIER_PREFIX}{i}" for i in range(MAX_TIERS)],
        min_length=1, max_length=MAX_TIERS,
        description="the labels naming a node's switches, leaf first")


class SlurmNodeSetSpec(Model):
    cluster: str = Field(pattern=_DNS_LABEL, max_length=63,
                         description="the Slurm cluster that runs these nodes")
    slurm: SlurmEndpointSpec = Field(default_factory=SlurmEndpointSpec)
    node_set: NodeSetRefSpec | None = Field(
        default=None, description="the Slinky NodeSet (slinky driver; and where a swap moves "
        "slurmd pods)")
    node_selector: Selector = Field(description="the Nodes of this NodeSet")
    spare_selector: Selector | None = Field(
        default=None, description="the warm spares that may replace its nodes (default: the "
        "fleet's spareSelector)")
    tolerations: list[TolerationSpec] | None = Field(
        default=None, max_length=64,
        description="the tolerations of its slurmd pods: a spare with a taint they do not "
        "tolerate (healer's own spare taint aside) is never claimed for it; absent: spares are "
        "not filtered by their taints")
    topology: TopologyKeysSpec = Field(default_factory=TopologyKeysSpec)
    guardrails: GuardrailsSpec = Field(
        default_factory=GuardrailsSpec,
        description="limits over this NodeSet's nodes, on top of each policy's and the fleet's")


class SlurmNodeSet(Model):
    api_version: Literal["healer.io/v1alpha1"]
    kind: Literal["SlurmNodeSet"]
    metadata: Metadata
    spec: SlurmNodeSetSpec


Document = Annotated[RemediationPolicy | FleetGuardrails | SlurmNodeSet,
                     Field(discriminator="kind")]
DOCUMENT = TypeAdapter(Document)
KINDS = ("RemediationPolicy", "FleetGuardrails", "SlurmNodeSet")


def json_schema() -> dict[str, Any]:
    schema = DOCUMENT.json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://healer.io/schemas/v1alpha1/policy.json"
    schema["title"] = ("healer policy document (RemediationPolicy, FleetGuardrails or "
                       "SlurmNodeSet)")
    return schema
