"""A device whose CUDA context is poisoned (a device-side assert, an illegal address: ``is_sticky_cuda_error``)
cannot recover in its process: it refuses all work from then on, and the worker is told, once, so that it
starts over; after the result of the action that met the error, so that this result says why."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import torch

log = logging.getLogger("mainspring.worker.runtimes.torch_device")  # its lines read as the device's, as before


class LostContext:
    """Whether (``reason``) and why the device's context is lost; ``on_lost`` told once."""

    def __init__(self, device: torch.device, on_lost: Callable[[str], None] | None) -> None:
        self._device = device
        self.reason = ""  # why the context is unusable, once it is
        self._by: int | None = None  # the action whose result says so (the worker is told after it)
        self._lock = threading.Lock()  # both lanes and the capture may meet it at once
        self._on_lost = on_lost

    def lose(self, error: BaseException, where: str, action_id: int | None = None) -> str:
        """The context is poisoned (``error``, met ``where``): tell the worker once action ``action_id``'s
        result is out (``delivered``), at once when no action's result says so; the reason."""
        with self._lock:
            if not self.reason:
                cause = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
                self.reason = (
                    f"the CUDA context of {self._device} is lost ({cause}); the worker starts over. "
                    "An input outside a model's range is the usual cause: declare valid_range in its config"
                )
                self._by = action_id
                log.critical("%s (%s)", self.reason, where)
        if action_id is None:
            self._tell()
        return self.reason

    def delivered(self, action_id: int) -> None:
        """Action ``action_id``'s result is out: if it is the one that says the context is lost, tell now."""
        if self.reason and action_id == self._by:
            self._tell()

    def _tell(self) -> None:
        with self._lock:
            on_lost, self._on_lost = self._on_lost, None
        if on_lost is not None:
            on_lost(self.reason)
