"""A worker's clock offset and round-trip time, from ping/pong timestamps.

As Clockwork: keep a sliding window of samples and trust the one with the smallest round
trip (its midpoint is closest to the moment the worker read its clock). Offsets translate
action windows into the worker's clock and result timings back.
"""

from __future__ import annotations

from collections import deque


class ClockSync:
    def __init__(self, window: int = 32) -> None:
        self._samples: deque[tuple[int, int]] = deque(maxlen=window)  # (round trip, offset)
        self.offset_ns = 0
        self.rtt_ns: int | None = None

    def observe(self, sent_ns: int, worker_ns: int, received_ns: int) -> None:
        """A pong: ping sent at ``sent_ns`` (controller), worker clock read ``worker_ns``, back at ``received_ns``."""
        rtt = received_ns - sent_ns
        if rtt < 0:
            return
        self._samples.append((rtt, worker_ns - (sent_ns + received_ns) // 2))
        self.rtt_ns, self.offset_ns = min(self._samples)

    def to_worker(self, controller_ns: int) -> int:
        return controller_ns + self.offset_ns

    def to_controller(self, worker_ns: int) -> int:
        return worker_ns - self.offset_ns
