"""The system shared-memory registry: regions read and written only within what was registered, one set of
registrations for every frontend process of a server, clear 400s, and nothing that can take the server down."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mainspring.frontend.errors import InferenceError
from mainspring.frontend.shared_memory import Placement, SharedMemoryRegions, placement


@pytest.fixture
def shm_root(tmp_path: Path) -> Path:
    """Stands in for /dev/shm: the registry maps whatever file a key names there (tmpfs or not)."""
    root = tmp_path / "shm"
    root.mkdir()
    return root


def make_object(root: Path, key: str, data: bytes) -> Path:
    path = root / key.lstrip("/")
    path.write_bytes(data)
    return path


def error_of(call: object, *args: object) -> str:
    assert callable(call)
    with pytest.raises(InferenceError) as raised:
        call(*args)
    assert raised.value.status == 400
    return raised.value.message


def test_a_region_is_read_and_written_within_what_was_registered(shm_root: Path) -> None:
    path = make_object(shm_root, "/data", bytes(range(64)))
    regions = SharedMemoryRegions(shm_root=shm_root)
    regions.register("in", "/data", 16, 32)
    assert regions.read(Placement("in", 8, offset=4), "input 'x'") == bytes(range(20, 28))
    regions.write(Placement("in", 8, offset=24), b"\xff" * 8, "output 'y'")
    assert path.read_bytes()[40:48] == b"\xff" * 8 and path.read_bytes()[48:] == bytes(range(48, 64))
    assert "exceeds the 32 bytes of region 'in'" in error_of(regions.read, Placement("in", 8, offset=28), "input 'x'")
    assert "do not fit" in error_of(regions.write, Placement("in", 4), b"12345", "output 'y'")
    assert [vars(r) for r in regions.status()] == [{"name": "in", "key": "/data", "offset": 16, "byte_size": 32}]
    regions.close()


@pytest.mark.parametrize(
    ("key", "offset", "size", "fragment"),
    [
        ("/data", 0, 65, "exceeds the 64 bytes of object '/data'"),
        ("/data", 60, 8, "offset 60 + byte_size 8 exceeds"),
        ("/data", -1, 8, "offset must be an integer of at least 0"),
        ("/data", 0, 0, "byte_size must be an integer of at least 1"),
        ("/data", 0, "8", "byte_size must be an integer"),
        ("/missing", 0, 8, "cannot open object '/missing'"),
        ("/..", 0, 8, "key must name a shared-memory object"),
        ("/a/b", 0, 8, "key must name a shared-memory object"),
        (None, 0, 8, "key must name a shared-memory object"),
        ("/dir", 0, 8, "cannot open object '/dir': Is a directory"),
        ("/fifo", 0, 8, "'/fifo' is not a shared-memory object with data"),
        ("/empty", 0, 8, "'/empty' is not a shared-memory object with data"),
        ("/link", 0, 8, "cannot open object '/link'"),
    ],
)
def test_a_bad_registration_is_refused_naming_the_field(
    shm_root: Path, key: object, offset: object, size: object, fragment: str
) -> None:
    make_object(shm_root, "/data", bytes(64))
    (shm_root / "dir").mkdir()
    os.mkfifo(shm_root / "fifo")  # opened for reading and writing, it would block nobody: refused by its type
    (shm_root / "empty").touch()
    (shm_root / "link").symlink_to(shm_root / "data")  # a link could lead anywhere the server may write
    regions = SharedMemoryRegions(shm_root=shm_root)
    assert fragment in error_of(regions.register, "r", key, offset, size)
    assert regions.status() == []


def test_names_are_taken_once_and_unknown_regions_named(shm_root: Path) -> None:
    make_object(shm_root, "/data", bytes(64))
    regions = SharedMemoryRegions(shm_root=shm_root)
    regions.register("r", "/data", 0, 64)
    assert "already registered" in error_of(regions.register, "r", "/data", 0, 8)
    assert error_of(regions.status, "nope") == "Unable to find system shared memory region: 'nope'"
    assert "region 'nope' is not registered" in error_of(regions.read, Placement("nope", 4), "input 'x'")
    regions.unregister("nope")  # nothing to forget is no error (as Triton)
    regions.unregister()
    assert regions.status() == []
    assert "1 to 120 bytes" in error_of(regions.register, "x" * 121, "/data", 0, 8)


def test_every_frontend_process_sees_one_set_of_registrations(shm_root: Path, tmp_path: Path) -> None:
    make_object(shm_root, "/one", b"1" * 16)
    make_object(shm_root, "/two", b"2" * 16)
    shared = tmp_path / "registry"
    shared.mkdir()
    first, second = SharedMemoryRegions(shared, shm_root), SharedMemoryRegions(shared, shm_root)
    first.register("r", "/one", 0, 16)
    assert second.read(Placement("r", 4), "input") == b"1111"
    assert "already registered" in error_of(second.register, "r", "/two", 0, 16)
    first.unregister("r")  # and registered again elsewhere: the other maps the new object
    first.register("r", "/two", 0, 16)
    assert second.read(Placement("r", 4), "input") == b"2222"
    first.unregister()
    assert "not registered" in error_of(second.read, Placement("r", 4), "input")
    second.close()  # not its folder: the registrations stay where the server keeps them
    assert shared.is_dir()


def test_an_object_shrunk_after_registration_is_refused_not_read(shm_root: Path) -> None:
    # Touching a mapped page past the end of a file raises SIGBUS, which would kill the server.
    path = make_object(shm_root, "/data", bytes(2 * mmap_page()))
    regions = SharedMemoryRegions(shm_root=shm_root)
    regions.register("r", "/data", 0, 2 * mmap_page())
    assert regions.read(Placement("r", 4, offset=mmap_page() + 8), "input") == bytes(4)
    os.truncate(path, 16)
    assert "smaller than when it was registered" in error_of(regions.read, Placement("r", 4), "input 'x'")
    regions.close()


def test_registrations_end_with_the_server(shm_root: Path) -> None:
    make_object(shm_root, "/data", bytes(8))
    regions = SharedMemoryRegions(shm_root=shm_root)
    regions.register("r", "/data", 0, 8)
    folder = regions.folder
    regions.close()
    assert not folder.exists()


@pytest.mark.parametrize(
    ("parameters", "fragment"),
    [
        ({"shared_memory_byte_size": 8}, "shared_memory_region must be a region's name"),
        ({"shared_memory_region": "r"}, "shared_memory_byte_size must be a non-negative integer, got None"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": -1}, "shared_memory_byte_size must be"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": 8, "shared_memory_offset": True}, "offset must"),
    ],
)
def test_a_half_given_placement_is_refused(parameters: dict[str, object], fragment: str) -> None:
    assert fragment in error_of(placement, parameters, "input 'x'")


def test_a_tensor_without_shared_memory_parameters_has_no_placement() -> None:
    assert placement({"binary_data_size": 8}, "input 'x'") is None
    assert placement({"shared_memory_region": "r", "shared_memory_byte_size": 8}, "x") == Placement("r", 8, 0)


def mmap_page() -> int:
    import mmap

    return mmap.PAGESIZE
