"""A cell of ``serve --cells N``: a controller node with no HTTP or gRPC of its own. The frontends reach
its controller on a ZeroMQ channel and read its load signal, which it publishes on a ticker of its own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from mainspring.cells.routing import CellSignal
from mainspring.cells.signal import cell_signal
from mainspring.cells.wire import SignalPublisher
from mainspring.controller.frontends import FrontendHub
from mainspring.controller.service import ControllerService
from mainspring.protocol.model_names import client_name

log = logging.getLogger("mainspring.serve")

# How often the signal is looked at (sent when it changed): as often as the load limits' lag timer,
# which carried it before; a timer of its own, so that measuring the loop's lag and signalling are apart.
SIGNAL_PERIOD_S = 0.005


@dataclass(frozen=True)
class CellRole:
    """This server is cell ``index`` of a ``serve --cells N``: no HTTP or gRPC of its own; the frontends
    reach its controller on ``endpoint`` and read its load signal on ``signal_endpoint``."""

    index: int
    endpoint: str
    signal_endpoint: str


class Cell:
    """The cell's side facing the frontends: the channel to its controller, and its load signal."""

    def __init__(self, role: CellRole, service: ControllerService, secret: str, shed: bool = True) -> None:
        self.role = role
        self._service = service
        self._hub = FrontendHub(service, role.endpoint, secret=secret, shed=shed)  # shed: at arrival, when late
        self._publisher = SignalPublisher(role.signal_endpoint, self.signal, secret)
        self._ticker: asyncio.Task[None] | None = None
        self._signal_part = service.ledger.part("signal")
        self._incarnation = time.monotonic_ns()  # tells the frontends a restarted process from a slow one

    async def start(self) -> None:
        self._service.in_line = False  # it may have missed repository changes: the server's port says when not
        await self._hub.start()
        self._publisher.start()
        self._ticker = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(SIGNAL_PERIOD_S)
            try:
                with self._signal_part:
                    self._publisher.tick()
            except Exception:  # a bug in the signal must not end the cell: the frontends see it silent
                log.exception("the load signal failed; it is published no more")
                return

    def signal(self) -> CellSignal:
        """This cell's load signal, under the names clients use (``ServedModel.key`` inside)."""
        service = self._service
        wanted = self._hub.signal_models  # those it serves with other cells: routing reads no other
        keys = [served.key for name, served in service.models.items() if wanted is None or name in wanted]
        now = service.clock.now_ns()
        signal = cell_signal(self.role.index, service.policy, service.device_count, now, keys)
        finish = {client_name(key): end for key, end in signal.finish_ns.items()}
        return CellSignal(signal.cell, signal.at_ns, signal.devices, finish, signal.cold_start_ns, self._incarnation)

    async def stop(self) -> None:
        """After the drain (a draining cell keeps signalling, which says it still lives)."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        self._publisher.close()
        await self._hub.close()
