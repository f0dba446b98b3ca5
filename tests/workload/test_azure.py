import random
from collections import Counter
from pathlib import Path

import pytest

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.time import NS_PER_S
from mainspring.workload import AzureTrace
from mainspring.workload.azure import bundled_trace_path, model_blocks, read_trace

SHARED_TRACE = Path(__file__).parents[3] / "shared" / "traces" / "azure-functions-2019-sample.csv"


def test_bundled_trace_is_the_shared_sample() -> None:
    functions = read_trace(bundled_trace_path())
    assert len(functions) == 900 and all(len(f) == 1440 for f in functions)
    assert sum(map(sum, functions)) == 650_548
    if SHARED_TRACE.exists():
        assert bundled_trace_path().read_bytes() == SHARED_TRACE.read_bytes()


def test_original_header_format_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "orig.csv"
    path.write_text("HashOwner,HashApp,HashFunction,Trigger,1,2,3\no,a,f,http,1,0,2\no,a,g,timer,5,5,5\n")
    assert read_trace(path) == [[1, 0, 2], [5, 5, 5]]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "is empty"),
        ("a,b,c\n1,2,3\n", "no 'minute_1'"),
        ("HashFunction,HashOwner,HashApp,minute_1\nf,o,a,many\n", "line 2"),
        ("HashFunction,HashOwner,HashApp,minute_1\n", "no functions"),
    ],
)
def test_malformed_traces_are_refused_with_the_reason(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_trace(path)
    with pytest.raises(ValueError, match="cannot read"):
        read_trace(tmp_path / "absent.csv")


def test_blocks_follow_clockwork_and_cover_every_model() -> None:
    assert [b.start for b in model_blocks(10, 4)] == [4 * i // 10 for i in range(10)]
    assert all(len(b) == 1 for b in model_blocks(10, 4))
    blocks = model_blocks(900, 4026)
    covered = sorted(m for b in blocks for m in b)
    assert covered == list(range(4026))
    authors = model_blocks(900, 4026, authors=True)  # Clockwork's own: one model a function, the rest idle
    assert [b.start for b in authors] == [4026 * i // 900 for i in range(900)] and all(len(b) == 1 for b in authors)


def test_the_authors_mapping_feeds_one_model_a_function_and_leaves_the_rest_idle() -> None:
    models = model_copies(builtin_profiles(), 4026)
    arrivals = list(AzureTrace(scale=2.0, authors_mapping=True).arrivals(models, 120 * NS_PER_S, random.Random(1)))
    fed = {a.model for a in arrivals}
    assert fed <= {models[4026 * i // 900].model for i in range(900)} and len(fed) > 100


def test_replay_feeds_every_model_and_keeps_popularity_skewed() -> None:
    models = model_copies(builtin_profiles(), 4026)
    trace = AzureTrace(scale=2.0)
    arrivals = list(trace.arrivals(models, 600 * NS_PER_S, random.Random(1)))
    counts = Counter(a.model for a in arrivals)
    # Every model in the block of a function busy in these ten minutes gets traffic.
    functions = sorted(read_trace(bundled_trace_path()), key=lambda f: -sum(f))
    busy = [b for f, b in zip(functions, model_blocks(900, 4026), strict=True) if sum(f[:10]) >= 50]
    assert len(busy) >= 15
    assert all(models[m].model in counts for block in busy for m in block)
    top = sum(c for _, c in counts.most_common(40))  # top 1% of models
    assert top > 0.2 * len(arrivals)
    assert all(a.time_ns < 600 * NS_PER_S for a in arrivals)
    assert [a.time_ns for a in arrivals] == sorted(a.time_ns for a in arrivals)


def test_scale_multiplies_the_rate() -> None:
    models = model_copies(builtin_profiles(), 100)
    one = len(list(AzureTrace(scale=1).arrivals(models, 120 * NS_PER_S, random.Random(1))))
    ten = len(list(AzureTrace(scale=10).arrivals(models, 120 * NS_PER_S, random.Random(1))))
    assert 8 * one < ten < 12 * one
