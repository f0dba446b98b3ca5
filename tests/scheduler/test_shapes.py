"""How much lane time a queue needs (``least_work``), against a brute-force split of every count."""

import functools

from hypothesis import given
from hypothesis import strategies as st

from mainspring.scheduler.clockwork.shapes import EXACT_SPLIT_BATCHES, least_work

Table = tuple[tuple[int, int], ...]


def exact(table: Table, count: int) -> int:
    """The least lane time over every way of covering ``count`` requests with the table's batches."""

    @functools.cache
    def best(c: int) -> int:
        return 0 if c <= 0 else min(best(c - size) + exec_ns for size, exec_ns in table)

    for c in range(count):  # bottom up: no deep recursion
        best(c)
    return best(count)


def test_a_stalled_largest_size_is_split_around() -> None:
    table = ((1, 10), (2, 17), (4, 24), (8, 150))  # a batch of 8 that caught a stall
    assert least_work(table, 5) == 34  # 4 + 1, not a padded 8
    assert least_work(table, 16) == 96  # four batches of 4
    assert least_work(((1, 2), (2, 3), (4, 5), (8, 9), (16, 20)), 12) == 14  # 8 + 4, not a padded 16


tables = st.lists(st.integers(1, 200), min_size=1, max_size=5).map(
    lambda costs: tuple((1 << i, sum(costs[: i + 1])) for i in range(len(costs)))  # sizes 1, 2, 4...; rising estimates
)


@given(tables, st.integers(0, 400))
def test_exact_for_short_queues_and_within_one_batch_beyond(table: Table, count: int) -> None:
    found, best = least_work(table, count), exact(table, count)
    if count <= EXACT_SPLIT_BATCHES * table[-1][0]:
        assert found == best
    else:  # the bulk in the batches with the least time per request: at most one batch more
        assert best <= found <= best + max(exec_ns for _, exec_ns in table)
