import pytest
from hypothesis import given
from hypothesis import strategies as st

from mainspring.protocol.pages import pack_first_fit_decreasing, pages_needed
from mainspring.worker.pages import PagePool

PAGE = 1000


@given(st.lists(st.integers(min_value=1, max_value=PAGE), min_size=1, max_size=60))
def test_packing_never_splits_a_tensor_nor_overfills_a_page(sizes: list[int]) -> None:
    pages = pack_first_fit_decreasing(sizes, PAGE)
    placed = sorted(i for page in pages for i in page)
    assert placed == list(range(len(sizes)))  # every tensor exactly once, whole
    assert all(sum(sizes[i] for i in page) <= PAGE for page in pages)
    assert len(pages) >= -(-sum(sizes) // PAGE)


def test_packing_is_first_fit_decreasing() -> None:
    assert pack_first_fit_decreasing([300, 800, 200, 700], PAGE) == [[1, 2], [3, 0]]


def test_a_tensor_larger_than_a_page_is_refused() -> None:
    with pytest.raises(ValueError, match="exceeds the page size"):
        pack_first_fit_decreasing([PAGE + 1], PAGE)


def test_pages_needed_uses_tensor_sizes_when_known() -> None:
    assert pages_needed(1200, PAGE) == 2
    assert pages_needed(1200, PAGE, [600, 600]) == 2
    assert pages_needed(1800, PAGE, [600, 600, 600]) == 3  # no page holds two 600s


def test_pool_allocates_refuses_and_releases_exactly() -> None:
    pool = PagePool(capacity_bytes=10 * PAGE, page_bytes=PAGE)
    assert pool.total_pages == 10
    assert pool.allocate("a", 6)
    assert not pool.allocate("b", 5)
    assert pool.used_pages == 6 and not pool.holds("b")
    assert pool.allocate("b", 4)
    assert pool.free_pages == 0
    assert pool.release("a") == 6
    assert pool.free_pages == 6 and pool.release("a") == 0
    with pytest.raises(ValueError, match="already holds"):
        pool.allocate("b", 1)
