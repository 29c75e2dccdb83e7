"""Compiled policies: the frozen, validated form the engine runs on.

:mod:`healer.policy` parses YAML, validates it in two layers and compiles it into these types once,
at load time. Durations are seconds; regular expressions are compiled; XID groups are resolved to
sets of codes.

The parts a NodeSet (:mod:`healer.core.nodesets`) is made of too, the label selector
(:mod:`healer.core.selector`) and the guardrails (:mod:`healer.core.limits`), sit in modules of
their own below both; they are named from here as well, like the mode (:mod:`healer.core.modes`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

# re-exported (see the module): callers name a compiled policy's parts from here
from healer.core.actions import HookKind as HookKind
from healer.core.limits import Breaker as Breaker
from healer.core.limits import FailureDomain as FailureDomain
from healer.core.limits import Guardrails as Guardrails
from healer.core.limits import Quantity as Quantity
from healer.core.limits import RetryBudget as RetryBudget
from healer.core.model import FenceProvider, NodeView, Severity
from healer.core.modes import Mode as Mode
from healer.core.nodesets import NodeSets
from healer.core.selector import LabelSelector as LabelSelector
from healer.core.spare_validation import SpareValidation
from healer.core.topology import DOMAIN_LABEL
from healer.core.vocabulary import ROLE_LABEL, SPARE_ROLE


class TextPattern(Protocol):
    """A compiled regular expression: ``re.Pattern`` or, as the policy loader compiles them,
    RE2's (linear time, no backtracking)."""

    @property
    def pattern(self) -> Any: ...

    def search(self, text: str) -> Any: ...


#: The labels that name a series' node by default (dcgm-exporter's ``Hostname``, newer builds'
#: ``hostname``); a telemetry source may be configured with others.
HOST_LABELS = ("Hostname", "hostname")


class Op(enum.Enum):
    GT = ">"
    GE = ">="
    LT = "<"
    LE = "<="
    EQ = "=="
    NE = "!="

    def test(self, value: float, threshold: float) -> bool:
        match self:
            case Op.GT:
                return value > threshold
            case Op.GE:
                return value >= threshold
            case Op.LT:
                return value < threshold
            case Op.LE:
                return value <= threshold
            case Op.EQ:
                return value == threshold
            case Op.NE:
                return value != threshold
        raise AssertionError(self)  # pragma: no cover


class Aggregation(enum.Enum):
    """How a telemetry source turns a field into the value a threshold is tested against."""

    VALUE = "value"  # the gauge as scraped
    INCREASE = "increase"  # counter increase over ``window``
    RATE = "rate"  # per-second counter rate over ``window``
    MAX_OVER_TIME = "max_over_time"
    CHANGES = "changes"  # how often the value changed within ``window`` (a link's flaps)


# ---------------------------------------------------------------------------------------------
# Rules


@dataclass(frozen=True, slots=True)
class XidRule:
    name: str
    severity: Severity
    codes: frozenset[int]
    count: int = 1  # N occurrences ...
    within: float = 3600.0  # ... within this many seconds


@dataclass(frozen=True, slots=True)
class MetricRule:
    """A threshold on a telemetry series, held ``for``: a DCGM field per GPU, any Prometheus
    series (``series`` with label ``matchers``) or a raw PromQL expression, per node or, with
    ``per`` labels, per part of the node (an HCA port: ``device``, ``port``).

    ``node_label``: the label naming the node of the series ("": the source's host labels).
    """

    name: str
    severity: Severity
    field: str  # the DCGM field or series name, or the rule name when ``promql`` is set
    op: Op
    threshold: float
    hold_for: float = 0.0
    aggregation: Aggregation = Aggregation.VALUE
    window: float = 300.0
    promql: str = ""
    series: bool = False  # ``field`` names any series: no DCGM labels, the rule's matchers
    matchers: tuple[tuple[str, str], ...] = ()  # (label, value): equality matchers of series
    per: tuple[str, ...] = ()  # the labels telling the node's parts apart
    node_label: str = ""

    @property
    def key(self) -> str:
        """The signal key a telemetry source uses for this rule's samples: the field for a
        plain gauge, ``increase(FIELD[600s])``-style for an aggregation (so two rules on one
        field with different windows never mix their samples), ``rule:NAME`` for PromQL; a
        series' matchers and ``per`` labels are part of it."""
        if self.promql:
            return f"rule:{self.name}"
        name = self.field
        if self.matchers:
            name += "{" + ",".join(f'{k}="{v}"' for k, v in self.matchers) + "}"
        if self.aggregation is not Aggregation.VALUE:
            name = f"{self.aggregation.value}({name}[{self.window:g}s])"
        if self.per:
            name += f" per {','.join(self.per)}"
        return name


