"""healer's Grafana dashboards and Grafana alert rules, as code (dev side: never shipped).

The dashboards in ``dashboards/`` are built with Grafana Labs' grafana-foundation-sdk: one
module per dashboard (``dashboard_*.py``: its panels, in order) over the house style of
:mod:`.panels`. The Grafana alert rules (``deploy/grafana/alerting.yaml``) and the
prometheus-operator ``PrometheusRule`` are generated from the Prometheus rule file
``deploy/prometheus/healer-rules.yaml`` (:mod:`.alerts`). :mod:`.render` lists every generated
file, the chart's copies included; ``make grafana`` (``python -m healer_dev grafana``) writes
them and ``tests/unit/test_generated.py`` fails while one is stale.

Add a panel: a call in the ``PANELS`` list of its dashboard module, e.g. in
``dashboard_remediation.py``::

    timeseries(
        "Nodes kept cordoned in Repair",
        "Nodes healer handed to repair that are still cordoned.",
        Q("sum by (policy) (healer_repair_cordoned)", "{{policy}}"),
        w=8),

then ``make grafana``. Add an alert: a rule in ``deploy/prometheus/healer-rules.yaml`` (with a
firing and a quiet case in ``healer-rules.test.yaml`` and ``docs/runbooks/<Alert>.md``), then
``make grafana``: the Grafana rule and the PrometheusRule follow.
"""
