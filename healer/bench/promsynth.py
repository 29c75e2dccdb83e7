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

from healer.adapters.prometheus import XID_COUNT, XID_GAUGE, PrometheusSource
from healer.sim.dcgm import gpu_uuid

SCRAPE = 15.0
MODEL = "NVIDIA H100 80GB HBM3"
DRIVER = "550.54.15"
#: healthy values of the fields the default policies read (0 for counters' increase/rate)
HEALTHY = {"DCGM_FI_DEV_GPU_TEMP": 48.0}
_TOKEN = re.compile(rb"@(\w+)@")
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

    def __init__(self, fleet: Fleet, source: PrometheusSource) -> None:
        self.fleet = fleet
        self.freshness = source.freshness_query
        self.metrics = {q.expr: q for q in source.plan.metrics}
        self._fields = {q.expr: self._field_of(q.expr) for q in source.plan.metrics}
        self._healthy = {i for i, n in enumerate(fleet.names)
                         if n not in fleet.xid_nodes | fleet.ecc_nodes | fleet.hot_nodes}
        self._templates: dict[str, bytes] = {}
        self.requests = 0

    @staticmethod
    def _field_of(expr: str) -> str:
        m = re.search(r"(DCGM_[A-Z0-9_]+)", expr)
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
        self.requests += 1
        f = self.fleet
        ts = f"{at:.3f}".encode()
        if expr == self.freshness:
            table = {b"T": ts}
            for o in range(int(SCRAPE)):
                table[b"F%d" % o] = _fmt(self._last_scrape(at, o)).encode()
            dyn = [b'{"metric":' + json.dumps(_labels_grouped(f, i, g)).encode()
                   + b',"value":[' + ts + b',"' + _fmt(self._last_scrape(at, f.offset(i)))
                   .encode() + b'"]}' for i in self._faulty() for g in range(f.gpus)]
            return self._body("vector", self._fill(self._template("fresh"), table), dyn)
        if expr in self.metrics:
            field_ = self._fields[expr]
            dyn = []
            for i in self._faulty():
                name = f.names[i]
                for g in range(f.gpus):
                    v = HEALTHY.get(field_, 0.0)
                    if g == 1 and name in f.ecc_nodes and "ECC_DBE" in field_:
                        v = 1.0
                    if g == 2 and name in f.hot_nodes and field_ == "DCGM_FI_DEV_GPU_TEMP":
                        v = 93.0
                    dyn.append(b'{"metric":' + json.dumps(_labels_grouped(f, i, g)).encode()
                               + b',"value":[' + ts + b',"' + _fmt(v).encode() + b'"]}')
            body = self._fill(self._template(f"metric:{field_}"), {b"T": ts})
            return self._body("vector", body, dyn)
        if XID_GAUGE in expr:
            window = window_seconds(expr)
            n = max(1, int(window // SCRAPE))
            xt: dict[bytes, bytes] = {}
            for o in range(int(SCRAPE)):
                last = self._last_scrape(at, o)
                for k in range(n):
                    xt[b"S%d_%d" % (o, k)] = _fmt(last - (n - 1 - k) * SCRAPE).encode()
            body = self._fill(self._template(f"xid:{n}"), xt)
            return self._body("matrix", body, self._xid_faulty(at, n))
        return _wrap("vector", [])

    def _faulty(self) -> list[int]:
        return [i for i in range(self.fleet.nodes) if i not in self._healthy]

    def _xid_faulty(self, at: float, n: int) -> list[bytes]:
        f = self.fleet
        out = []
        for i in self._faulty():
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
