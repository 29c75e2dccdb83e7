"""A simulated node-exporter InfiniBand collector, served beside the simulated DCGM exporter.

node-exporter's ``infiniband`` collector reads ``/sys/class/infiniband/<device>/ports/<port>``
and exports, per HCA port (labels ``device`` and ``port``):

* ``node_infiniband_state_id``: the logical port state (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE,
  5 ACTIVE_DEFER);
* ``node_infiniband_physical_state_id``: the physical state (2 Polling, 3 Disabled, 5 LinkUp,
  6 LinkErrorRecovery, ...);
* ``node_infiniband_link_downed_total``: how often the link error recovery failed and the link
  went down;
* ``node_infiniband_symbol_error_total``: minor link errors on the physical lanes.

:class:`InfinibandSim` renders those series for each simulated node as a pure function of its
faults and the clock, with a node label (``node`` by default: what a scrape config's
relabelling adds; node-exporter itself names no node). Faults (:class:`IbFaultKind`):

* ``port_down``: the port is DOWN and its physical link Disabled; ``link_downed`` rises by one
  when it starts;
* ``flapping``: the logical state bounces between ACTIVE and INIT every ``period`` seconds (the
  port re-initialises: the subnet manager sweeps it again) while the physical link stays up, so
  ``link_downed`` does not move; a flap that takes the physical link down is ``port_down``;
* ``symbol_errors``: the symbol error counter rises by ``rate`` per second.

A cleared fault leaves its counter increments behind (counters never go back). Attach the sim
to a :class:`~healer_dev.sim.dcgm.DcgmSim` (:meth:`InfinibandSim.attach`) and every simulated
exporter's ``/metrics`` serves its node's InfiniBand series too.
"""

from __future__ import annotations

import enum
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from healer_dev.sim.dcgm import DcgmSim

STATE = "node_infiniband_state_id"
PHYSICAL_STATE = "node_infiniband_physical_state_id"
LINK_DOWNED = "node_infiniband_link_downed_total"
SYMBOL_ERRORS = "node_infiniband_symbol_error_total"

ACTIVE, INIT, DOWN = 4, 2, 1  # logical port states
LINK_UP, DISABLED = 5, 3  # physical port states
#: Two HCAs with one port each, as on a typical GPU node's compute fabric.
DEFAULT_PORTS = (("mlx5_0", "1"), ("mlx5_1", "1"))

_HELP = {
    STATE: ("gauge", "State of the InfiniBand port (0: no change, 1: down, 2: init, "
                     "3: armed, 4: active, 5: act defer)"),
    PHYSICAL_STATE: ("gauge", "Physical state of the InfiniBand port (0: no state change, "
                              "1: sleep, 2: polling, 3: disable, 4: shift, 5: port up, "
                              "6: link error recovery, 7: phytest)"),
    LINK_DOWNED: ("counter", "Number of times the link failed to recover from an error state "
                             "and went down"),
    SYMBOL_ERRORS: ("counter", "Number of minor link errors detected on one or more physical "
                               "lanes."),
}


class IbFaultKind(enum.Enum):
    PORT_DOWN = "port_down"
    FLAPPING = "flapping"
    SYMBOL_ERRORS = "symbol_errors"


@dataclass(frozen=True, slots=True)
class IbFault:
    """One fault on one HCA port from ``at`` (absolute; None: when injected)."""

    node: str
    kind: IbFaultKind
    device: str = "mlx5_0"
    port: str = "1"
    at: float | None = None
    period: float = 2.0  # flapping: seconds in each state
    rate: float = 1.0  # symbol_errors: errors per second
    id: str = ""

    def validate(self) -> None:
        if not (math.isfinite(self.period) and self.period > 0):
            raise ValueError(f"period must be a positive number of seconds, not {self.period}")
        if not (math.isfinite(self.rate) and self.rate >= 0):
            raise ValueError(f"rate must be a non-negative number, not {self.rate}")


@dataclass(frozen=True, slots=True)
class PortReading:
    state: int
    physical_state: int
    link_downed: float
    symbol_errors: float


