"""A device's weight pool: one tensor allocated once (``open``) and cut into pages (``PagePool``). A loaded
model's tensors are views of its pages (laid out first-fit-decreasing, never straddling a page:
``HostModel.layout``), so its module reads its weights from the pages and no other copy is made."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from mainspring.worker.pages import PagePool
from mainspring.worker.runtimes.host_weights import HostModel


class WeightArena:
    """The page pool of one device and the memory behind it."""

    def __init__(self, device: torch.device, page_bytes: int) -> None:
        self.device = device
        self.page_bytes = page_bytes
        self.pool = PagePool(page_bytes, page_bytes)  # until ``open``
        self.tensor = torch.empty(0, dtype=torch.uint8, device=device)
        self.is_open = False

    def open(self, pool_bytes: int) -> None:
        """Allocate the pool (once) and touch every page: a first-touch page fault would make the first loads
        slow."""
        assert not self.is_open, "the page pool is open already"
        self.pool = PagePool(pool_bytes, self.page_bytes)
        self.tensor = torch.empty(self.pool.total_pages * self.page_bytes, dtype=torch.uint8, device=self.device)
        self.tensor.zero_()
        if self.device.type == "cuda":  # the load stream does not wait for the default one: no load before the zeros
            torch.cuda.synchronize(self.device)
        self.is_open = True

    def views(self, model: HostModel) -> tuple[torch.Tensor, ...]:
        """``model``'s tensors in the pages allocated to it, in ``model.host`` order."""
        views: list[torch.Tensor | None] = [None] * len(model.host)
        pages = self.pool.page_numbers(model.config.name)
        for page, members in zip(pages, model.layout, strict=True):
            offset = page * self.page_bytes
            for index in members:
                host = model.host[index]
                nbytes = host.numel() * host.element_size()
                views[index] = self.tensor[offset : offset + nbytes].view(host.dtype).view(host.shape)
                offset += model.tensor_bytes[index]
        return tuple(v for v in views if v is not None)

    def copy_in(
        self, views: Sequence[torch.Tensor], host: Sequence[torch.Tensor], stream: torch.cuda.Stream | None
    ) -> None:
        """The host's tensors into their page views, on ``stream`` (CUDA: asynchronously, from pinned memory)."""
        cuda = self.device.type == "cuda"
        with torch.no_grad(), torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for view, tensor in zip(views, host, strict=True):
                view.copy_(tensor, non_blocking=cuda)