@dataclass(frozen=True, slots=True)
class ConditionRule:
    """A node condition (from healer's agent, NPD, NVSentinel, ...) held for a duration.

    ``count``/``within`` turn it into an N-in-window rule on transitions into the bad status.
    ``stale_after``: a condition whose ``lastHeartbeatTime`` is older than this is *stale*
    (its detector died): unknown, never disruptive; 0 never judges it.
    """

    name: str
    severity: Severity
    type: str
    statuses: frozenset[str]
    reason: TextPattern | None = None
    hold_for: float = 0.0
    count: int = 0
    within: float = 0.0
    stale_after: float = 0.0  # heartbeat window: older than this, the condition is unknown


@dataclass(frozen=True, slots=True)
class StalenessRule:
    """Telemetry older than ``after`` makes the node's verdict *stale*: alert, never disrupt."""

    name: str
    after: float
    sources: frozenset[str] = frozenset()  # empty: every source


@dataclass(frozen=True, slots=True)
class SlurmRule:
    """Slurm itself took the node out (:mod:`healer.core.slurm_signals`): one of ``states``
    (DOWN, NOT_RESPONDING, FAIL, DRAIN; healer's and the operator's own drains never count),
    with a reason ``reason`` finds (None: any reason), held ``for`` seconds."""

    name: str
    severity: Severity
    states: frozenset[str]
    reason: TextPattern | None = None
    hold_for: float = 0.0


Rule = XidRule | MetricRule | ConditionRule | StalenessRule | SlurmRule


# ---------------------------------------------------------------------------------------------
# Steps


class DrainTimeout(enum.Enum):
    ESCALATE = "escalate"  # hand the node to a human; it stays drained
    REQUEUE = "requeue"  # requeue the node's jobs through Slurm, then carry on


class CheckpointTimeout(enum.Enum):
    CONTINUE = "continue"
    ESCALATE = "escalate"


@dataclass(frozen=True, slots=True)
class CheckpointStep:
    enabled: bool = False
    hook: HookKind = HookKind.SLURM_SIGNAL  # one of actions.CHECKPOINT_HOOKS
    signal: str = "USR1"
    deadline: float = 600.0
    on_timeout: CheckpointTimeout = CheckpointTimeout.CONTINUE
    severities: frozenset[Severity] = frozenset({Severity.DEGRADING})
    url: str = ""
    secret_ref: str = ""
    job_template: str = ""

    def applies_to(self, severity: Severity) -> bool:
        return self.enabled and severity in self.severities


@dataclass(frozen=True, slots=True)
class DrainStep:
    deadline: float = 7200.0
    on_timeout: DrainTimeout = DrainTimeout.ESCALATE
    requeue_grace: float = 300.0


class ForeignReason(enum.Enum):
    """What a swap does with a Slurm drain or DOWN reason someone else set (docs/adr/0006,
    docs/adr/0016): moving the slurmd would lose it."""

    HOLD = "hold"  # the swap waits, and says why, until the owner clears it
    CARRY_OVER = "carryOver"  # the reason is put on the replacement, word for word


@dataclass(frozen=True, slots=True)
class SwapStep:
    enabled: bool = True
    deadline: float = 1800.0  # spare claimed → replacement registered and ready
    hold_timeout: float = 0.0  # HeldForCapacity → Escalated after this long (0: hold forever)
    require_same_domain: bool = False  # only a spare of the node's NVLink domain; else held
    foreign_reason: ForeignReason = ForeignReason.HOLD


@dataclass(frozen=True, slots=True)
class ValidationStep:
    enabled: bool = False
    image: str = ""
    command: tuple[str, ...] = ()
    deadline: float = 1800.0


@dataclass(frozen=True, slots=True)
class RepairStep:
    hook: HookKind = HookKind.NONE  # one of actions.REPAIR_HOOKS
    url: str = ""
    secret_ref: str = ""  # the repair webhook's own HMAC key
    job_template: str = ""
    deadline: float = 0.0  # 0: wait for the repair result forever


@dataclass(frozen=True, slots=True)
class Steps:
    checkpoint: CheckpointStep = CheckpointStep()
    drain: DrainStep = DrainStep()
    swap: SwapStep = SwapStep()
    validation: ValidationStep = ValidationStep()
    repair: RepairStep = RepairStep()
    step_deadline: float = 900.0  # any single action that has not finished by then escalates
    max_attempts: int = 5  # per step, transient failures included
    poll_interval: float = 10.0  # how often a waiting step is polled


# ---------------------------------------------------------------------------------------------
# Dead nodes


class DeadSignal(enum.Enum):
    """A witness that a node cannot act on its own."""

    NOT_READY = "notReady"  # its Ready condition is Unknown or False (a silent kubelet)
    SLURM_NOT_RESPONDING = "slurmNotResponding"  # Slurm flags it NOT_RESPONDING (slurmd silent)
    TELEMETRY_STALE = "telemetryStale"  # every telemetry source for it went stale


