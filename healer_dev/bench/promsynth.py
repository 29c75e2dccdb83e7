"""Synthetic Prometheus answers of the real shape, for the ``telemetry`` group.

For every query of a :class:`~healer.adapters.prometheus.PrometheusSource`'s plan (the
freshness query, the XID range query, one per metric rule of the policies) this builds the JSON
body Prometheus would return for a fleet of dcgm-exporter targets: ``max by (...)`` answers
carry the grouping labels dcgm-exporter series have (``Hostname``, ``instance``, ``gpu``,
``UUID``), the XID range query returns the raw ``DCGM_FI_DEV_XID_ERRORS`` and
``DCGM_EXP_XID_ERRORS_COUNT`` series with every exporter label, one sample per 15 s scrape. A
few nodes (chosen by ``seed``) are faulty: an XID 79 on one GPU from a given time, an
uncorrectable ECC error, a hot GPU. Healthy answers are rendered once with placeholders for
the timestamps and filled per request, so serving 10,000 nodes stays cheap for the server.

:func:`make_app` serves them over ``/api/v1/query`` (GET or POST), as an aiohttp app for
:func:`healer.obs.http.serve`.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from aiohttp import web

from healer.adapters.prometheus.promql import XID_COUNT, XID_GAUGE
from healer_dev.sim.dcgm import gpu_uuid

SCRAPE = 15.0
MODEL = "NVIDIA H100 80GB HBM3"
DRIVER = "550.54.15"
#: healthy values of the fields the default policies read (0 for counters' increase/rate)
HEALTHY = {"DCGM_FI_DEV_GPU_TEMP": 48.0}
_TOKEN = re.compile(rb"@(\w+)@")
_HOSTS = re.compile(r'(?:Hostname|hostname)=~"((?:[^"\\]|\\.)*)"')
_COMPARISON = re.compile(r"\)\s*(>=|<=|==|!=|>|<)\s*([-+0-9.eE]+)\s*$")
_DURATION = re.compile(r"\[(\d+(?:\.\d+)?)(ms|s|m|h|d)\]$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass
class Fleet:
    nodes: int
    gpus: int = 8
    seed: int = 1
    faulty_share: float = 0.005
    fault_at: float = 0.0  # XIDs appear in samples at or after this time
    names: list[str] = field(default_factory=list)
    xid_nodes: set[str] = field(default_factory=set)
    ecc_nodes: set[str] = field(default_factory=set)
    hot_nodes: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.names = [f"gpu-{i:05d}" for i in range(self.nodes)]
        rng = random.Random(self.seed)
        k = max(1, round(self.nodes * self.faulty_share))
        bad = rng.sample(self.names, min(self.nodes, 3 * k))
        self.xid_nodes = set(bad[:k])
        self.ecc_nodes = set(bad[k:2 * k])
        self.hot_nodes = set(bad[2 * k:])

    def instance(self, i: int) -> str:
        return f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}:9400"

    def offset(self, i: int) -> int:
        """The scrape phase of node ``i`` (seconds into each 15 s interval)."""
        return i % int(SCRAPE)


def _labels_grouped(fleet: Fleet, i: int, g: int) -> dict[str, str]:
    name = fleet.names[i]
    return {"Hostname": name, "instance": fleet.instance(i), "gpu": str(g),
            "UUID": gpu_uuid(name, g)}


def _labels_raw(fleet: Fleet, i: int, g: int, metric: str) -> dict[str, str]:
    name = fleet.names[i]
    return {"__name__": metric, "DCGM_FI_DRIVER_VERSION": DRIVER, "Hostname": name,
            "UUID": gpu_uuid(name, g), "device": f"nvidia{g}", "gpu": str(g),
            "instance": fleet.instance(i), "job": "dcgm-exporter", "modelName": MODEL,
            "pci_bus_id": f"00000000:{0x18 + g * 16:02X}:00.0"}


def window_seconds(expr: str) -> float:
    m = _DURATION.search(expr.strip())
    if not m:
        raise ValueError(f"no range in {expr!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _wrap(kind: str, items: Sequence[bytes]) -> bytes:
    return (b'{"status":"success","data":{"resultType":"' + kind.encode() + b'","result":['
            + b",".join(items) + b"]}}")


class Answers:
    """The bodies for one source's queries over one fleet."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._healthy = {i for i, n in enumerate(fleet.names)
                         if n not in fleet.xid_nodes | fleet.ecc_nodes | fleet.hot_nodes}
        self._templates: dict[str, bytes] = {}
        self.requests = 0
        self.unknown = 0  # queries of a shape this server does not know (answered empty)

    @staticmethod
    def _field_of(expr: str) -> str:
        """The DCGM field a query reads (not a label of its ``by (...)`` clause)."""
        m = re.search(r"(DCGM_[A-Z0-9_]+)", re.sub(r"by\s*\([^)]*\)", "", expr))
        return m.group(1) if m else ""

    # -- templates (healthy nodes; @T@ and @O<k>@ are filled per request) -----------------

    def _template(self, key: str) -> bytes:
        t = self._templates.get(key)
        if t is None:
            t = self._templates[key] = self._render_template(key)
        return t

    def _render_template(self, key: str) -> bytes:
        f = self.fleet
        items: list[bytes] = []
        kind, _, arg = key.partition(":")
        for i in sorted(self._healthy):
            o = f.offset(i)
            for g in range(f.gpus):
                if kind == "fresh":
                    grouped = json.dumps(_labels_grouped(f, i, g)).encode()
                    items.append(b'{"metric":' + grouped + b',"value":[@T@,"@F%d@"]}' % o)
                elif kind == "metric":
                    grouped = json.dumps(_labels_grouped(f, i, g)).encode()
                    v = HEALTHY.get(arg, 0.0)
                    items.append(b'{"metric":' + grouped + b',"value":[@T@,"%s"]}'
                                 % _fmt(v).encode())
                else:  # xid:<samples>
                    n = int(arg)
                    zeros = ",".join(f'[@S{o}_{k}@,"0"]' for k in range(n)).encode()
                    for metric, extra in ((XID_GAUGE, {"err_code": "0", "err_msg": "No Error"}),
                                          (XID_COUNT, {"window_size_in_ms": "300000"})):
                        lab = _labels_raw(f, i, g, metric) | extra
                        items.append(b'{"metric":' + json.dumps(lab).encode()
                                     + b',"values":[' + zeros + b"]}")
        return b",".join(items)

    @staticmethod
    def _fill(template: bytes, table: Mapping[bytes, bytes]) -> bytes:
        return _TOKEN.sub(lambda m: table[m.group(1)], template)

    # -- one answer -----------------------------------------------------------------------

    def answer(self, expr: str, at: float) -> bytes:
        """What Prometheus would answer to ``expr`` at ``at`` for this fleet.

        The queries are recognised by shape, not by exact text, so that the source's query
        plan may change: the freshness query (``timestamp(``), raw XID samples (a range
        selector ``{__name__=~...}[w]``), the XID pre-query (``changes(`` of the XID gauge),
        recovery queries (``label_replace(..., "healer_q", ...)`` joined with ``or``; a
        freshness query tagged ``healer_fresh`` gets per-node rows: newest and GPU count), and
        metric queries (a DCGM field, optionally with a trailing comparison: Prometheus then
        returns only the series that pass it). A host matcher ``Hostname=~"..."`` restricts
        any of them. Anything else gets an empty vector (counted in ``unknown``).
        """
        self.requests += 1
        hosts = _host_filter(expr)
        if "timestamp(" in expr:
            return self._freshness(at, hosts, per_node='"healer_fresh"' in expr)
        if expr.lstrip().startswith("{__name__=~"):
            return self._xid_raw(expr, at, hosts)
        if "changes(" in expr and XID_GAUGE in expr:
            return self._xid_prequery(expr, at, hosts)
        if "label_replace(" in expr:
            items: list[bytes] = []
            for part in expr.split(" or "):
                tag = re.search(r'"(\w+)",\s*"(\d+)",\s*"",\s*""\)\s*$', part)
                field_ = self._field_of(part)
                if tag and field_:
                    extra = {tag.group(1): tag.group(2)}
                    items += self._metric_rows(field_, at, _host_filter(part), None, extra)
            return _wrap("vector", items)
        field_ = self._field_of(expr)
        if field_:
            cmp = _COMPARISON.search(expr)
            test = (cmp.group(1), float(cmp.group(2))) if cmp else None
            if test is None or _passes(HEALTHY.get(field_, 0.0), test) or hosts is not None:
                return self._metric_all(field_, at, hosts, test)
            return _wrap("vector", self._metric_rows(field_, at, None, test, {},
                                                     faulty_only=True))
        self.unknown += 1
        return _wrap("vector", [])

    def _freshness(self, at: float, hosts: re.Pattern[str] | None,
                   per_node: bool = False) -> bytes:
        f = self.fleet
        ts = f"{at:.3f}".encode()
        if per_node:  # the newest heartbeat and the count of fresh GPUs, per node
            out = []
            for i in range(f.nodes):
                name = f.names[i]
                if hosts is not None and not hosts.fullmatch(name):
                    continue
                base = {"Hostname": name, "instance": f.instance(i)}
                last = _fmt(self._last_scrape(at, f.offset(i))).encode()
                out.append(b'{"metric":' + json.dumps(base | {"healer_fresh": "newest"})
                           .encode() + b',"value":[' + ts + b',"' + last + b'"]}')
                out.append(b'{"metric":' + json.dumps(base | {"healer_fresh": "gpus"})
                           .encode() + b',"value":[' + ts + b',"%d"]}' % f.gpus)
            return _wrap("vector", out)
        rows = [i for i in range(f.nodes) if hosts is None or hosts.fullmatch(f.names[i])]
        dyn = [b'{"metric":' + json.dumps(_labels_grouped(f, i, g)).encode()
               + b',"value":[' + ts + b',"' + _fmt(self._last_scrape(at, f.offset(i)))
               .encode() + b'"]}' for i in rows if hosts is not None or i not in self._healthy
               for g in range(f.gpus)]
        if hosts is not None:
            return _wrap("vector", dyn)
        table = {b"T": ts}
        for o in range(int(SCRAPE)):
            table[b"F%d" % o] = _fmt(self._last_scrape(at, o)).encode()
        return self._body("vector", self._fill(self._template("fresh"), table), dyn)

    def _value(self, name: str, g: int, field_: str) -> float:
        f = self.fleet
        if g == 1 and name in f.ecc_nodes and "ECC_DBE" in field_:
            return 1.0
        if g == 2 and name in f.hot_nodes and field_ == "DCGM_FI_DEV_GPU_TEMP":
            return 93.0
        return HEALTHY.get(field_, 0.0)

    def _metric_rows(self, field_: str, at: float, hosts: re.Pattern[str] | None,
                     test: tuple[str, float] | None, extra: Mapping[str, str], *,
                     faulty_only: bool = False) -> list[bytes]:
        f = self.fleet
        ts = f"{at:.3f}".encode()
        rows = self._faulty() if faulty_only else range(f.nodes)
        out = []
        for i in rows:
            name = f.names[i]
            if hosts is not None and not hosts.fullmatch(name):
                continue
            for g in range(f.gpus):
                v = self._value(name, g, field_)
                if test is not None and not _passes(v, test):
                    continue
                out.append(b'{"metric":' + json.dumps(_labels_grouped(f, i, g) | dict(extra))
                           .encode() + b',"value":[' + ts + b',"' + _fmt(v).encode() + b'"]}')
        return out

    def _metric_all(self, field_: str, at: float, hosts: re.Pattern[str] | None,
                    test: tuple[str, float] | None) -> bytes:
        if hosts is not None or (test is not None
                                 and not _passes(HEALTHY.get(field_, 0.0), test)):
            return _wrap("vector", self._metric_rows(field_, at, hosts, test, {}))
        ts = f"{at:.3f}".encode()
        dyn = self._metric_rows(field_, at, None, test, {}, faulty_only=True)
        body = self._fill(self._template(f"metric:{field_}"), {b"T": ts})
        return self._body("vector", body, dyn)

    def _xid_prequery(self, expr: str, at: float, hosts: re.Pattern[str] | None) -> bytes:
        f = self.fleet
        ts = f"{at:.3f}".encode()
        # the first poll asks for every GPU with a non-zero XID; later polls only for those
        # whose XID series changed within the window (as Prometheus would answer)
        first = " offset " not in expr
        w = re.search(r"\[(\d+)(ms|s|m|h|d)\]", expr)
        window = float(w.group(1)) * _UNITS[w.group(2)] if w else 0.0
        changed = at - window < f.fault_at
        out = []
        for i in self._faulty():
            name = f.names[i]
            if name in f.xid_nodes and at >= f.fault_at and (first or changed) and (
                    hosts is None or hosts.fullmatch(name)):
                out.append(b'{"metric":' + json.dumps(_labels_grouped(f, i, 3)).encode()
                           + b',"value":[' + ts + b',"79"]}')
        return _wrap("vector", out)

    def _xid_raw(self, expr: str, at: float, hosts: re.Pattern[str] | None) -> bytes:
        n = max(1, int(window_seconds(expr) // SCRAPE))
        if hosts is not None:
            rows = [i for i in range(self.fleet.nodes) if hosts.fullmatch(self.fleet.names[i])]
            return _wrap("matrix", self._xid_rows(at, n, rows))
        xt: dict[bytes, bytes] = {}
        for o in range(int(SCRAPE)):
            last = self._last_scrape(at, o)
            for k in range(n):
                xt[b"S%d_%d" % (o, k)] = _fmt(last - (n - 1 - k) * SCRAPE).encode()
        body = self._fill(self._template(f"xid:{n}"), xt)
        return self._body("matrix", body, self._xid_rows(at, n, self._faulty()))

    def _faulty(self) -> list[int]:
        return [i for i in range(self.fleet.nodes) if i not in self._healthy]

    def _xid_rows(self, at: float, n: int, rows: Sequence[int]) -> list[bytes]:
        f = self.fleet
        out = []
        for i in rows:
            name = f.names[i]
            last = self._last_scrape(at, f.offset(i))
            times = [last - (n - 1 - k) * SCRAPE for k in range(n)]
            for g in range(f.gpus):
                bad = name in f.xid_nodes and g == 3
                gauge = [(t, 79.0 if bad and t >= f.fault_at else 0.0) for t in times]
                count = [(t, 1.0 if bad and t >= f.fault_at else 0.0) for t in times]
                code = "79" if bad and times[-1] >= f.fault_at else "0"
                for metric, extra, vals in (
                        (XID_GAUGE, {"err_code": code, "err_msg": "GPU has fallen off the bus"
                                     if code == "79" else "No Error"}, gauge),
                        (XID_COUNT, {"window_size_in_ms": "300000"}
                         | ({"xid": "79"} if bad else {}), count)):
                    lab = _labels_raw(f, i, g, metric) | extra
                    pts = ",".join(f'[{_fmt(t)},"{_fmt(v)}"]' for t, v in vals)
                    out.append(b'{"metric":' + json.dumps(lab).encode() + b',"values":['
                               + pts.encode() + b"]}")
        return out

    @staticmethod
    def _last_scrape(at: float, offset: int) -> float:
        base = (at - offset) // SCRAPE * SCRAPE + offset
        return base - SCRAPE if base > at else base

    @staticmethod
    def _body(kind: str, healthy: bytes, dyn: list[bytes]) -> bytes:
        parts = [healthy] if healthy else []
        parts.extend(dyn)
        return _wrap(kind, parts)


def _host_filter(expr: str) -> re.Pattern[str] | None:
    """The host regex matcher of ``expr`` (``Hostname=~"a|b"``), if any."""
    m = _HOSTS.search(expr)
    if m is None:
        return None
    return re.compile(m.group(1).encode().decode("unicode_escape"))


def _passes(v: float, test: tuple[str, float]) -> bool:
    op, t = test
    return {">": v > t, ">=": v >= t, "<": v < t, "<=": v <= t, "==": v == t,
            "!=": v != t}[op]


def _fmt(v: float) -> str:
    return str(int(v)) if v == int(v) and abs(v) < 1e15 else repr(float(v))


def make_app(answers: Answers) -> web.Application:
    async def query(request: web.Request) -> web.Response:
        params = dict(request.query)
        if request.method == "POST":
            params.update({k: str(v) for k, v in (await request.post()).items()})
        body = answers.answer(params.get("query", ""), float(params.get("time", "0")))
        return web.Response(body=body, content_type="application/json")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("GET", "/api/v1/query", query)
    app.router.add_route("POST", "/api/v1/query", query)
    return app
