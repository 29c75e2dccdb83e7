"""``healer backtest``: what healer would have done over a past time range, and when.

The telemetry comes from Prometheus (:func:`healer.adapters.prometheus.history.history`: the
same queries the daemon sends, as range queries, one step apart) and goes through the **real**
engine — health evaluation, the state machine, the guardrails — in
:class:`healer.sim.engine.Replay`, against a simulated fleet. The report lists, per node, the
incidents (time, severity, rules, GPUs), the disruptions (drain and cordon times), the spares
used, every guardrail block (which guardrail, with its numbers), the escalations and the
stretches of stale telemetry, plus a fleet summary.

The world during a backtest is **optimistic**, and the report says so:

* every action succeeds after a short latency (``api``: 1 s; a replacement slurmd is ready
  ``pod_start`` = 45 s after the move; a validation passes after 2 min);
* drains complete at once: Prometheus holds no job data, so no job delays a drain and no
  checkpoint is waited for;
* a pool of ``spares`` warm spares (default: unlimited, each a clone of the failed node's
  topology labels, so always in its NVLink domain); the report says how many were needed;
* repairs report no result unless ``repair_after`` is given (then every repair passes after
  that long); a node sent to repair stays out of the fleet for the rest of the range.

Guardrails stay **on**. Policies in ``observe`` or ``dryRun`` mode are evaluated as ``act``
(the header lists the configured modes), so the operator sees what acting would have done;
``as_configured`` keeps the modes.

Nodes are selected by Kubernetes labels: every node seen in the telemetry gets ``node_labels``
(default ``nvidia.com/gpu.present=true``), or, with a kubeconfig, the real Nodes' labels.

Fidelity notes. Samples of a node at a step where it had no fresh heartbeat are dropped, like
the daemon does (range functions keep answering from old samples while an exporter is down;
stale telemetry is unknown, never a fault). The engine is the daemon's
(:class:`healer.core.engine.Engine`): a node's signal history is kept bounded (per GPU and
metric only the latest sample and the samples where a rule's condition started to hold), which
gives the health evaluation exactly the same verdicts as the full history, and wake-ups that
cannot change anything are skipped. History is fetched a day at a time
(:func:`~healer.backtest.history.iter_history`). XID windows that began before ``start`` are
not seen. A node that a spare replaced and that is repaired (``repair_after``) returns to the
pool as a spare; if an XID of it is still inside its rule's window when it serves again, a new
incident opens, as it would in the daemon.

The same input gives a byte-identical :meth:`~healer.backtest.report.Report.to_json` (sorted
keys, no wall-clock data).

The modules, by role:

* :mod:`.history`: history reading (Prometheus range queries through prometheus-api-client, a
  day at a time, cut into the polls the daemon would have seen; the real Nodes' labels);
* :mod:`.replay`: the replay through the one engine (:class:`~.replay.Backtest`,
  :func:`~.replay.backtest`), against the optimistic world of :mod:`.world`;
* :mod:`.collect` and :mod:`.report`: what happened, as the report (data, JSON, the table);
* :mod:`.inputs` and :mod:`.cli`: the flags and the command.
"""
