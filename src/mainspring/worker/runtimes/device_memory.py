"""How large a GPU's page pool can be: the memory left once the models are registered, less what lives
outside the pool.

Outside the page pool sit the CUDA context and the libraries' workspaces, what each registered model
leaves behind (an ONNX Runtime session's arena; the caching allocator's blocks are emptied first),
and room for what comes and goes: a later registration's two temporary device copies of its weights
(the warm-up's, then the first profile's load timing), and activations, eager or in the shared CUDA
graph pool. A pool sized before registration (half the GPU, as before) either left most of that
room unused or, for a model larger than the other half, no room to register it at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mainspring.protocol.pages import MIB

CONTEXT_BYTES = 1024 * MIB  # the CUDA context, cuBLAS and cuDNN workspaces, fragmentation


@dataclass(frozen=True)
class OutsidePool:
    """What a device keeps free beside its page pool, by cause (bytes)."""

    context: int
    registration: int  # twice the largest model's weights: a later registration's temporary copies
    activations: int  # twice the largest warm-up peak beyond its weights: eager runs and the graph pool

    @property
    def total(self) -> int:
        return self.context + self.registration + self.activations

    def describe(self) -> str:
        return (f"{self.total / MIB:.0f} MiB kept outside the pool: {self.context / MIB:.0f} context, "
                f"{self.registration / MIB:.0f} for a registration's copies, {self.activations / MIB:.0f} "
                "for activations and CUDA graphs")  # fmt: skip


def pool_after_registration(
    free_bytes: int, page_bytes: int, weights: Iterable[int], activations: Iterable[int]
) -> tuple[int, OutsidePool]:
    """The page pool (whole pages, at least one) that leaves room for what lives outside it, given the device's
    free memory once the models are registered, and each registered model's weights and warm-up peak. With no
    model registered yet, what later ones need is unknown: half the free memory stays outside."""
    largest = max(weights, default=0)
    outside = OutsidePool(
        context=CONTEXT_BYTES,
        registration=2 * largest if largest else max(0, free_bytes // 2 - CONTEXT_BYTES),
        activations=2 * max(activations, default=0),
    )
    pages = max(1, (free_bytes - outside.total) // page_bytes)
    return pages * page_bytes, outside