class InfinibandSim:
    """The InfiniBand series of a simulated fleet; thread-safe (see the module)."""

    def __init__(self, nodes: Iterable[str], *, ports: Sequence[tuple[str, str]] = DEFAULT_PORTS,
                 node_label: str = "node", clock: Callable[[], float] = time.time) -> None:
        self.nodes = tuple(nodes)
        self.ports = tuple(ports)
        self.node_label = node_label
        self.clock = clock
        self._lock = threading.Lock()
        self._faults: list[IbFault] = []
        self._ids = itertools.count(1)
        # (node, device, port) → counter increments of cleared faults
        self._base: dict[tuple[str, str, str], tuple[float, float]] = {}

    def attach(self, sim: DcgmSim) -> InfinibandSim:
        """Serve these series from ``sim``'s exporters too; returns self."""
        unknown = [n for n in self.nodes if n not in sim.nodes]
        if unknown:
            raise ValueError(f"not nodes of the DCGM simulator: {', '.join(unknown)}")
        sim.collectors.append(self.render)
        return self

    # -- faults ---------------------------------------------------------------------------

    def inject(self, fault: IbFault) -> IbFault:
        """Add ``fault`` (starting now unless ``at`` says when); returns it with its id."""
        if fault.node not in self.nodes:
            raise ValueError(f"unknown node {fault.node!r}")
        if (fault.device, fault.port) not in self.ports:
            raise ValueError(f"{fault.node} has no HCA port {fault.device} {fault.port}")
        fault.validate()
        with self._lock:
            stored = replace(fault, id=f"ib-{next(self._ids)}",
                             at=self.clock() if fault.at is None else fault.at)
            self._faults.append(stored)
        return stored

    def clear(self, fault_id: str | None = None, *, node: str | None = None) -> list[IbFault]:
        """End one fault (by id), a node's, or all; their counter increments stay."""
        t = self.clock()
        with self._lock:
            ended = [f for f in self._faults if (fault_id is None or f.id == fault_id)
                     and (node is None or f.node == node)]
            for f in ended:
                key = (f.node, f.device, f.port)
                downed, errors = self._base.get(key, (0.0, 0.0))
                d, e = _increments(f, t)
                self._base[key] = (downed + d, errors + e)
                self._faults.remove(f)
        return ended

    @property
    def faults(self) -> list[IbFault]:
        with self._lock:
            return list(self._faults)

    # -- readings -------------------------------------------------------------------------

    def reading(self, node: str, device: str, port: str, t: float) -> PortReading:
        """One port's four values at ``t``."""
        with self._lock:
            faults = [f for f in self._faults if f.node == node and f.device == device
                      and f.port == port and f.at is not None and f.at <= t]
            downed, errors = self._base.get((node, device, port), (0.0, 0.0))
        state, physical = ACTIVE, LINK_UP
        for f in faults:
            d, e = _increments(f, t)
            downed += d
            errors += e
            if f.kind is IbFaultKind.PORT_DOWN:
                state, physical = DOWN, DISABLED
            elif f.kind is IbFaultKind.FLAPPING and state != DOWN:
                assert f.at is not None
                if int((t - f.at) // f.period) % 2 == 1:
                    state = INIT
        return PortReading(state, physical, downed, errors)

    def render(self, node: str, t: float | None = None) -> str:
        """node-exporter's text for ``node``'s ports at ``t`` ("" for a node not simulated)."""
        if node not in self.nodes:
            return ""
        t = self.clock() if t is None else t
        readings = [(d, p, self.reading(node, d, p, t)) for d, p in self.ports]
        out: list[str] = []
        for name, (typ, text) in _HELP.items():
            out.append(f"# HELP {name} {text}")
            out.append(f"# TYPE {name} {typ}")
            for device, port, r in readings:
                value = {STATE: r.state, PHYSICAL_STATE: r.physical_state,
                         LINK_DOWNED: r.link_downed, SYMBOL_ERRORS: r.symbol_errors}[name]
                out.append(f'{name}{{device="{device}",{self.node_label}="{node}",'
                           f'port="{port}"}} {_number(value)}')
        return "\n".join(out) + "\n"


def _increments(f: IbFault, t: float) -> tuple[float, float]:
    """(link_downed, symbol errors) that ``f`` added by ``t``."""
    if f.at is None or t < f.at:
        return 0.0, 0.0
    if f.kind is IbFaultKind.PORT_DOWN:
        return 1.0, 0.0
    if f.kind is IbFaultKind.SYMBOL_ERRORS:
        return 0.0, float(math.floor((t - f.at) * f.rate))
    return 0.0, 0.0


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(float(value))
