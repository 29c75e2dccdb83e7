"""The policy file format, layer one: the field schema (pydantic v2).

Field types, ranges and enumerations live here; rules that relate several fields live in
:mod:`healer.policy.compile` (layer two). This is the only module that imports pydantic.
``policies/schema.json`` is generated from :func:`json_schema`.
"""

from __future__ import annotations

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
    if not _DURATION_RE.match(text):
        raise ValueError(f"expected a duration such as 30s, 5m, 2h or 7d, got {value!r}")
    return sum(float(n) * _UNITS[u] for n, u in _PART_RE.findall(text))


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
        if value < 0:
            raise ValueError("expected a count ≥ 0")
        return str(value)
    if isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?%", value.strip()):
        pct = float(value.strip()[:-1])
        if not 0 <= pct <= 100:
            raise ValueError(f"expected a percentage between 0% and 100%, got {value}")
        return value.strip()
    raise ValueError(f"expected a count (e.g. 2) or a percentage (e.g. 10%), got {value!r}")


Quantity = Annotated[
    str,
    BeforeValidator(_parse_quantity),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 0},
                              {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?%$"}],
                    "description": "a count (2) or a percentage of the population (10%)"}),
]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True,
                              frozen=True)


# ---------------------------------------------------------------------------------------------


class Metadata(Model):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63,
                      description="DNS-1123 label naming the policy")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class SelectorRequirement(Model):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class Selector(Model):
    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[SelectorRequirement] = Field(default_factory=list)


class XidMatch(Model):
    groups: list[str] = Field(default_factory=list, description="groups from the XID catalog")
    codes: list[Annotated[int, Field(ge=1, le=1024)]] = Field(default_factory=list)
    exclude: list[Annotated[int, Field(ge=1, le=1024)]] = Field(default_factory=list)
    count: int = Field(default=1, ge=1, description="occurrences needed ...")
    within: Duration = Field(default=3600.0, gt=0, description="... within this window")


class MetricMatch(Model):
    field: str | None = Field(default=None, pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$",
                              description="a dcgm-exporter metric name")
    promql: str | None = Field(default=None, min_length=1,
                               description="a PromQL expression; its series need the host "
                                           "label and, for per-GPU rules, gpu/UUID labels")
    aggregation: Literal["value", "increase", "rate", "max_over_time"] = "value"
    window: Duration = Field(default=300.0, gt=0)
    op: Literal[">", ">=", "<", "<=", "==", "!="] = ">"
    threshold: float
    hold_for: Duration = Field(default=0.0, ge=0, alias="for")


class ConditionMatch(Model):
    type: str = Field(min_length=1, description="node condition type, e.g. GPUHealthy")
    status: list[Literal["True", "False", "Unknown"]] = Field(default=["True"], min_length=1)
    reason: str | None = Field(default=None, description="regular expression on the reason")
    hold_for: Duration = Field(default=0.0, ge=0, alias="for")
    count: int = Field(default=0, ge=0, description="N transitions into the status ...")
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
    sources: list[str] = Field(default_factory=list, description="empty: every source")


class RuleSpec(Model):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    severity: Literal["degrading", "failed"] | None = None
    xid: XidMatch | None = None
    metric: MetricMatch | None = None
    condition: ConditionMatch | None = None
    not_ready: NotReadyMatch | None = None
    staleness: StalenessMatch | None = None


class CheckpointSpec(Model):
    enabled: bool = False
    hook: Literal["slurm-signal", "webhook", "job"] = "slurm-signal"
    signal: str = Field(default="USR1", pattern=r"^(SIG)?[A-Z0-9]+$")
    deadline: Duration = Field(default=600.0, gt=0)
    on_timeout: Literal["continue", "escalate"] = "continue"
    severities: list[Literal["degrading", "failed"]] = Field(default=["degrading"])
    url: str | None = None
    secret_ref: str | None = Field(default=None, description=(
        "webhook: NAMESPACE/NAME[:KEY] of the Secret holding this hook's HMAC key (required)"))
    allow_insecure_http: bool = Field(default=False, description=(
        "webhook: accept an http:// url (default: https only)"))
    job_template: str | None = None


