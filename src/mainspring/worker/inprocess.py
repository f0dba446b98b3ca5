"""The in-process transport: a ``Worker`` in the controller's process, events on its event loop.

Same events as the ZeroMQ hub (join, results, model replies), no sockets and no clock
offset. Used by tests and by benchmarks that want the controller without the network.
Note that a torch worker here shares the interpreter (and its GIL) with the controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from mainspring.protocol import Action, ActionResult
from mainspring.protocol.devices import GpuMemory
from mainspring.protocol.models import ModelOperation, ModelTarget
from mainspring.transport.links import WorkerEvents
from mainspring.worker.api import ResultCallback, Worker, apply_model_operation, model_info


class InProcessWorker:
    """A ``WorkerHandle`` around a local ``Worker``."""

    def __init__(
        self,
        name: str,
        make_worker: Callable[[ResultCallback], Worker],
        events: WorkerEvents,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.name = name
        self._events = events
        self._loop = loop
        self.worker = make_worker(self._from_worker_thread)
        self.closed = False

    def join(self) -> None:
        """Announce the worker (call on the loop)."""
        models = [model_info(self.worker, m) for m in self.worker.profiles()]
        self._events.on_join(self, list(self.worker.devices), models, dict(self.worker.load_errors))

    def _from_worker_thread(self, result: ActionResult) -> None:
        if self.closed:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits for this result
            self._loop.call_soon_threadsafe(self._events.on_result, self, result)

    @property
    def gpus(self) -> tuple[GpuMemory, ...]:
        return self.worker.gpu_memory()

    def send_action(self, action: Action, inputs: list[Any] | None) -> None:
        self.worker.submit(action, inputs)

    def model_op(self, op_id: int, op: ModelOperation, target: ModelTarget) -> None:
        threading.Thread(target=self._model_op, args=(op_id, op, target), daemon=True).start()

    def _model_op(self, op_id: int, op: ModelOperation, target: ModelTarget) -> None:
        reply = apply_model_operation(self.worker, op_id, op, target)
        self._loop.call_soon_threadsafe(self._events.on_model_reply, self, reply)

    def close(self, reason: str, start_over: bool = False) -> None:
        if not self.closed:
            self.closed = True
            self.worker.close()
