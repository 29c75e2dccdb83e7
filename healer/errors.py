"""healer's own error tree. Adapters translate library errors into these at the boundary.

::

    HealerError
    ├── TransientError(delay)      retry later (timeouts, 409 conflicts, 429, 5xx, connection loss)
    │   └── ConflictError          a write lost an optimistic-concurrency race (HTTP 409)
    ├── PermanentError             retrying cannot help (403, 404 of a required object, 422)
    │   ├── NotFoundError
    │   └── ForbiddenError
    ├── PolicyError(problems)      a policy file is invalid; every problem names file:line and field
    │   └── PolicyLoadError(kind)  the loader ran out of time or memory, or crashed
    └── ConfigError                bad settings or a missing component at start-up

Only :class:`TransientError` is retried, honouring its ``delay`` (see
:mod:`healer.adapters.retry`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class HealerError(Exception):
    """Base of every error healer raises on purpose."""


class TransientError(HealerError):
    """A failure that may go away: retry after ``delay`` seconds (a server's Retry-After) when
    given, else after the retry policy's backoff."""

    def __init__(self, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class ConflictError(TransientError):
    """An optimistic-concurrency precondition failed; re-read and retry."""


class PermanentError(HealerError):
    """A failure that retrying will not fix."""


class NotFoundError(PermanentError):
    pass


class ForbiddenError(PermanentError):
    pass


class ConfigError(HealerError):
    """Invalid settings, or a component healer needs is absent."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a policy file."""

    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        if self.field:
            return f"{where}: {self.field}: {self.message}"
        return f"{where}: {self.message}"


class PolicyError(HealerError):
    """One or more policy files are invalid. Nothing from them was applied."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class PolicyLoadError(PolicyError):
    """Loading the policies failed for a reason other than their content being invalid: the
    isolated loader ran out of its time (``kind="timeout"``) or memory (``"memory"``) budget,
    or died (``"crash"``). Nothing from the files was applied."""

    def __init__(self, kind: str, where: str, message: str) -> None:
        self.kind = kind
        super().__init__([Problem(where, 0, "", message)])
