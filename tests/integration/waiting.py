"""Poll a condition against a deadline (never a fixed sleep to "let things settle")."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_for(
    predicate: Callable[[], Awaitable[T] | T],
    timeout: float = 30.0,  # noqa: ASYNC109 (a deadline for the polling, not an I/O timeout)
    interval: float = 0.2,
    *,
    description: str | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``predicate`` (sync or async) until it returns something truthy, and return that.

    Exceptions of the types in ``ignore`` count as "not yet" (the last one is reported); any
    other exception propagates. After ``timeout`` seconds raises :class:`TimeoutError` naming
    ``description`` (default: the predicate's name) and the last result or error seen.
    """
    what = description or getattr(predicate, "__qualname__", None) or repr(predicate)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: object = None
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
        except ignore as e:
            last_error = e
        else:
            if result:
                return result  # type: ignore[return-value]
            last = result
        if loop.time() >= deadline:
            detail = f"last result {last!r}"
            if last_error is not None:
                detail += f", last error {last_error!r}"
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what} ({detail})")
        await asyncio.sleep(interval)
