"""Every metric healer exports, defined in one place (docs/metrics.md lists them).

Counters and histograms are updated as things happen (:class:`Metrics` is the controller's
observer); gauges that describe current state (remediations by phase, guardrail use, spare
depth, staleness) are computed at scrape time from the controller's state, so they can never
drift from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from healer.core.budget import usage
from healer.core.machine import Decision, Trigger, TriggerKind, phase_deadline
from healer.core.model import NodeRecord, StepOutcome
from healer.core.outcomes import Closing, FoundNothing, incident_outcome, node_gpus
from healer.core.phases import ACTIVE, TERMINAL, Phase
from healer.core.unavailability import CAUSES
from healer.core.vocabulary import StepName
from healer.errors import (
    ConflictError,
    ForbiddenError,
    NotFoundError,
    PermanentError,
    TransientError,
)

STEP_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400)
#: Time to detect and to replacement: seconds to days.
OUTCOME_BUCKETS = (10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400, 259200)
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900)
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

#: name → (type, help); the single source for docs/metrics.md and the dashboard/alert tests.
METRICS: dict[str, tuple[str, str]] = {
    "healer_remediations": ("gauge", "Open remediations by phase and policy."),
    "healer_remediation_overdue": ("gauge", "Open remediations past their phase deadline."),
    "healer_remediation_phase_seconds": ("gauge", "Seconds each open remediation has been in "
                                         "its phase (node, phase, incident)."),
    "healer_held_for_capacity": ("gauge", "Nodes drained and cordoned, waiting for a spare."),
    "healer_held_for_fencing": ("gauge", "Dead nodes no fencing provider has said are off or "
                                "cut off by the fence deadline (HeldForFencing): nothing of "
                                "them is force-deleted, their capacity is out until a human "
                                "or a provider acts."),
    "healer_repair_cordoned_nodes": ("gauge", "Nodes healer keeps cordoned in Repair (replaced "
                                     "by a spare or repaired in place): out of service, not "
                                     "counted as unavailable once a spare serves for them."),
    "healer_transitions_total": ("counter", "Phase transitions (from, to)."),
    "healer_incidents_total": ("counter", "Incidents opened, by severity, rule and XID."),
    "healer_step_duration_seconds": ("histogram", "Ledger step durations by step and outcome."),
    "healer_signal_to_action_seconds": ("histogram", "First signal to first disruptive "
                                        "action, by policy and severity."),
    "healer_time_to_detect_seconds": ("histogram", "First sign of the fault (first suspicion "
                                      "or kept evidence) to the incident opened, observed "
                                      "when an incident finishes, by severity."),
    "healer_time_to_replacement_seconds": ("histogram", "Incident opened to the replacement "
                                           "spare undrained in Slurm, observed when an "
                                           "incident finishes."),
    "healer_remediations_finished_total": ("counter", "Incidents finished, by closing "
                                           "(replaced, repaired, recovered, escalated, "
                                           "cancelled)."),
    "healer_remediations_found_nothing_total": ("counter", "Finished incidents that found "
                                                "nothing, by why: the signal cleared on its "
                                                "own (recovered-before-disruption, recovered-"
                                                "after-drain) or the repair reported no fault "
                                                "(repair-found-no-fault): healer's false "
                                                "positives."),
    "healer_capacity_lost_gpu_hours_total": ("counter", "GPU-hours healer held nodes out of "
                                             "service (first drain or cordon to undrain or "
                                             "undo; the node's nvidia.com/gpu.count label, "
                                             "else 8 GPUs), counted when an incident "
                                             "finishes, by closing."),
    "healer_actions_total": ("counter", "Actions run, by action and result status."),
    "healer_guardrail_blocks_total": ("counter", "Admissions held by a guardrail."),
    "healer_breaker_tripped": ("gauge", "1 while a breaker is tripped (scope)."),
    "healer_breaker_utilisation": ("gauge", "Nodes gone bad in the breaker window / threshold."),
    "healer_mass_death_tripped": ("gauge", "1 while a policy's mass-death breaker is tripped "
                                  "(scope): more of its nodes, or of one failure domain, went "
                                  "NotReady together than its deadNode.massDeath allows; "
                                  "suspect the control plane or the network, nothing is "
                                  "fenced or swapped there."),
    "healer_unavailable_nodes": ("gauge", "Nodes that cannot take jobs, as the guardrails count "
                                 "them, by scope and cause (healer, cordoned, not-ready, "
                                 "slurm-down, slurm-not-responding, slurm-fail, slurm-drain, "
                                 "slurm-reboot, slurm-power-down, slurm-maintenance; every "
                                 "cause has a series): sum by scope for the total."),
    "healer_replaced_nodes": ("gauge", "Nodes in Repair whose spare serves in their place: out "
                              "of the population, not counted as unavailable (scope)."),
    "healer_slurm_view_known": ("gauge", "1 while the Slurm feed reads Slurm's node states, 0 "
                                "while it cannot (admissions under maxUnavailable or "
                                "failure-domain limits are held); absent without a feed."),
    "healer_nodeset_slurm_readable": ("gauge", "Per SlurmNodeSet (and its cluster; without "
                                      "documents the command line's Slurm, named '(command "
                                      "line)'): 1 if its Slurm node states were read at the "
                                      "last read, 0 if not (its cluster unreachable, its "
                                      "slurmrestd token Secret missing; the reason is on "
                                      "/readyz and in an Event)."),
    "healer_slurm_view_last_success_timestamp_seconds": ("gauge", "Last successful read of "
                                                         "Slurm's node states."),
    "healer_max_unavailable": ("gauge", "The maxUnavailable limit in nodes (scope)."),
    "healer_active_remediations": ("gauge", "Remediations holding a maxConcurrent slot."),
    "healer_max_concurrent": ("gauge", "The maxConcurrent limit (scope)."),
    "healer_spare_pool_free": ("gauge", "Free warm spares by accelerator domain."),
    "healer_gpu_serial_incidents": ("gauge", "Incidents per GPU serial within the retention "
                                    "window (serials with at least two)."),
    "healer_escalations_total": ("counter", "Remediations escalated to a human."),
    "healer_telemetry_stale_nodes": ("gauge", "Nodes whose telemetry is stale, by source (a "
                                     "telemetry source, or condition/<type> for a node "
                                     "condition whose detector stopped heartbeating)."),
    "healer_telemetry_last_success_timestamp_seconds": ("gauge", "Last successful poll per "
                                                         "telemetry source."),
    "healer_telemetry_samples_dropped_total": ("counter", "Telemetry samples and answers "
                                               "dropped as unusable, by source, metric "
                                               "(heartbeat, xid or a rule's signal key) and "
                                               "reason (nan, inf, not-a-number, out-of-range, "
                                               "bad-time, malformed, bad-answer, too-many)."),
    "healer_api_call_duration_seconds": ("histogram", "Calls to Kubernetes, Slurm and "
                                         "Prometheus, by system and operation."),
    "healer_api_call_errors_total": ("counter", "Failed calls by system, operation and kind."),
    "healer_leader": ("gauge", "1 if this replica is the leader."),
    "healer_policy_reloads_total": ("counter", "Policy (re)loads by result."),
    "healer_policy_info": ("gauge", "1, labelled with the digest of the policies in force."),
    "healer_policy_last_reload_success": ("gauge", "1 if the last policy reload succeeded."),
    "healer_policy_reload_failures_total": ("counter", "Failed policy loads by reason: invalid "
                                            "(the files), timeout, memory or crash (the "
                                            "isolated loader); the policies in force stay."),
    "healer_policy_last_success_timestamp_seconds": ("gauge", "When the policies in force "
                                                     "were loaded (the digest is on "
                                                     "healer_policy_info)."),
    "healer_up": ("gauge", "1 while the daemon's event loop is alive."),
}


#: The error classes adapters map failures to (the ``kind`` label of call errors).
ERROR_KINDS = tuple(c.__name__ for c in (TransientError, ConflictError, PermanentError,
                                         NotFoundError, ForbiddenError))


@dataclass
class StateSource:
    """What the scrape-time collector reads (set by the composition root)."""

    records: Callable[[], Mapping[str, NodeRecord]] = dict
    history: Callable[[], Mapping[str, NodeRecord]] = dict
    view: Callable[[], Any] | None = None
    spare_depth: Callable[[], Mapping[str, int]] = dict
    stale_nodes: Callable[[], Mapping[str, int]] = dict
    last_poll: Callable[[], Mapping[str, float]] = dict
    #: (source, metric, reason) → telemetry samples dropped so far
    dropped: Callable[[], Mapping[tuple[str, str, str], float]] = dict
    leading: Callable[[], bool] = lambda: False
    #: the Slurm feed: {"known": bool, "last_success": float | None}; {} without one
    slurm_feed: Callable[[], Mapping[str, Any]] = dict
    clock: Callable[[], float] = time.time
    extra: dict[str, Any] = field(default_factory=dict)


class _StateCollector(Collector):
    def __init__(self, src: StateSource) -> None:
        self.src = src

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        src, now = self.src, self.src.clock()
        records = src.records()
        by_phase: dict[tuple[str, str], int] = {}
        overdue, held, fencing, repair_cordoned = 0, 0, 0, 0
        age = GaugeMetricFamily("healer_remediation_phase_seconds",
                                METRICS["healer_remediation_phase_seconds"][1],
                                labels=["node", "phase", "incident"])
        view = src.view() if src.view is not None else None
        for rec in records.values():
            key = (rec.phase.value, rec.policy)
            by_phase[key] = by_phase.get(key, 0) + 1
            age.add_metric([rec.node, rec.phase.value, rec.incident.id], now - rec.phase_since)
            if rec.phase is Phase.HELD_FOR_CAPACITY:
                held += 1
            elif rec.phase is Phase.HELD_FOR_FENCING:
                fencing += 1
            elif rec.phase is Phase.REPAIR and rec.step_ok(StepName.CORDON) \
                    and not rec.step_ok(StepName.UNCORDON):
                repair_cordoned += 1
            policy = view.policies.get(rec.policy) if view is not None else None
            deadline = phase_deadline(rec, policy)
            if deadline is not None and now > deadline:
                overdue += 1
        g = GaugeMetricFamily("healer_remediations", METRICS["healer_remediations"][1],
                              labels=["phase", "policy"])
        for (phase, policy), n in sorted(by_phase.items()):
            g.add_metric([phase, policy], n)
        yield g
        yield age
        yield _gauge("healer_remediation_overdue", overdue)
        yield _gauge("healer_held_for_capacity", held)
        yield _gauge("healer_held_for_fencing", fencing)
        yield _gauge("healer_repair_cordoned_nodes", repair_cordoned)
        if view is not None:
            fams = {n: GaugeMetricFamily(n, METRICS[n][1], labels=["scope"]) for n in (
                "healer_breaker_tripped", "healer_breaker_utilisation",
                "healer_max_unavailable", "healer_replaced_nodes",
                "healer_active_remediations", "healer_max_concurrent",
                "healer_mass_death_tripped")}
            by_cause = GaugeMetricFamily("healer_unavailable_nodes",
                                         METRICS["healer_unavailable_nodes"][1],
                                         labels=["scope", "cause"])
            dead_scopes = {p.name for p in view.policies.policies if p.dead.enabled}
            for u in usage(view, now):
                for cause in CAUSES:
                    by_cause.add_metric([u.scope, cause], u.causes.get(cause, 0))
                fams["healer_replaced_nodes"].add_metric([u.scope], u.replaced)
                fams["healer_active_remediations"].add_metric([u.scope], u.active)
                if u.max_unavailable is not None:
                    fams["healer_max_unavailable"].add_metric([u.scope], u.max_unavailable)
                if u.max_concurrent is not None:
                    fams["healer_max_concurrent"].add_metric([u.scope], u.max_concurrent)
                if u.mass_death is not None or u.scope in dead_scopes:
                    fams["healer_mass_death_tripped"].add_metric([u.scope],
                                                                 int(u.mass_death is not None))
                if u.breaker is not None:
                    fams["healer_breaker_tripped"].add_metric([u.scope], int(u.breaker.tripped))
                    fams["healer_breaker_utilisation"].add_metric(
                        [u.scope], u.breaker.count / max(u.breaker.threshold, 1))
            yield by_cause
            yield from fams.values()
        feed = src.slurm_feed()
        if feed:
            yield _gauge("healer_slurm_view_known", int(bool(feed.get("known"))))
            readable = GaugeMetricFamily("healer_nodeset_slurm_readable",
                                         METRICS["healer_nodeset_slurm_readable"][1],
                                         labels=["nodeset", "cluster"])
            for name, (cluster, error) in sorted((feed.get("nodesets") or {}).items()):
                readable.add_metric([name, cluster], int(not error))
            yield readable
            if feed.get("last_success") is not None:
                yield _gauge("healer_slurm_view_last_success_timestamp_seconds",
                             float(feed["last_success"]))
        spares = GaugeMetricFamily("healer_spare_pool_free", METRICS["healer_spare_pool_free"][1],
                                   labels=["domain"])
        for dom, n in sorted(src.spare_depth().items()):
            spares.add_metric([dom], n)
        yield spares
        serials: dict[str, int] = {}
        for rec in src.history().values():
            for gpu in rec.incident.gpus:
                if gpu.serial:
                    serials[gpu.serial] = serials.get(gpu.serial, 0) + 1
        ser = GaugeMetricFamily("healer_gpu_serial_incidents",
                                METRICS["healer_gpu_serial_incidents"][1], labels=["serial"])
        for s, n in sorted(serials.items()):
            if n >= 2:
                ser.add_metric([s], n)
        yield ser
        stale = GaugeMetricFamily("healer_telemetry_stale_nodes",
                                  METRICS["healer_telemetry_stale_nodes"][1], labels=["source"])
        for source, n in sorted(src.stale_nodes().items()):
            stale.add_metric([source], n)
        yield stale
        polls = GaugeMetricFamily("healer_telemetry_last_success_timestamp_seconds",
                                  METRICS["healer_telemetry_last_success_timestamp_seconds"][1],
                                  labels=["source"])
        for source, t in sorted(src.last_poll().items()):
            polls.add_metric([source], t)
        yield polls
        dropped = CounterMetricFamily("healer_telemetry_samples_dropped",
                                      METRICS["healer_telemetry_samples_dropped_total"][1],
                                      labels=["source", "metric", "reason"])
        for labels, dropped_n in sorted(src.dropped().items()):
            dropped.add_metric(list(labels), dropped_n)
        yield dropped
        yield _gauge("healer_leader", int(src.leading()))
        yield _gauge("healer_up", 1)


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, METRICS[name][1], value=value)


class Metrics:
    """The counters and histograms, plus the controller-observer hook that feeds them."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.transitions = Counter("healer_transitions", METRICS["healer_transitions_total"][1],
                                   ["source", "target"], registry=r)
        self.incidents = Counter("healer_incidents", METRICS["healer_incidents_total"][1],
                                 ["severity", "rule", "xid"], registry=r)
        self.step_duration = Histogram("healer_step_duration_seconds",
                                       METRICS["healer_step_duration_seconds"][1],
                                       ["step", "outcome"], buckets=STEP_BUCKETS, registry=r)
        self.signal_to_action = Histogram("healer_signal_to_action_seconds",
                                          METRICS["healer_signal_to_action_seconds"][1],
                                          ["policy", "severity"], buckets=LATENCY_BUCKETS,
                                          registry=r)
        self.detect = Histogram("healer_time_to_detect_seconds",
                                METRICS["healer_time_to_detect_seconds"][1], ["severity"],
                                buckets=OUTCOME_BUCKETS, registry=r)
        self.to_replacement = Histogram("healer_time_to_replacement_seconds",
                                        METRICS["healer_time_to_replacement_seconds"][1],
                                        buckets=OUTCOME_BUCKETS, registry=r)
        self.finished = Counter("healer_remediations_finished",
                                METRICS["healer_remediations_finished_total"][1], ["closing"],
                                registry=r)
        self.found_nothing = Counter("healer_remediations_found_nothing",
                                     METRICS["healer_remediations_found_nothing_total"][1],
                                     ["why"], registry=r)
        self.gpu_hours_lost = Counter("healer_capacity_lost_gpu_hours",
                                      METRICS["healer_capacity_lost_gpu_hours_total"][1],
                                      ["closing"], registry=r)
        for closing in Closing:  # every series from 0, so ratios and rates see them at once
            if closing is not Closing.OPEN:
                self.finished.labels(closing.value)
                self.gpu_hours_lost.labels(closing.value)
        for why in FoundNothing:
            self.found_nothing.labels(why.value)
        self.actions = Counter("healer_actions", METRICS["healer_actions_total"][1],
                               ["action", "status"], registry=r)
        self.blocks = Counter("healer_guardrail_blocks",
                              METRICS["healer_guardrail_blocks_total"][1],
                              ["guardrail", "policy"], registry=r)
        self.escalations = Counter("healer_escalations", METRICS["healer_escalations_total"][1],
                                   ["policy"], registry=r)
        self.calls = Histogram("healer_api_call_duration_seconds",
                               METRICS["healer_api_call_duration_seconds"][1],
                               ["system", "operation"], buckets=CALL_BUCKETS, registry=r)
        self._calls_seen: set[tuple[str, str]] = set()
        self.call_errors = Counter("healer_api_call_errors",
                                   METRICS["healer_api_call_errors_total"][1],
                                   ["system", "operation", "kind"], registry=r)
        self.reloads = Counter("healer_policy_reloads", METRICS["healer_policy_reloads_total"][1],
                               ["result"], registry=r)
        self.policy_info = Gauge("healer_policy_info", METRICS["healer_policy_info"][1],
                                 ["digest"], registry=r)
        self.reload_ok = Gauge("healer_policy_last_reload_success",
                               METRICS["healer_policy_last_reload_success"][1], registry=r)
        self.reload_failures = Counter("healer_policy_reload_failures",
                                       METRICS["healer_policy_reload_failures_total"][1],
                                       ["reason"], registry=r)
        self.policy_loaded_at = Gauge("healer_policy_last_success_timestamp_seconds",
                                      METRICS["healer_policy_last_success_timestamp_seconds"][1],
                                      registry=r)
        self._state: _StateCollector | None = None

    def attach_state(self, src: StateSource) -> None:
        if self._state is not None:
            self.registry.unregister(self._state)
        self._state = _StateCollector(src)
        self.registry.register(self._state)

    def policies_loaded(self, digest: str, ok: bool, reason: str = "invalid") -> None:
        """A policy load's outcome; ``reason`` (failures): invalid, timeout, memory, crash."""
        self.reloads.labels("success" if ok else "failure").inc()
        self.reload_ok.set(1 if ok else 0)
        if ok:
            self.policy_info.clear()
            self.policy_info.labels(digest).set(1)
            self.policy_loaded_at.set_to_current_time()
        else:
            self.reload_failures.labels(reason).inc()

    def observe_call(self, system: str, operation: str, seconds: float,
                     error: str | None = None) -> None:
        self.calls.labels(system, operation).observe(seconds)
        if (system, operation) not in self._calls_seen:
            # error counters start at 0 for every kind healer maps errors to, so rate() and
            # the error-ratio alert see a series before the first failure
            self._calls_seen.add((system, operation))
            for kind in ERROR_KINDS:
                self.call_errors.labels(system, operation, kind)
        if error is not None:
            self.call_errors.labels(system, operation, error).inc()

    # controller observer -----------------------------------------------------------------

    def on_decision(self, node: str, trigger: Trigger, decision: Decision,
                    before: NodeRecord | None) -> None:
        after = decision.record
        for src, dst, _ in decision.transitions:
            self.transitions.labels(src.value, dst.value).inc()
            if dst is Phase.ESCALATED and after is not None:
                self.escalations.labels(after.policy).inc()
        if after is None:
            return
        if after.phase in TERMINAL and (before is None or before.phase not in TERMINAL):
            self._finished(after, trigger.at)
        opened = [t for t in decision.transitions if t[1] in (Phase.DEGRADING, Phase.FAILED)
                  and t[0] in (Phase.HEALTHY, Phase.SUSPECT)]
        if opened:
            xids = sorted({int(e.value) for e in after.incident.evidence if e.kind.value == "xid"})
            for rule in after.incident.rules or ("unknown",):
                for x in xids or [0]:
                    self.incidents.labels(after.incident.severity.label, rule,
                                          str(x) if x else "").inc()
        admitted = any(t[1] in ACTIVE and t[0] in (Phase.DEGRADING, Phase.FAILED)
                       for t in decision.transitions)
        if admitted:
            first_signal = min((e.observed_at for e in after.incident.evidence),
                               default=after.incident.opened_at)
            self.signal_to_action.labels(after.policy, after.incident.severity.label).observe(
                max(trigger.at - first_signal, 0.0))
        if after.blocked is not None and (before is None or before.blocked is None or
                                          before.blocked.guardrail != after.blocked.guardrail):
            self.blocks.labels(after.blocked.guardrail, after.policy).inc()
        if trigger.kind is TriggerKind.STEP and trigger.result is not None:
            self.actions.labels(trigger.result.step, trigger.result.status.value).inc()
            old = before.step(trigger.result.step) if before is not None else None
            new = after.step(trigger.result.step)
            if (old is not None and not old.done and new is not None and new.done
                    and new.finished_at is not None):
                outcome = (new.outcome or StepOutcome.DONE).ledger_word
                self.step_duration.labels(new.step, outcome).observe(
                    new.finished_at - new.started_at)

    def _finished(self, record: NodeRecord, now: float) -> None:
        """An incident just finished: observe what it cost (core.outcomes)."""
        view = self._state.src.view() if self._state and self._state.src.view else None
        nodes = getattr(view, "nodes", None) or {}
        out = incident_outcome(record, now, node_gpus(nodes.get(record.node)))
        closing = out.closing.value
        self.finished.labels(closing).inc()
        if out.detect is not None:
            self.detect.labels(out.severity).observe(out.detect)
        if out.to_replacement is not None:
            self.to_replacement.observe(out.to_replacement)
        if out.found_nothing is not None:
            self.found_nothing.labels(out.found_nothing.value).inc()
        self.gpu_hours_lost.labels(closing).inc(out.gpu_hours_lost)
