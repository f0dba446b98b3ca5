"""Page maths for weights in device memory, shared by controller, workers and profiles.

Weights live in fixed-size pages (16 MiB by default, as in Clockwork). A tensor
never straddles two pages; tensors are packed first-fit-decreasing. The emulated
and the real worker both count pages with these functions, so the controller's
view of memory is exactly the worker's.
"""

from __future__ import annotations

from collections.abc import Sequence

MIB = 1024 * 1024
DEFAULT_PAGE_BYTES = 16 * MIB
DEFAULT_POOL_BYTES = 32 * 1024 * MIB
# Every tensor starts on this boundary inside its page (enough for any dtype and for vector loads).
TENSOR_ALIGN_BYTES = 256


def aligned_bytes(nbytes: int) -> int:
    """The room a tensor of ``nbytes`` takes in a page."""
    return max(TENSOR_ALIGN_BYTES, -(-nbytes // TENSOR_ALIGN_BYTES) * TENSOR_ALIGN_BYTES)


def pack_first_fit_decreasing(tensor_bytes: Sequence[int], page_bytes: int) -> list[list[int]]:
    """Assign tensors (by index) to pages; returns the tensor indices of each page.

    Raises ``ValueError`` for a tensor larger than a page: it could never be placed.
    """
    order = sorted(range(len(tensor_bytes)), key=lambda i: (-tensor_bytes[i], i))
    pages: list[list[int]] = []
    free: list[int] = []
    for index in order:
        size = tensor_bytes[index]
        if size > page_bytes:
            raise ValueError(f"tensor {index} of {size} bytes exceeds the page size of {page_bytes} bytes")
        for page, room in enumerate(free):
            if room >= size:
                pages[page].append(index)
                free[page] -= size
                break
        else:
            pages.append([index])
            free.append(page_bytes - size)
    return pages


def pages_needed(weights_bytes: int, page_bytes: int, tensor_bytes: Sequence[int] | None = None) -> int:
    """Pages a model occupies: packed tensors when their sizes are known, else a ceiling; none for a model
    without weights (Triton's ``simple``: its graph holds all it needs, so nothing is paged)."""
    if tensor_bytes:
        return len(pack_first_fit_decreasing(tensor_bytes, page_bytes))
    return -(-weights_bytes // page_bytes) if weights_bytes > 0 else 0
