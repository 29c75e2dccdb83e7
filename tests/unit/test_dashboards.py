"""The Grafana dashboards in dashboards/: importable as they are, on a ``${datasource}`` variable,
and every PromQL expression parses and names only metrics healer or dcgm-exporter export.

Parsing is done by promtool (``promtool check rules`` on a temporary rule file with one
recording rule per expression, after Grafana's variables are replaced by what Grafana would
send), so the check is Prometheus's own parser, not a guess. promtool is installed by
``hack/install-system-deps.sh``; when it is missing these tests fail, they never skip.

The helpers (loading, variable substitution, metric names) are shared with
tests/unit/test_alerts.py and tests/integration/observability/test_dashboards_live.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from healer.obs.metrics import METRICS
from healer_dev.sim.dcgm import METRIC_NAMES as DCGM_METRICS

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = ROOT / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

#: What Grafana substitutes for its built-in interval variables. $__rate_interval is
#: max(4 x scrape interval, $__interval + scrape interval): 1m for a 15s scrape.
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h",
                    "__range_s": "3600", "__interval_ms": "15000"}

#: Every dashboard and the metrics it must chart (the brief it was built from).
REQUIRED: dict[str, set[str]] = {
    "healer-gpu-health": {
        "DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_POWER_VIOLATION"},
    "healer-remediation": {
        "healer_remediations", "healer_transitions_total", "healer_incidents_total",
        "healer_escalations_total", "healer_remediation_phase_seconds",
        "healer_remediation_overdue", "healer_held_for_fencing", "healer_repair_cordoned_nodes"},
    "healer-latency": {
        "healer_step_duration_seconds_bucket", "healer_signal_to_action_seconds_bucket"},
    "healer-capacity": {"healer_spare_pool_free", "healer_held_for_capacity"},
    "healer-outcomes": {
        "healer_time_to_detect_seconds_bucket", "healer_time_to_replacement_seconds_bucket",
        "healer_step_duration_seconds_bucket", "healer_remediations_finished_total",
        "healer_remediations_found_nothing_total", "healer_capacity_lost_gpu_hours_total"},
    "healer-guardrails": {
        "healer_breaker_tripped", "healer_breaker_utilisation", "healer_unavailable_nodes",
        "healer_max_unavailable", "healer_active_remediations", "healer_max_concurrent",
        "healer_guardrail_blocks_total", "healer_gpu_serial_incidents",
        "healer_mass_death_tripped"},
    "healer-controller": {
        "healer_up", "healer_leader", "healer_policy_reloads_total", "healer_policy_info",
        "healer_policy_last_reload_success", "healer_api_call_errors_total",
        "healer_api_call_duration_seconds_bucket", "healer_telemetry_stale_nodes",
        "healer_telemetry_last_success_timestamp_seconds"},
}

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset", "inf", "nan", "atan2"}


# -- helpers shared with the alert and live tests ----------------------------------------------


def promtool() -> str:
    """The promtool binary; FAILS (never skips) the calling test when it is missing."""
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed (Debian: bash hack/install-system-deps.sh "
                    "installs prometheus, which ships /usr/bin/promtool)", pytrace=False)
    return found


def known_metrics() -> dict[str, str]:
    """Every metric name a query may use → where it comes from (healer or dcgm-exporter).

    Counters are named with their ``_total``; histograms by ``_bucket``, ``_sum``, ``_count``.
    """
    out: dict[str, str] = {}
    for name, (kind, _) in METRICS.items():
        if kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                out[name + suffix] = "healer"
        else:
            out[name] = "healer"
    out.update(dict.fromkeys(DCGM_METRICS, "dcgm-exporter"))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (identifiers that are not functions,
    keywords, label names inside braces/groupings, strings or durations)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", "{}", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "[]", text)  # ranges, subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def load_dashboards() -> dict[str, dict[str, Any]]:
    """file name → dashboard JSON, for every dashboards/*.json."""
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARD_DIR.glob("*.json"))}


def iter_panels(dash: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    for p in dash.get("panels", []):
        yield p
        yield from p.get("panels", []) if p.get("type") == "row" else ()


def iter_targets(dash: Mapping[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every query target."""
    for p in iter_panels(dash):
        for t in p.get("targets", []):
            yield p, t


def variables(dash: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dash.get("templating", {}).get("list", [])}


def substitute(expr: str, dash: Mapping[str, Any],
               values: Mapping[str, str] | None = None) -> str:
    """``expr`` as Grafana would send it: built-in interval variables and template variables
    replaced (a query variable by ``values[name]`` or else its "All" value). ``$1`` in
    ``label_replace`` replacements is not a variable and is left alone."""
    vals = dict(GRAFANA_BUILTINS)
    for name, var in variables(dash).items():
        if var.get("type") == "query":
            vals[name] = var.get("allValue") or ".*"
    vals.update(values or {})

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in vals:
            raise KeyError(f"unknown variable ${name} in {expr!r}")
        return vals[name]

    return re.sub(r"\$\{([A-Za-z_]\w*)(?::\w+)?\}|\$([A-Za-z_]\w*)", repl, expr)


def variable_query(var: Mapping[str, Any]) -> str:
    q = var.get("query")
    return str(q.get("query", "") if isinstance(q, Mapping) else q or "")


def variable_promql(var: Mapping[str, Any]) -> str:
    """The PromQL behind a query variable: ``label_values(m, l)`` → ``count by (l) (m)``,
    ``query_result(e)`` → ``e``."""
    q = variable_query(var).strip()
    if m := re.fullmatch(r"label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)", q, re.S):
        return f"count by ({m.group(2)}) ({m.group(1)})"
    if m := re.fullmatch(r"query_result\((.+)\)", q, re.S):
        return m.group(1)
    raise AssertionError(f"unsupported variable query {q!r}")


def all_expressions(values: Mapping[str, str] | None = None
                    ) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(where, raw expr, substituted expr, target) for every dashboard target."""
    out = []
    for fname, dash in load_dashboards().items():
        for panel, t in iter_targets(dash):
            where = f"{fname} #{panel['id']} {panel.get('title', '')!r} {t.get('refId')}"
            out.append((where, t["expr"], substitute(t["expr"], dash, values), t))
    return out


def promtool_check(exprs: Mapping[str, str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """``promtool check rules`` on one recording rule per expression (record name = key)."""
    rules = [{"record": name, "expr": e} for name, e in exprs.items()]
    path = tmp / "dashboard-exprs.rules.json"  # JSON is YAML
    path.write_text(json.dumps({"groups": [{"name": "dashboards", "rules": rules}]}, indent=1))
    return subprocess.run([promtool(), "check", "rules", "--lint=none", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)


def record_name(where: str) -> str:
    return "dashboard:" + re.sub(r"[^A-Za-z0-9_]+", "_", where).strip("_")


# -- tests ------------------------------------------------------------------------------------


DASHBOARDS = load_dashboards()


def test_every_expected_dashboard_is_there() -> None:
    uids = sorted(d["uid"] for d in DASHBOARDS.values())
    assert uids == sorted(REQUIRED), uids


@pytest.mark.parametrize("fname", sorted(DASHBOARDS))
def test_dashboard_schema(fname: str) -> None:
    d = DASHBOARDS[fname]
    assert d.get("title", "").startswith("healer / "), d.get("title")
    assert re.fullmatch(r"[a-z0-9-]{1,40}", d.get("uid", "")), d.get("uid")
    assert isinstance(d.get("schemaVersion"), int)
    assert d["schemaVersion"] >= 36
    assert d.get("id") is None  # importable anywhere
    assert "healer" in d.get("tags", [])
    assert d.get("time", {}).get("from")
    assert d.get("time", {}).get("to")
    ds = variables(d).get("datasource")
    assert ds is not None
    assert ds["type"] == "datasource", ds
    assert ds["query"] == "prometheus", ds
    panels = list(iter_panels(d))
    assert panels
    ids = [p.get("id") for p in panels]
    assert all(isinstance(i, int) for i in ids), ids
    assert len(set(ids)) == len(ids), ids
    for p in panels:
        gp = p.get("gridPos", {})
        assert all(isinstance(gp.get(k), int) for k in ("h", "w", "x", "y")), (p["id"], gp)
        assert gp["w"] > 0, (p["id"], gp)
        assert gp["h"] > 0, (p["id"], gp)
        assert gp["x"] + gp["w"] <= 24, (p["id"], gp)
        assert p.get("title"), p["id"]
        if p["type"] == "row":
            continue
        assert p.get("datasource") == DATASOURCE, (p["id"], p.get("datasource"))
        targets = p.get("targets") or []
        assert targets, f"panel {p['id']} {p['title']!r} has no targets"
        refs = [t.get("refId") for t in targets]
        assert all(refs), (p["id"], refs)
        assert len(set(refs)) == len(refs), (p["id"], refs)
        for t in targets:
            assert t.get("datasource") == DATASOURCE, (p["id"], t.get("datasource"))
            assert t.get("expr", "").strip(), (p["id"], t)
    for v in variables(d).values():
        if v["type"] == "query":
            assert v.get("datasource") == DATASOURCE, v


@pytest.mark.parametrize("fname", sorted(DASHBOARDS))
def test_no_hard_coded_datasource(fname: str) -> None:
    bad: list[Any] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ds = node.get("datasource")
            if isinstance(ds, dict) and ds.get("uid") not in (None, "${datasource}"):
                bad.append(ds)
            if isinstance(ds, str) and ds not in ("${datasource}",):
                bad.append(ds)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(DASHBOARDS[fname])
    assert not bad, bad
    assert "__inputs" not in DASHBOARDS[fname]


def test_every_expression_parses(tmp_path: Path) -> None:
    exprs = {record_name(w): e for w, _, e, _ in all_expressions()}
    for fname, dash in DASHBOARDS.items():
        for name, var in variables(dash).items():
            if var["type"] == "query":
                exprs[record_name(f"{fname} var {name}")] = variable_promql(var)
    r = promtool_check(exprs, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in r.stdout, r.stdout


def test_every_expression_uses_known_metrics() -> None:
    known = known_metrics()
    problems = []
    for where, raw, _, _ in all_expressions():
        names = metric_names(raw)
        if not names:
            problems.append(f"{where}: selects no metric: {raw}")
        problems += [f"{where}: unknown metric {n}" for n in sorted(names - set(known))]
    for fname, dash in DASHBOARDS.items():
        for name, var in variables(dash).items():
            if var["type"] == "query":
                unknown = metric_names(variable_promql(var)) - set(known)
                problems += [f"{fname} variable {name}: unknown metric {n}" for n in unknown]
    assert not problems, "\n".join(problems)


def test_dcgm_queries_handle_both_host_label_spellings() -> None:
    """dcgm-exporter labels the host ``Hostname`` (released) or ``hostname`` (newer)."""
    bad = [f"{w}: {raw}" for w, raw, _, _ in all_expressions()
           if metric_names(raw) & DCGM_METRICS
           and not ('Hostname' in raw and 'hostname' in raw)]
    assert not bad, "\n".join(bad)


def test_each_dashboard_charts_what_it_is_for() -> None:
    for dash in DASHBOARDS.values():
        used = set().union(*(metric_names(t["expr"]) for _, t in iter_targets(dash)))
        missing = REQUIRED[dash["uid"]] - used
        assert not missing, (dash["uid"], sorted(missing))


def test_every_healer_metric_is_on_a_dashboard() -> None:
    used = set().union(*(metric_names(raw) for _, raw, _, _ in all_expressions()))
    missing = []
    for name, (kind, _) in METRICS.items():
        forms = {name + s for s in ("_bucket", "_sum", "_count")} if kind == "histogram" \
            else {name}
        if not forms & used:
            missing.append(name)
    assert not missing, missing


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (node) (rate(healer_transitions_total{source="Failed"}[5m]))',
     {"healer_transitions_total"}),
    ('label_replace(DCGM_FI_DEV_GPU_TEMP{Hostname=~"$node"}, "node", "$1", "Hostname", "(.+)")',
     {"DCGM_FI_DEV_GPU_TEMP"}),
    ("histogram_quantile(0.9, sum by (le) (rate(healer_step_duration_seconds_bucket[1m])))",
     {"healer_step_duration_seconds_bucket"}),
    ("(max(healer_leader) or on () vector(0)) < 1 and on (job, instance) healer_up == bool 1",
     {"healer_leader", "healer_up"}),
    ("time() - max by (source) (healer_telemetry_last_success_timestamp_seconds) > 300",
     {"healer_telemetry_last_success_timestamp_seconds"}),
    ("sum(rate(foo_total[5m] offset 1h)) / 1e9", {"foo_total"}),
])
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_substitute_leaves_label_replace_groups_alone() -> None:
    dash = DASHBOARDS["gpu-health.json"]
    raw = 'label_replace(rate(x{Hostname=~"$node"}[$__rate_interval]), "n", "$1", "h", "(.+)")'
    assert substitute(raw, dash) == \
        'label_replace(rate(x{Hostname=~".*"}[1m]), "n", "$1", "h", "(.+)")'
    assert substitute("y{node=~\"${node}\"}", dash, {"node": "gpu-1"}) == 'y{node=~"gpu-1"}'
    with pytest.raises(KeyError):
        substitute("z{a=~\"$nope\"}", dash)
