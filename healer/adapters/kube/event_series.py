"""Repeated Events folded into one, the way Kubernetes' own recorder does (``events.k8s.io/v1``
``series``): the bookkeeping, with no I/O and no clock (``now`` is passed in).

The first occurrence of an Event is written as it is. An *isomorphic* one (the same series key:
the same object, reason, type, action and what happened, whatever the time) that comes while
the series is open updates that Event instead: ``series.count`` and ``series.lastObservedTime``.
Those updates are written on a back-off, never once per occurrence: the first repeat at once
(the count 2 says "this repeats"), then after :attr:`SeriesPolicy.first` seconds, doubling up to
:attr:`SeriesPolicy.cap`; occurrences in between only raise the count in memory. A series that
has seen nothing for :attr:`SeriesPolicy.finish` seconds ends: its last count is written if it
was not yet, and the next occurrence starts a new Event. So a crash loop of 100 XIDs in 45 s on
one GPU is one create and a handful of updates (see the unit tests for the count), and a steady
repeat costs at most one write per ``cap``.

What is held is bounded (:attr:`SeriesPolicy.max_series`; the least recently seen series is
ended first), so nothing grows with uptime.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SeriesPolicy:
    first: float = 10.0
    """Seconds between the first series update (count 2, at once) and the next one."""
    cap: float = 1800.0
    """The longest wait between two updates of an open series (client-go: 30 min)."""
    finish: float = 360.0
    """A series with no occurrence for this long is over (client-go: 6 min)."""
    max_series: int = 4096
    """Open series kept at most (the least recently seen one is ended first)."""


@dataclass(slots=True)
class Series:
    """One open series: the Event it updates and what was written of it."""

    key: str
    name: str
    """The Event's object name (its first occurrence's)."""
    count: int
    last_observed: float
    written_count: int
    """The count the API holds (1: only the create was written)."""
    next_write: float
    """No update is written before this time."""
    interval: float
    """The back-off after the next update."""

    @property
    def dirty(self) -> bool:
        return self.count > self.written_count


@dataclass(frozen=True, slots=True)
class Occurrence:
    """What one occurrence asks for: ``create`` a new Event, or ``update`` ``series`` now, or
    nothing yet (the count was raised in memory, an update comes later)."""

    create: bool
    update: Series | None = None


class EventSeries:
    """The open series, by series key (see the module doc)."""

    def __init__(self, policy: SeriesPolicy | None = None) -> None:
        self.policy = policy or SeriesPolicy()
        self._open: OrderedDict[str, Series] = OrderedDict()
        #: series that ended with an unwritten count (their final update is due)
        self._ended: list[Series] = []

    def __len__(self) -> int:
        return len(self._open)

    def open_series(self, key: str) -> Series | None:
        """The open series ``key`` ("": none), if any."""
        return self._open.get(key) if key else None

    def observe(self, key: str, name: str, now: float) -> Occurrence:
        """An occurrence of series ``key`` whose Event would be named ``name``."""
        self.expire(now)
        s = self._open.get(key)
        if s is None:
            if len(self._open) >= self.policy.max_series:
                _, oldest = self._open.popitem(last=False)
                if oldest.dirty:
                    self._ended.append(oldest)
            self._open[key] = Series(key, name, 1, now, 1, now, self.policy.first)
            return Occurrence(create=True)
        self._open.move_to_end(key)
        s.count += 1
        s.last_observed = now
        return Occurrence(create=False, update=s if now >= s.next_write else None)

    def written(self, s: Series, count: int, now: float) -> None:
        """The update of ``s`` with ``count`` was written at ``now``: back off."""
        s.written_count = max(s.written_count, count)
        s.next_write = now + s.interval
        s.interval = min(s.interval * 2, self.policy.cap)

    def forget(self, key: str) -> None:
        """The series' Event is gone (deleted, expired in the API): the next one creates."""
        self._open.pop(key, None)

    def expire(self, now: float) -> None:
        """End the series that saw nothing for ``finish`` seconds."""
        while self._open:
            key, s = next(iter(self._open.items()))
            if now - s.last_observed < self.policy.finish:
                break
            del self._open[key]
            if s.dirty:
                self._ended.append(s)

    def due(self, now: float) -> list[Series]:
        """The updates to write now: ended series with an unwritten count, and open ones whose
        back-off has passed with occurrences not yet written."""
        self.expire(now)
        out, self._ended = self._ended, []
        out += [s for s in self._open.values() if s.dirty and now >= s.next_write]
        return out

    def next_due(self, now: float) -> float | None:
        """When :meth:`due` next has something (None: nothing pending)."""
        if self._ended:
            return now
        times = [max(s.next_write, now) for s in self._open.values() if s.dirty]
        ends = [s.last_observed + self.policy.finish for s in self._open.values() if s.dirty]
        return min(times + ends) if times or ends else None


class WriteBudget:
    """A token bucket for writes: ``burst`` at once, then one more every ``every`` seconds
    (``now`` passed in). The node agent bounds its Event writes per node with one."""

    def __init__(self, burst: int, every: float) -> None:
        self.burst = burst
        self.every = every
        self._tokens = float(burst)
        self._at: float | None = None

    def take(self, now: float) -> bool:
        """Spend one write if there is one."""
        if self._at is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) / self.every)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def next_in(self, now: float) -> float:
        """Seconds until a write is available again."""
        if self._at is None or self._tokens >= 1.0:
            return 0.0
        have = min(float(self.burst), self._tokens + (now - self._at) / self.every)
        return max(0.0, (1.0 - have) * self.every)
