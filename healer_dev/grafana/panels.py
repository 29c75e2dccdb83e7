"""healer's dashboard house style over Grafana Labs' grafana-foundation-sdk builders: one call
per panel (:func:`stat`, :func:`timeseries`, :func:`table`, :func:`state_timeline`,
:func:`bargauge`, :func:`heatmap`, :func:`row`), one per dashboard (:func:`dashboard`), and the
query variables (:func:`variable`, :func:`gpu_node_variable`).

Every panel and query reads the ``${datasource}`` variable (a Prometheus data source picked
when the dashboard is opened), every query is PromQL in code mode. Panels flow left to right
and wrap at the grid's 24 columns (the SDK's layout); a :func:`row` starts a new line. Panel
ids and query refIds are numbered in order. The dashboard modules (``dashboard_*.py``) say
only what each panel shows: title, description, queries, unit, size. :func:`dcgm` writes the
selector of a dcgm-exporter series that works with both host label spellings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias, TypeVar

from grafana_foundation_sdk.builders import bargauge as bargauge_b
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.builders import heatmap as heatmap_b
from grafana_foundation_sdk.builders import prometheus as prometheus_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import statetimeline as statetimeline_b
from grafana_foundation_sdk.builders import table as table_b
from grafana_foundation_sdk.builders import timeseries as timeseries_b
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dashboard_m
from grafana_foundation_sdk.models import heatmap as heatmap_m
from grafana_foundation_sdk.models import prometheus as prometheus_m

#: Every panel and query reads the data source the ``datasource`` variable names.
DATASOURCE = dashboard_m.DataSourceRef(type_val="prometheus", uid="${datasource}")
#: The schema version of the JSON written (Grafana 10.3/10.4; later versions migrate it).
SCHEMA_VERSION = 39

#: A panel builder (any panel type) or a row.
PanelBuilder: TypeAlias = Builder[dashboard_m.Panel] | dashboard_b.Row
#: Threshold steps, lowest first: (colour, from value; None for the base step).
Steps: TypeAlias = Sequence[tuple[str, float | None]]
#: Value mappings: value → (text, colour).
Mappings: TypeAlias = Mapping[int, tuple[str, str]]


@dataclass(frozen=True)
class Q:
    """A query: PromQL and its legend (``__auto``: Grafana's own series name)."""

    expr: str
    legend: str = "__auto"


Query: TypeAlias = Q | str
#: Any of the panel builders (they share the standard options).
P = TypeVar("P", stat_b.Panel, timeseries_b.Panel, table_b.Panel, statetimeline_b.Panel,
            bargauge_b.Panel, heatmap_b.Panel)


def dcgm(metric: str, fn: str = "", window: str = "", where: str = "") -> str:
    """A dcgm-exporter series of the ``$node`` nodes, from either host label spelling
    (``Hostname`` in released versions, ``hostname`` in newer builds), normalised to a
    ``node`` label: ``fn(metric{...}[window])`` (``fn`` e.g. ``rate``; none: the plain
    series), ``where`` adding label matchers."""
    def selector(host: str) -> str:
        s = f'{metric}{{{host}=~"$node"{", " + where if where else ""}}}'
        return f"{fn}({s}[{window}])" if fn else s

    return (f'label_replace(label_replace({selector("Hostname")} or {selector("hostname")}, '
            f'"node", "$1", "Hostname", "(.+)"), "node", "$1", "hostname", "(.+)")')


def _target(q: Query, ref: str, *, instant: bool, fmt: prometheus_m.PromQueryFormat | None
            ) -> prometheus_b.Dataquery:
    query = q if isinstance(q, Q) else Q(q)
    t = (prometheus_b.Dataquery().ref_id(ref).datasource(DATASOURCE)
         .editor_mode(prometheus_m.QueryEditorMode.CODE).expr(query.expr)
         .legend_format(query.legend))
    t = t.instant() if instant else t.range()
    return t.format(fmt) if fmt is not None else t


def _targets(queries: Sequence[Query], *, instant: bool = False,
             fmt: prometheus_m.PromQueryFormat | None = None) -> list[prometheus_b.Dataquery]:
    if not queries:
        raise ValueError("a panel needs at least one query")
    return [_target(q, chr(ord("A") + i), instant=instant, fmt=fmt)
            for i, q in enumerate(queries)]


def _thresholds(steps: Steps) -> dashboard_b.ThresholdsConfig:
    return (dashboard_b.ThresholdsConfig().mode(dashboard_m.ThresholdsMode.ABSOLUTE)
            .steps([dashboard_m.Threshold(value=v, color=c) for c, v in steps]))


def _mappings(values: Mappings) -> list[dashboard_m.ValueMapping]:
    return [dashboard_m.ValueMap({str(k): dashboard_m.ValueMappingResult(text=t, color=c)
                                  for k, (t, c) in values.items()})]


def _field(p: P, unit: str | None, decimals: float | None, minimum: float | None,
           thresholds: Steps | None, mappings: Mappings | None) -> P:
    """The standard field options every panel type shares."""
    if mappings is not None:
        p = p.mappings(_mappings(mappings))
    if thresholds is not None:
        p = p.thresholds(_thresholds(thresholds))
    if unit is not None:
        p = p.unit(unit)
    if decimals is not None:
        p = p.decimals(decimals)
    if minimum is not None:
        p = p.min(minimum)
    return p


def _base(p: P, title: str, description: str, w: int, h: int) -> P:
    return p.title(title).description(description).datasource(DATASOURCE).span(w).height(h)


def _reduce() -> common_b.ReduceDataOptions:
    return common_b.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def stat(title: str, description: str, *queries: Query, unit: str | None = None,
         decimals: float | None = None, thresholds: Steps | None = None,
         mappings: Mappings | None = None, graph: bool = True, instant: bool = False,
         w: int = 4, h: int = 4) -> stat_b.Panel:
    """One big number (its last value), with a sparkline unless ``graph=False``; ``instant``
    for a figure over the dashboard's range (``$__range``)."""
    p = _base(stat_b.Panel(), title, description, w, h)
    p = _field(p, unit, decimals, None, thresholds, mappings)
    for t in _targets(queries, instant=instant):
        p = p.with_target(t)
    mode = common_m.BigValueGraphMode.AREA if graph else common_m.BigValueGraphMode.NONE
    return (p.reduce_options(_reduce()).color_mode(common_m.BigValueColorMode.VALUE)
            .graph_mode(mode).justify_mode(common_m.BigValueJustifyMode.AUTO)
            .orientation(common_m.VizOrientation.AUTO).text_mode(common_m.BigValueTextMode.AUTO))


def timeseries(title: str, description: str, *queries: Query, unit: str | None = None,
               decimals: float | None = None, minimum: float | None = None,
               stack: bool = False, legend_right: bool = True, w: int = 12,
               h: int = 8) -> timeseries_b.Panel:
    """Lines over time; the legend a table (last, max) on the right (or below), the tooltip
    every series sorted; ``stack`` stacks the series."""
    p = _base(timeseries_b.Panel(), title, description, w, h)
    p = _field(p, unit, decimals, minimum, None, None)
    for t in _targets(queries):
        p = p.with_target(t)
    p = (p.draw_style(common_m.GraphDrawStyle.LINE).line_width(1).fill_opacity(10)
         .show_points(common_m.VisibilityMode.NEVER).span_nulls(False))
    if stack:
        p = p.stacking(common_b.StackingConfig().mode(common_m.StackingMode.NORMAL).group("A"))
    placement = common_m.LegendPlacement.RIGHT if legend_right else common_m.LegendPlacement.BOTTOM
    return (p.legend(common_b.VizLegendOptions().display_mode(common_m.LegendDisplayMode.TABLE)
                     .placement(placement).show_legend(True).calcs(["lastNotNull", "max"]))
            .tooltip(common_b.VizTooltipOptions().mode(common_m.TooltipDisplayMode.MULTI)
                     .sort(common_m.SortOrder.DESCENDING)))


def table(title: str, description: str, *queries: Query, unit: str | None = None,
          w: int = 12, h: int = 8) -> table_b.Panel:
    """Instant queries as one table (their rows merged, the time column hidden)."""
    p = _base(table_b.Panel(), title, description, w, h)
    p = _field(p, unit, None, None, None, None)
    for t in _targets(queries, instant=True, fmt=prometheus_m.PromQueryFormat.TABLE):
        p = p.with_target(t)
    return (p.show_header(True).cell_height(common_m.TableCellHeight.SM)
            .with_transformation(dashboard_m.DataTransformerConfig(id_val="merge", options={}))
            .with_transformation(dashboard_m.DataTransformerConfig(
                id_val="organize", options={"excludeByName": {"Time": True}})))


def state_timeline(title: str, description: str, *queries: Query,
                   mappings: Mappings | None = None,
                   unit: str | None = None, w: int = 12, h: int = 8
                   ) -> statetimeline_b.Panel:
    """One band per series (coloured by ``mappings``: value → text, colour), no legend."""
    p = _base(statetimeline_b.Panel(), title, description, w, h)
    p = _field(p, unit, None, None, None, mappings)
    for t in _targets(queries):
        p = p.with_target(t)
    return (p.show_value(common_m.VisibilityMode.NEVER).merge_values(True).row_height(0.8)
            .legend(common_b.VizLegendOptions().display_mode(common_m.LegendDisplayMode.LIST)
                    .placement(common_m.LegendPlacement.BOTTOM).show_legend(False))
            .tooltip(common_b.VizTooltipOptions().mode(common_m.TooltipDisplayMode.SINGLE)
                     .sort(common_m.SortOrder.NONE)))


def bargauge(title: str, description: str, *queries: Query, unit: str | None = None,
             thresholds: Steps | None = None, w: int = 8, h: int = 8) -> bargauge_b.Panel:
    """Horizontal gradient bars of instant values."""
    p = _base(bargauge_b.Panel(), title, description, w, h)
    p = _field(p, unit, None, None, thresholds, None)
    for t in _targets(queries, instant=True):
        p = p.with_target(t)
    return (p.reduce_options(_reduce()).orientation(common_m.VizOrientation.HORIZONTAL)
            .display_mode(common_m.BarGaugeDisplayMode.GRADIENT).show_unfilled(True))


def heatmap(title: str, description: str, *queries: Query, unit: str = "s", w: int = 12,
            h: int = 8) -> heatmap_b.Panel:
    """Histogram buckets (``format=heatmap``, already bucketed: no calculation) over time."""
    p = _base(heatmap_b.Panel(), title, description, w, h).unit(unit)
    for t in _targets(queries, fmt=prometheus_m.PromQueryFormat.HEATMAP):
        p = p.with_target(t)
    return (p.calculate(False).cell_gap(1)
            .y_axis(heatmap_b.YAxisConfig().unit(unit))
            .color(heatmap_b.HeatmapColorOptions().mode(heatmap_m.HeatmapColorMode.SCHEME)
                   .scheme("Oranges").exponent(0.5).steps(64))
            .mode(common_m.TooltipDisplayMode.SINGLE).show_y_histogram().show_legend())


def row(title: str) -> dashboard_b.Row:
    """A row header: the panels after it, up to the next row, belong to it (not collapsed)."""
    return dashboard_b.Row(title).collapsed(False)


def variable(name: str, label: str, query: str, regex: str = "") -> dashboard_b.QueryVariable:
    """``$name``: the values ``query`` finds (``label_values(metric, label)`` or
    ``query_result(expr)``, ``regex`` picking the value out of each result), several or all
    selectable (all: ``.*``), sorted, refreshed when the time range changes."""
    return (dashboard_b.QueryVariable(name).label(label).datasource(DATASOURCE)
            .query({"query": query, "refId": f"{name}-var"}).regex(regex)
            .refresh(dashboard_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .include_all(True).multi(True).all_value(".*")
            .current(dashboard_m.VariableOption(selected=True, text=["All"], value=["$__all"]))
            .sort(dashboard_m.VariableSort.ALPHABETICAL_ASC).hide(dashboard_m.VariableHide.DONT_HIDE))


def gpu_node_variable() -> dashboard_b.QueryVariable:
    """``$node``: every node a dcgm-exporter reports, whichever host label it uses."""
    return variable("node", "Node", 'query_result(count by (node) (label_replace(label_replace('
                    'DCGM_FI_DEV_GPU_TEMP, "node", "$1", "Hostname", "(.+)"), "node", "$1", '
                    '"hostname", "(.+)")))', regex='/node="([^"]+)"/')


def _datasource_variable() -> dashboard_b.DatasourceVariable:
    return (dashboard_b.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
            .regex("").hide(dashboard_m.VariableHide.DONT_HIDE))


def dashboard(uid: str, title: str, description: str, tags: Sequence[str],
              panels: Sequence[PanelBuilder],
              variables: Sequence[Builder[dashboard_m.VariableModel]] = (), *,
              since: str = "now-6h", refresh: str = "30s") -> dashboard_m.Dashboard:
    """A healer dashboard: ``healer / <title>``, tagged ``healer`` (and ``tags``), linked to
    the other healer dashboards, showing ``since`` until now refreshed every ``refresh``, a
    shared crosshair, the ``datasource`` variable first; its panels laid out and numbered in
    order."""
    d = (dashboard_b.Dashboard(f"healer / {title}").uid(uid).description(description)
         .tags(["healer", *tags]).editable().tooltip(dashboard_m.DashboardCursorSync.CROSSHAIR)
         .time(since, "now").refresh(refresh).timezone("").week_start("").annotations([])
         .fiscal_year_start_month(0).version(1)
         .link(dashboard_b.DashboardLink("healer dashboards")
               .type(dashboard_m.DashboardLinkType.DASHBOARDS).tags(["healer"])
               .as_dropdown(True).include_vars(False).keep_time(True).icon("external link")
               .target_blank(False).tooltip("").url(""))
         .with_variable(_datasource_variable()))
    for v in variables:
        d = d.with_variable(v)
    for p in panels:
        d = d.with_row(p) if isinstance(p, dashboard_b.Row) else d.with_panel(p)
    built = d.build()
    built.schema_version = SCHEMA_VERSION
    for i, panel in enumerate(built.panels or [], start=1):
        panel.id_val = i
    return built