class DrainSpec(Model):
    deadline: Duration = Field(default=7200.0, gt=0)
    on_timeout: Literal["escalate", "requeue"] = "escalate"
    requeue_grace: Duration = Field(default=300.0, gt=0)


class SwapSpec(Model):
    enabled: bool = True
    deadline: Duration = Field(default=1800.0, gt=0)
    hold_timeout: Duration = Field(default=0.0, ge=0)
    require_same_domain: bool = Field(default=False, description=(
        "take only a spare in the node's NVLink domain (accelerator.topograph.run/domain); "
        "with none free the node is HeldForCapacity. Default: the nearest spare, reported "
        "(Event SpareFromOtherDomain, status.sparePlacement) when it is in another domain"))


class ValidationSpec(Model):
    enabled: bool = False
    image: str | None = None
    command: list[str] = Field(default_factory=list)
    deadline: Duration = Field(default=1800.0, gt=0)


class RepairSpec(Model):
    hook: Literal["none", "webhook", "job"] = "none"
    url: str | None = None
    secret_ref: str | None = Field(default=None, description=(
        "webhook: NAMESPACE/NAME[:KEY] of the Secret holding this hook's HMAC key (required)"))
    allow_insecure_http: bool = Field(default=False, description=(
        "webhook: accept an http:// url (default: https only)"))
    job_template: str | None = None
    deadline: Duration = Field(default=0.0, ge=0)


class StepsSpec(Model):
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    drain: DrainSpec = Field(default_factory=DrainSpec)
    swap: SwapSpec = Field(default_factory=SwapSpec)
    validation: ValidationSpec = Field(default_factory=ValidationSpec)
    repair: RepairSpec = Field(default_factory=RepairSpec)
    step_deadline: Duration = Field(default=900.0, gt=0)
    max_attempts: int = Field(default=5, ge=1, le=100)
    poll_interval: Duration = Field(default=10.0, gt=0)


class FailureDomainSpec(Model):
    key: str = Field(min_length=1)
    max_unavailable: int = Field(default=1, ge=0)


class BreakerSpec(Model):
    window: Duration = Field(default=600.0, gt=0)
    threshold: Quantity = "5"
    cooldown: Duration = Field(default=1800.0, gt=0)


class RetryBudgetSpec(Model):
    per_node: int = Field(default=3, ge=1)
    per_gpu_serial: int = Field(default=2, ge=1)
    window: Duration = Field(default=7 * 86400.0, gt=0)


class GuardrailsSpec(Model):
    max_concurrent: int | None = Field(default=None, ge=0)
    max_unavailable: Quantity | None = None
    failure_domains: list[FailureDomainSpec] = Field(default_factory=list)
    breaker: BreakerSpec | None = None
    retry_budget: RetryBudgetSpec | None = None


class PolicySpec(Model):
    mode: Literal["observe", "dryRun", "act"] = Field(
        default="observe", description="observe → dryRun → act (the safety ladder)")
    priority: int = 0
    node_selector: Selector
    rules: list[RuleSpec] = Field(min_length=1)
    steps: StepsSpec = Field(default_factory=StepsSpec)
    guardrails: GuardrailsSpec = Field(default_factory=GuardrailsSpec)


class RemediationPolicy(Model):
    api_version: Literal["healer.io/v1alpha1"]
    kind: Literal["RemediationPolicy"]
    metadata: Metadata
    spec: PolicySpec


class FleetSpec(Model):
    paused: bool = False
    spare_selector: Selector = Field(
        default_factory=lambda: Selector(match_labels={"healer.io/role": "spare"}))
    guardrails: GuardrailsSpec = Field(default_factory=GuardrailsSpec)


class FleetGuardrails(Model):
    api_version: Literal["healer.io/v1alpha1"]
    kind: Literal["FleetGuardrails"]
    metadata: Metadata
    spec: FleetSpec = Field(default_factory=FleetSpec)


Document = Annotated[RemediationPolicy | FleetGuardrails, Field(discriminator="kind")]
DOCUMENT = TypeAdapter(Document)
KINDS = ("RemediationPolicy", "FleetGuardrails")


def json_schema() -> dict[str, Any]:
    schema = DOCUMENT.json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://healer.io/schemas/v1alpha1/policy.json"
    schema["title"] = "healer policy document (RemediationPolicy or FleetGuardrails)"
    return schema
