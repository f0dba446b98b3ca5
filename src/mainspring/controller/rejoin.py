"""How long a worker dropped for misbehaving (an action that never reported, a malformed result or
message) must stay away: a backoff that doubles with each drop up to a cap, and starts over once the
worker has gone a quiet period without one. Until it runs out the worker's hellos go unanswered, so a
worker that hangs again at once holds requests for one round, not round after round."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

FIRST_S, LONGEST_S = 1.0, 60.0  # the first drop's backoff; doubling, at most this
QUIET_S = 300.0  # a worker not dropped for this long starts again at FIRST_S


@dataclass
class _Drops:
    count: int  # drops in a row, none more than QUIET_S after the one before
    last: float  # monotonic time of the last drop
    until: float  # when the worker may join again
    deferred: int = 0  # hellos ignored since the last drop


class RejoinBackoff:
    """The backoff of each dropped worker, by the name it says hello with."""

    def __init__(
        self,
        first_s: float = FIRST_S,
        longest_s: float = LONGEST_S,
        quiet_s: float = QUIET_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._first_s, self._longest_s, self._quiet_s = first_s, longest_s, quiet_s
        self._clock = clock
        self._drops: dict[str, _Drops] = {}

    def dropped(self, name: str) -> float:
        """Worker ``name`` was dropped now: the backoff it gets, in seconds."""
        now = self._clock()
        self._forget_quiet(now)
        before = self._drops.get(name)
        count = before.count + 1 if before is not None else 1
        delay = min(self._longest_s, self._first_s * 2.0 ** (count - 1))
        self._drops[name] = _Drops(count, now, now + delay)
        return delay

    def wait_s(self, name: str) -> tuple[float, bool]:
        """How long worker ``name`` must still stay away (0: it may join now), and whether this is the
        first hello it is turned away since its drop (the one worth a log line)."""
        drops = self._drops.get(name)
        if drops is None:
            return 0.0, False
        left = drops.until - self._clock()
        if left <= 0:
            return 0.0, False
        drops.deferred += 1
        return left, drops.deferred == 1

    def _forget_quiet(self, now: float) -> None:
        """Workers not dropped for ``quiet_s`` start over (and the table stays as small as the trouble)."""
        for name in [n for n, d in self._drops.items() if now - d.last > self._quiet_s]:
            del self._drops[name]
