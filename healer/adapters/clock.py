"""The real :class:`~healer.ports.Clock`: wall time and asyncio's sleep.

The composition root wires :data:`SYSTEM_CLOCK` into the runtime; adapters take a ``Clock``
in their constructor and default to it. Tests use ``ManualClock`` instead.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["SYSTEM_CLOCK", "SystemClock"]


class SystemClock:
    """``now()``: seconds since the epoch (``time.time``); ``sleep``: ``asyncio.sleep``."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


#: The one real clock.
SYSTEM_CLOCK = SystemClock()
