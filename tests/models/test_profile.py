import json
from pathlib import Path

import pytest

from mainspring.models.profile import (
    ModelProfile,
    builtin_profiles,
    dump_profiles,
    load_profiles,
    model_copies,
)
from mainspring.protocol.pages import DEFAULT_PAGE_BYTES
from mainspring.time import ms_to_ns


def test_builtin_profiles_hold_clockworks_published_figures() -> None:
    profiles = {p.model: p for p in builtin_profiles()}
    r50 = profiles["resnet50_v2"]
    assert r50.weights_bytes == 102_200_000 and r50.pages(DEFAULT_PAGE_BYTES) == 7
    assert r50.load_ns == ms_to_ns(8.37)
    assert {b: r50.exec_ns[b] for b in (1, 2, 4, 8, 16)} == {
        1: ms_to_ns(3.32), 2: ms_to_ns(5.27), 4: ms_to_ns(7.50), 8: ms_to_ns(12.44), 16: ms_to_ns(21.73)
    }  # fmt: skip
    assert profiles["resnet18_v2"].exec_ns[1] == ms_to_ns(1.63)
    assert profiles["resnet18_v2"].load_ns == ms_to_ns(3.85)
    assert profiles["resnet152_v2"].exec_ns[1] == ms_to_ns(9.13)
    assert profiles["resnet152_v2"].load_ns == ms_to_ns(19.7)
    for p in profiles.values():
        assert p.batch_sizes == (1, 2, 4, 8, 16)
        assert list(p.exec_ns.values()) == sorted(p.exec_ns.values())


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    original = [*builtin_profiles(), ModelProfile("tiny", "cpu", 1000, 1, {1: 5, 4: 9}, (600, 400))]
    path = tmp_path / "profiles.json"
    dump_profiles(original, path, source="test")
    again = load_profiles(path)
    assert [p.to_json() for p in again] == [p.to_json() for p in original]
    assert again[-1].pages(600) == 2


def test_padding_to_supported_batch_sizes() -> None:
    p = ModelProfile("m", "cpu", 10, 1, {1: 1, 4: 3, 8: 5})
    assert [p.padded_batch(n) for n in (1, 2, 4, 5, 8)] == [1, 4, 4, 8, 8]
    with pytest.raises(ValueError, match="up to 8"):
        p.padded_batch(9)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not valid JSON"),
        ('{"profiles": [{"model": "m"}]}', "missing field"),
        ('{"profiles": [{"model": "m", "weights_bytes": 1, "load_ms": 1, "exec_ms": {"1": -2}}]}', "must be positive"),
        ("[]", "'profiles' list"),
    ],
)
def test_bad_profile_files_give_clear_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as error:
        load_profiles(path)
    assert str(path) in str(error.value)


def test_missing_profile_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read profile file"):
        load_profiles(tmp_path / "absent.json")


def test_model_copies_cycle_over_the_base() -> None:
    copies = model_copies(builtin_profiles(), 4026)
    assert len({c.model for c in copies}) == 4026
    assert copies[0].model == "resnet50_v2-0000" and copies[4025].model.endswith("-4025")
    assert copies[3].exec_ns == copies[0].exec_ns
    assert json.dumps(copies[1].to_json())


def test_slo_factor_is_a_multiple_of_the_batch_1_time() -> None:
    p = ModelProfile("m", "cpu", 10, 1, {1: 3_320_000, 4: 7_500_000})
    assert p.slo_ns_for_factor(2.5) == 8_300_000
    with pytest.raises(ValueError, match="positive"):
        p.slo_ns_for_factor(0)
