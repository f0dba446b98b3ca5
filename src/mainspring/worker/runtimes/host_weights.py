"""A registered model's weights in host memory, page-locked on CUDA, and where each tensor goes in its pages."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mainspring.protocol.models import ModelConfig
from mainspring.protocol.pages import aligned_bytes, pack_first_fit_decreasing


@dataclass
class HostModel:
    """A registered model's weights in host memory and where each tensor goes in its pages."""

    config: ModelConfig
    names: tuple[str, ...]
    host: tuple[torch.Tensor, ...]
    tensor_bytes: tuple[int, ...]  # aligned: the room each tensor takes in a page
    layout: list[list[int]]  # tensor indices per page, first-fit-decreasing

    @classmethod
    def from_tensors(
        cls, config: ModelConfig, tensors: Mapping[str, torch.Tensor], page_bytes: int, pin_for: torch.device | None
    ) -> HostModel:
        """``tensors`` held in host memory (a copy), page-locked for the CUDA device ``pin_for`` (None: not)."""
        names = tuple(tensors)
        host = tuple(t.detach().cpu().contiguous() for t in tensors.values())
        sizes = tuple(aligned_bytes(t.numel() * t.element_size()) for t in host)
        if pin_for is not None:
            host = _pinned_together(host, sizes, pin_for)
        return cls(config, names, host, sizes, pack_first_fit_decreasing(sizes, page_bytes))

    @property
    def weights_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.host)


class PinningError(RuntimeError):
    """Host memory for a model's weights could not be page-locked."""


def _pinned_together(
    host: tuple[torch.Tensor, ...], sizes: tuple[int, ...], device: torch.device
) -> tuple[torch.Tensor, ...]:
    """``host`` copied into one page-locked buffer (views of it, which keep it: ``Tensor._base``)."""
    buffer = pinned_buffer(sum(sizes), device)
    views, offset = [], 0
    for tensor, size in zip(host, sizes, strict=True):
        nbytes = tensor.numel() * tensor.element_size()
        view = buffer[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape)
        view.copy_(tensor)
        views.append(view)
        offset += size
    return tuple(views)


CUDA_HOST_REGISTER_PORTABLE = 1  # page-locked for every CUDA context, not only the current device's


def pinned_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """``nbytes`` of ordinary host memory registered with CUDA (page-locked) as they are, unregistered when the
    buffer goes. Not ``pin_memory``: its allocator rounds each allocation up to a power of two (pytorch#171662),
    up to twice the weights, and keeps what is freed."""
    buffer = torch.empty(max(1, nbytes), dtype=torch.uint8)
    cudart: Any = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    pointer = buffer.data_ptr()
    with torch.cuda.device(device):  # not device 0's context, for a worker on cuda:N
        status = cudart.cudaHostRegister(pointer, buffer.numel(), CUDA_HOST_REGISTER_PORTABLE)
        if status != cudart.cudaError.success:
            _clear_last_error(device)
            raise PinningError(f"cudaHostRegister of {nbytes} bytes failed ({status})")
    weakref.finalize(buffer, cudart.cudaHostUnregister, pointer)
    return buffer


def _clear_last_error(device: torch.device) -> None:
    """A failed runtime call leaves its error as the thread's last one, which the next kernel launch check on
    this thread would raise (failing another model's warm-up): a launch's check takes it and clears it."""
    with contextlib.suppress(RuntimeError):
        torch.zeros(1, device=device)


def drop_weights(module: nn.Module) -> None:
    """Let go of ``module``'s weights now: an exported module's reference cycles would hold them until a full
    cycle collection, which may not come for a long time (on a GPU: its memory)."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
