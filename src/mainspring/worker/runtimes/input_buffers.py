"""A device's input buffers, shared by the models whose inputs have the same shapes and types.

A batch is copied into fixed buffers before it runs (a CUDA graph reads its inputs at fixed
addresses). A set per model and batch size keeps, for every registered model, a buffer of every
size on the device for good, outside the page pool: 19 MB for a 224x224 image model with batch
sizes up to 16, 19 GB for a thousand of them. The exec lane runs one batch at a time, so the models
of one input signature share one buffer per batch size. What runs off the exec lane (a model's
warm-up while it registers) must use buffers of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from mainspring.models.zoo import torch_dtype
from mainspring.protocol.models import ModelConfig

Buffers = tuple[torch.Tensor, ...]
_Key = tuple[int, tuple[tuple[tuple[int, ...], str], ...]]  # batch size, (sample shape, datatype) per input


def new_buffers(config: ModelConfig, batch: int, device: torch.device) -> Buffers:
    """Zeroed buffers for a batch of ``batch`` of ``config``'s inputs, in input order."""
    return tuple(
        torch.zeros((batch, *spec.sample_shape), dtype=torch_dtype(spec.datatype), device=device)
        for spec in config.inputs
    )


class SharedInputs:
    """Buffers by batch size and input signature, kept while some registered model uses them."""

    def __init__(self, device: torch.device, mode: Callable[[], AbstractContextManager[Any]]) -> None:
        self._device = device
        self._mode = mode  # the grad mode the buffers are written in (inference tensors need inference mode)
        self._buffers: dict[_Key, Buffers] = {}
        self._users: dict[_Key, int] = {}

    @staticmethod
    def _keys(config: ModelConfig) -> list[tuple[int, _Key]]:
        signature = tuple((tuple(spec.sample_shape), spec.datatype) for spec in config.inputs)
        return [(batch, (batch, signature)) for batch in config.batch_sizes]

    def take(self, config: ModelConfig) -> dict[int, Buffers]:
        """The buffers ``config``'s model uses on the exec lane, one set per batch size it serves."""
        taken = {}
        for batch, key in self._keys(config):
            if key not in self._buffers:
                with self._mode():
                    self._buffers[key] = new_buffers(config, batch, self._device)
            self._users[key] = self._users.get(key, 0) + 1
            taken[batch] = self._buffers[key]
        return taken

    def release(self, config: ModelConfig) -> None:
        """``config``'s model no longer uses its buffers; those no model uses are freed."""
        for _, key in self._keys(config):
            left = self._users[key] - 1
            if left:
                self._users[key] = left
            else:
                del self._users[key], self._buffers[key]

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for buffers in self._buffers.values() for t in buffers)