class DeadMatch(enum.Enum):
    ALL = "all"  # every witness the policy lists must agree
    ANY = "any"  # one is enough


@dataclass(frozen=True, slots=True)
class Fencing:
    """Who may say a dead node is off or cut off, and how long healer waits for one."""

    providers: frozenset[FenceProvider] = frozenset({
        FenceProvider.MANUAL, FenceProvider.CLOUD_SHUTDOWN, FenceProvider.NODE_DELETED})
    deadline: float = 600.0  # Dead → HeldForFencing when no provider said so by then
    url: str = ""  # webhook
    secret_ref: str = ""  # webhook: its own HMAC key


@dataclass(frozen=True, slots=True)
class MassDeath:
    """Many nodes of one scope dying together is a control-plane or network fault: nothing is
    fenced or swapped there while more than ``max_share`` of the scope's nodes (or more than
    ``max_share_per_domain`` of one failure domain's) went NotReady within one ``window`` and
    are still NotReady, counting those that answered again within the last ``window`` after
    the first of them went NotReady (:func:`healer.core.budget.outage`)."""

    window: float = 300.0
    max_share: Quantity = Quantity(10, percent=True)
    max_share_per_domain: Quantity = Quantity(25, percent=True)
    domains: tuple[str, ...] = (DOMAIN_LABEL,)


@dataclass(frozen=True, slots=True)
class DeadNode:
    """When a node is dead, and what healer needs before it lets its pods go."""

    enabled: bool = False
    after: float = 120.0  # Ready not True for this long (the notReady witness)
    signals: frozenset[DeadSignal] = frozenset({DeadSignal.NOT_READY,
                                                DeadSignal.SLURM_NOT_RESPONDING})
    match: DeadMatch = DeadMatch.ALL
    fencing: Fencing = Fencing()
    mass_death: MassDeath = MassDeath()


#: The rule name a dead verdict's match carries.
DEAD_RULE = "dead-node"


# ---------------------------------------------------------------------------------------------
# Policy


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    selector: LabelSelector
    rules: tuple[Rule, ...]
    steps: Steps = Steps()
    guardrails: Guardrails = Guardrails()
    mode: Mode = Mode.OBSERVE
    priority: int = 0
    source: str = ""  # "file:line" where it was defined
    dead: DeadNode = DeadNode()

    def applies_to(self, node: NodeView) -> bool:
        return self.selector.matches(node.labels)

    def rule(self, name: str) -> Rule | None:
        for r in self.rules:
            if r.name == name:
                return r
        return None


@dataclass(frozen=True, slots=True)
class FleetRules:
    """Guardrails over the whole fleet, across policies (``kind: FleetGuardrails``)."""

    guardrails: Guardrails = Guardrails()
    spare_selector: LabelSelector = LabelSelector({ROLE_LABEL: SPARE_ROLE})
    paused: bool = False
    source: str = ""
    #: off unless FleetGuardrails sets spareValidation
    spare_validation: SpareValidation = field(default_factory=SpareValidation)


@dataclass(frozen=True, slots=True)
class PolicySet:
    """Every loaded policy plus the fleet guardrails, with a content hash for metrics.

    Several policies may select one node (say, one for fatal XIDs and one for degrading
    telemetry). Each is evaluated; the incident belongs to the policy whose verdict is worst
    (ties: higher ``priority``, then name), and that policy's steps and guardrails apply.
    """

    policies: tuple[Policy, ...]
    fleet: FleetRules = FleetRules()
    digest: str = ""
    nodesets: NodeSets = field(default_factory=NodeSets)
    """The ``kind: SlurmNodeSet`` documents (:mod:`healer.core.nodesets`); none: the one
    NodeSet the command line names."""

    @property
    def spare_selectors(self) -> list[LabelSelector]:
        """The fleet's spare selector and each NodeSet's own."""
        return [self.fleet.spare_selector,
                *(n.spare_selector for n in self.nodesets.items if n.spare_selector)]

    def is_spare(self, labels: Mapping[str, str]) -> bool:
        """Is a node with ``labels`` a warm spare: of the fleet, or of one of its NodeSets?
        (A selector without matchLabels picks no spare.)"""
        return any(sel.match_labels and sel.matches(labels) for sel in self.spare_selectors)

    def policies_for(self, node: NodeView) -> list[Policy]:
        """Every policy that selects ``node``, highest priority first (then by name)."""
        return sorted((p for p in self.policies if p.applies_to(node)),
                      key=lambda p: (-p.priority, p.name))

    def for_node(self, node: NodeView) -> Policy | None:
        """The first of :meth:`policies_for`, or None if no policy selects the node."""
        matching = self.policies_for(node)
        return matching[0] if matching else None

    def get(self, name: str) -> Policy | None:
        for p in self.policies:
            if p.name == name:
                return p
        return None

