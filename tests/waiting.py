"""Waiting for something to happen, not for time to pass: poll a condition until it holds, failing only
after a generous timeout (a busy CI machine is slow, and a passing run waits no longer than it must)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], timeout_s: float = 60.0, every_s: float = 0.05) -> None:
    """Return once ``condition()`` is true; ``AssertionError`` if it is still false after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout_s} s: {condition}")
        time.sleep(every_s)


async def until(condition: Callable[[], object], timeout_s: float = 60.0, every_s: float = 0.02) -> None:
    """``wait_for`` on an event loop: the loop keeps running while ``condition`` is polled (a coroutine
    function's result is awaited)."""
    deadline = time.monotonic() + timeout_s
    while not await _value(condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout_s} s: {condition}")
        await asyncio.sleep(every_s)


async def _value(result: object) -> object:
    return await result if inspect.isawaitable(result) else result
