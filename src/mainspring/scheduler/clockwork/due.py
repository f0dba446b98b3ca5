"""Devices by when one of their lanes frees: the ones due within the horizon, and the next to come due.

A scheduling pass used to visit every device to find the few whose lane frees within the
horizon, and again to find the next wake-up; with 150 devices that was most of a pass. Here a
heap holds (free time, device) entries, pushed whenever a lane's predicted free time moves (or
the device starts to want planning); entries that no longer match their lane are skipped when
reached. The devices found due are kept, in device order, until their lane moves past the
horizon: a pass plans exactly the devices a scan of all of them would, in the same order.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from mainspring.scheduler.clockwork.tracker import DeviceState
from mainspring.scheduler.lanes import NEVER, LaneTracker


def always(device: DeviceState) -> bool:
    return True


class DueDevices:
    """The devices whose ``lane`` frees by a time and that ``wanted`` says need planning."""

    def __init__(self, lane: Callable[[DeviceState], LaneTracker], wanted: Callable[[DeviceState], bool]) -> None:
        self._lane = lane
        self._wanted = wanted
        self._heap: list[tuple[int, int, DeviceState]] = []  # (free time, device order, device)
        self._due: dict[int, DeviceState] = {}  # device order -> device, lane free by the last limit

    def moved(self, device: DeviceState) -> None:
        """The device's lane moved, or it started to want planning."""
        heapq.heappush(self._heap, (self._lane(device).free_ns, device.order, device))

    def _valid(self, free_ns: int, device: DeviceState) -> bool:
        return not device.removed and self._lane(device).free_ns == free_ns and self._wanted(device)

    def _still_due(self, device: DeviceState, limit_ns: int) -> bool:
        """Is a device kept in ``_due`` still due by ``limit_ns``? If not, its lane moved away (a newer
        entry waits in the heap) or it no longer wants planning, and it leaves ``_due``."""
        return not device.removed and self._wanted(device) and self._lane(device).free_ns <= limit_ns

    def due(self, limit_ns: int) -> list[DeviceState]:
        """Devices that want planning and whose lane frees by ``limit_ns``, in device order."""
        heap, due = self._heap, self._due
        while heap and heap[0][0] <= limit_ns:
            free_ns, order, device = heapq.heappop(heap)
            if self._valid(free_ns, device):
                due[order] = device
        found = []
        for order in sorted(due):
            device = due[order]
            if self._still_due(device, limit_ns):
                found.append(device)
            else:
                del due[order]
        return found

    def any_due(self, limit_ns: int) -> bool:
        """Whether ``due(limit_ns)`` would find a device, without listing them: while most lanes are
        idle every device is due, and the load planner, which asks on every pass, mostly has
        nothing to load (listing them made a pass cost grow with the number of devices)."""
        due = self._due
        gone = []  # pruned as ``due`` prunes them: otherwise each call would walk them again
        found = False
        for order, device in due.items():
            if self._still_due(device, limit_ns):
                found = True
                break
            gone.append(order)
        for order in gone:
            del due[order]
        if found:
            return True
        heap = self._heap
        while heap and heap[0][0] <= limit_ns:
            free_ns, order, device = heapq.heappop(heap)
            if self._valid(free_ns, device):
                due[order] = device  # as ``due`` keeps it
                return True
        return False

    def next_after(self, after_ns: int, counts: Callable[[DeviceState], bool]) -> int:
        """The earliest free time after ``after_ns`` of a wanted device that ``counts`` (NEVER if none)."""
        heap, due = self._heap, self._due
        passed_over = []
        found = NEVER
        while heap:
            free_ns, order, device = heap[0]
            if not self._valid(free_ns, device):
                heapq.heappop(heap)
            elif free_ns <= after_ns:
                heapq.heappop(heap)
                due[order] = device
            elif counts(device):
                found = free_ns
                break
            else:
                passed_over.append(heapq.heappop(heap))
        for entry in passed_over:
            heapq.heappush(heap, entry)
        return found
