"""A device's page pool: which pages each model's weights hold (the page maths is ``protocol.pages``)."""

from __future__ import annotations

from mainspring.protocol.pages import DEFAULT_PAGE_BYTES, DEFAULT_POOL_BYTES


class PagePool:
    """Hands out page numbers per model on one device. Refuses, never evicts on its own.

    The lowest free page numbers are taken first; the real worker maps page ``n`` to
    bytes ``[n * page_bytes, (n + 1) * page_bytes)`` of its arena.
    """

    def __init__(self, capacity_bytes: int = DEFAULT_POOL_BYTES, page_bytes: int = DEFAULT_PAGE_BYTES) -> None:
        if page_bytes <= 0 or capacity_bytes < page_bytes:
            raise ValueError(f"bad page pool: capacity {capacity_bytes} bytes, page {page_bytes} bytes")
        self.page_bytes = page_bytes
        self.total_pages = capacity_bytes // page_bytes
        self._held: dict[str, list[int]] = {}
        self._free = list(range(self.total_pages))  # kept sorted
        self._used = 0

    @property
    def used_pages(self) -> int:
        return self._used

    @property
    def free_pages(self) -> int:
        return self.total_pages - self._used

    def holds(self, model: str) -> bool:
        return model in self._held

    def pages_of(self, model: str) -> int:
        return len(self._held.get(model, ()))

    def page_numbers(self, model: str) -> list[int]:
        return list(self._held.get(model, ()))

    def allocate(self, model: str, pages: int) -> bool:
        """Reserve ``pages`` for ``model``; False (and nothing changes) if they do not fit."""
        if model in self._held:
            raise ValueError(f"model {model!r} already holds pages")
        if pages > self.free_pages:
            return False
        self._held[model], self._free = self._free[:pages], self._free[pages:]
        self._used += pages
        return True

    def release(self, model: str) -> int:
        """Return the model's pages; returns how many were freed (0 if none were held)."""
        pages = self._held.pop(model, [])
        if pages:
            self._free = sorted(self._free + pages)
        self._used -= len(pages)
        return len(pages)
