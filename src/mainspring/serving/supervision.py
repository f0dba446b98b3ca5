"""Local child processes kept running: a device's worker, a frontend process, a cell. One that exits (a
crash, the OOM killer) is started again after a backoff that doubles with each restart in the last
minute, and at most ``max_restarts_per_minute`` times a minute."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("mainspring.serve")

RESTART_BACKOFF_S = (0.5, 30.0)  # first delay, longest delay
EXITED, RESTARTED = "exited", "restarted"  # what ``LocalWorker.look`` saw


@dataclass
class LocalWorker:
    """A child process this server keeps running (a device's worker, or a frontend), and when it was restarted."""

    name: str
    command: list[str]
    process: subprocess.Popen[bytes]
    restarts: deque[float] = field(default_factory=deque)  # monotonic times, the last minute's
    restart_at: float | None = None  # when the next start is due, once the process has exited

    def restarts_in_last_minute(self, now: float) -> int:
        while self.restarts and now - self.restarts[0] > 60.0:
            self.restarts.popleft()
        return len(self.restarts)

    def restart_delay(self, now: float, max_per_minute: int) -> float | None:
        """How long to wait before starting it again: a backoff that doubles with each restart in the last
        minute, and past ``max_per_minute`` until the oldest leaves the minute; None: never (0 a minute)."""
        if max_per_minute == 0:
            return None
        recent = self.restarts_in_last_minute(now)
        first, longest = RESTART_BACKOFF_S
        delay: float = min(longest, first * 2.0**recent)
        if recent >= max_per_minute:
            delay = max(delay, 60.0 - (now - self.restarts[0]))
        return delay

    def look(self, now: float, max_per_minute: int, env: Callable[[], dict[str, str]], label: str = "") -> str | None:
        """One look at the process: ``EXITED`` when its exit is first seen (a restart is then due after
        ``restart_delay``, or never), ``RESTARTED`` when it is started again, else None."""
        code = self.process.poll()
        if code is None:
            return None
        what = f"{label}{self.name}"
        if self.restart_at is None:
            delay = self.restart_delay(now, max_per_minute)
            if delay is None:
                log.error("%s exited with code %s; not restarting it", what, code)
                self.restart_at = float("inf")
            else:
                self.restart_at = now + delay
                log.warning("%s exited with code %s; starting it again in %.1f s (%d restart(s) in the last "
                            "minute)", what, code, delay, len(self.restarts))  # fmt: skip
            return EXITED
        if now < self.restart_at:
            return None
        self.restart_at = None
        self.restarts.append(now)
        self.process = subprocess.Popen(self.command, env=env())
        log.info("%s started again (pid %d)", what, self.process.pid)
        return RESTARTED


@dataclass
class Flock:
    """Children started alike: the environment each is started again with, a label for the log, and what
    to count when one is started again."""

    children: list[LocalWorker]
    env: Callable[[], dict[str, str]]
    label: str = ""
    on_restart: Callable[[], None] | None = None


class Supervisor:
    """Looks at every child of its flocks every ``period_s`` and starts again those that exited."""

    def __init__(self, max_restarts_per_minute: int, stopping: asyncio.Event, period_s: float = 0.2) -> None:
        self.max_restarts_per_minute = max_restarts_per_minute
        self.flocks: list[Flock] = []
        self._stopping = stopping  # set: the processes are ending on purpose
        self._period_s = period_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start looking, once, if there is any child to keep."""
        if self._task is None and any(flock.children for flock in self.flocks):
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while not self._stopping.is_set():
            await asyncio.sleep(self._period_s)
            if self._stopping.is_set():  # set while this slept: the processes are ending on purpose
                return
            now = time.monotonic()
            for flock in self.flocks:
                for child in flock.children:
                    restarted = child.look(now, self.max_restarts_per_minute, flock.env, flock.label) == RESTARTED
                    if restarted and flock.on_restart is not None:
                        flock.on_restart()


async def wait_for_exit(
    process: subprocess.Popen[bytes],
    wait_s: float,
    then: Callable[[subprocess.Popen[bytes]], None],
    then_wait_s: float | None = None,
) -> None:
    """Wait up to ``wait_s`` for ``process`` to end; past that, ``then`` (terminate or kill) it, and wait
    up to ``then_wait_s`` more when given."""
    try:
        await asyncio.to_thread(process.wait, wait_s)
    except subprocess.TimeoutExpired:
        then(process)
        if then_wait_s is not None:
            await asyncio.to_thread(process.wait, then_wait_s)
