"""Triton's system shared-memory extension: tensors read from and written to memory a client on the
same host shares, instead of travelling in the request and the response.

A client creates a POSIX shared-memory object (``/dev/shm/<key>``), registers a region of it under a
name (``key``, ``offset``, ``byte_size``), and then names the region in an input's or a requested
output's parameters (``shared_memory_region``, ``shared_memory_byte_size``, ``shared_memory_offset``
within the region). The server reads and writes only inside what was registered.

Registrations are the server's, not one process's: ``serve --frontends N`` runs several frontend
processes and a client's calls may reach any of them. So each registration is a small file in a
folder the server made for the run (only its user may enter it; it is gone when the server stops):
creating it is atomic (one name, one registration), and each process maps the object itself, on
first use, and maps it again when the registration under that name changes.

A region is read or written only after the object is found still as large as the region: a client
that shrinks its object after registering it must get an error, not take the server down (touching
a mapped page past the end of a file raises SIGBUS).
"""

from __future__ import annotations

import json
import mmap
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mainspring.frontend.errors import InferenceError

SHM_ROOT = Path("/dev/shm")
MAX_NAME_BYTES = 120  # a registration's file is named by the region name in hex: within NAME_MAX
PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
_KEY = re.compile(r"/?[^/\x00]{1,250}")
CUDA_UNSUPPORTED = (
    "CUDA shared memory is not supported: this server uses no GPU for its frontends; use system shared memory"
)


@dataclass(frozen=True)
class Region:
    """One registration: ``byte_size`` bytes from ``offset`` in the object at ``key``."""

    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True)
class Placement:
    """Where a tensor lies: ``byte_size`` bytes from ``offset`` within region ``region``."""

    region: str
    byte_size: int
    offset: int = 0


def placement(parameters: Mapping[str, Any], where: str) -> Placement | None:
    """The shared-memory placement a tensor's parameters ask for (None: the tensor travels in the call);
    400 for a placement half given or with values that are no sizes."""
    if not any(key in parameters for key in PARAMETERS):
        return None
    region, size, offset = (parameters.get(key) for key in PARAMETERS)
    if not isinstance(region, str) or not region:
        raise InferenceError(400, f"{where}: shared_memory_region must be a region's name, got {region!r}"[:300])
    for key, value in (("shared_memory_byte_size", size), ("shared_memory_offset", 0 if offset is None else offset)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InferenceError(400, f"{where}: {key} must be a non-negative integer, got {value!r}"[:300])
    assert isinstance(size, int)
    return Placement(region, size, 0 if offset is None else int(offset))


def _whole(value: Any, field: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InferenceError(400, f"{field} must be an integer of at least {least}, got {value!r}"[:300])
    return value


class SharedMemoryRegions:
    """The system shared-memory regions clients registered, shared by the frontend processes of one
    server through ``folder`` (made, and removed by ``close``, when none is given)."""

    def __init__(self, folder: str | Path | None = None, shm_root: Path = SHM_ROOT) -> None:
        self._folder = None if folder is None else Path(folder)
        self._owned = folder is None  # made on the first registration, removed by ``close``
        self._root = shm_root
        self._mapped: dict[str, tuple[Region, int, mmap.mmap]] = {}  # this process's maps: region, fd, map

    @property
    def folder(self) -> Path:
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="mainspring-shm-"))
        return self._folder

    # --- the registry ------------------------------------------------------------------------------
    def register(self, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        """Register ``byte_size`` bytes at ``offset`` of object ``key`` as region ``name``; 400 naming what is wrong."""
        self._check_name(name)
        if not isinstance(key, str) or not _KEY.fullmatch(key) or key.lstrip("/") in (".", ".."):
            raise InferenceError(400, f"key must name a shared-memory object ('/name'), got {key!r}"[:300])
        region = Region(name, key, _whole(offset, "offset", 0), _whole(byte_size, "byte_size", 1))
        fd, size = self._open(region)
        os.close(fd)
        if region.offset + region.byte_size > size:
            raise InferenceError(400, f"shared memory region {name!r}: offset {region.offset} + byte_size "
                                      f"{region.byte_size} exceeds the {size} bytes of object {key!r}")  # fmt: skip
        # Written aside, then linked into place: another process never reads half a registration, and a
        # name taken meanwhile fails the link.
        fd, written = tempfile.mkstemp(prefix=".new-", dir=self.folder)
        with os.fdopen(fd, "w") as record:
            json.dump(asdict(region), record)
        try:
            os.link(written, self._record(name))
        except FileExistsError:
            raise InferenceError(400, f"shared memory region {name!r} is already registered") from None
        finally:
            os.unlink(written)

    def unregister(self, name: str = "") -> None:
        """Forget region ``name`` (every region when empty); a name not registered is no error (as Triton)."""
        names = [name] if name else [r.name for r in self.status()]
        for each in names:
            self._check_name(each)
            self._record(each).unlink(missing_ok=True)
            self._unmap(each)

    def status(self, name: str = "") -> list[Region]:
        """Region ``name`` (400 when it is not registered), or every region."""
        if name:
            self._check_name(name)
            region = self._registered(name)
            if region is None:
                raise InferenceError(400, f"Unable to find system shared memory region: {name!r}")
            return [region]
        if self._folder is None:
            return []
        regions = (self._read_record(path) for path in sorted(self._folder.glob("*.json")))
        return sorted((r for r in regions if r is not None), key=lambda r: r.name)

    def close(self) -> None:
        for name in list(self._mapped):
            self._unmap(name)
        if self._owned and self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    # --- tensors -----------------------------------------------------------------------------------
    def read(self, where: Placement, what: str) -> bytes:
        """The bytes an input's placement names (a copy)."""
        view, start = self._view(where, where.byte_size, what)
        return view[start : start + where.byte_size]

    def write(self, where: Placement, data: bytes, what: str) -> None:
        """Put an output's bytes where its placement says; 400 when they do not fit in its byte size."""
        if len(data) > where.byte_size:
            raise InferenceError(400, f"{what}: {len(data)} bytes do not fit the {where.byte_size} bytes of "
                                      f"shared_memory_byte_size")  # fmt: skip
        view, start = self._view(where, len(data), what)
        view[start : start + len(data)] = data

    def check(self, where: Placement, what: str) -> None:
        """400 now, before the model runs, for a placement an output could not be written to."""
        self._view(where, where.byte_size, what)

    def _view(self, where: Placement, length: int, what: str) -> tuple[mmap.mmap, int]:
        region = self._registered(where.region)
        if region is None:
            raise InferenceError(400, f"{what}: shared memory region {where.region!r} is not registered")
        if where.offset + length > region.byte_size:
            raise InferenceError(400, f"{what}: shared_memory_offset {where.offset} + {length} bytes exceeds the "
                                      f"{region.byte_size} bytes of region {region.name!r}")  # fmt: skip
        mapped = self._mapped.get(region.name)
        if mapped is None or mapped[0] != region:
            self._unmap(region.name)
            fd, size = self._open(region)
            mapped = self._mapped[region.name] = (region, fd, mmap.mmap(fd, size))
        _, fd, view = mapped
        if os.fstat(fd).st_size < region.offset + region.byte_size:  # shrunk since: the pages are gone
            raise InferenceError(400, f"{what}: the object {region.key!r} of region {region.name!r} is smaller "
                                      "than when it was registered")  # fmt: skip
        return view, region.offset + where.offset

    # --- files ---------------------------------------------------------------------------------------
    def _check_name(self, name: str) -> None:
        if not name or len(name.encode()) > MAX_NAME_BYTES:
            raise InferenceError(400, f"a region name must have 1 to {MAX_NAME_BYTES} bytes, got {name[:130]!r}")

    def _record(self, name: str) -> Path:
        return self.folder / f"{name.encode().hex()}.json"

    def _registered(self, name: str) -> Region | None:
        if self._folder is None or not name or len(name.encode()) > MAX_NAME_BYTES:
            return None
        return self._read_record(self._record(name))

    @staticmethod
    def _read_record(path: Path) -> Region | None:
        try:
            return Region(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):  # unregistered meanwhile (or being written: not yet a region)
            return None

    def _open(self, region: Region) -> tuple[int, int]:
        """A descriptor of the region's object and its size; 400 when it cannot be a region."""
        path = self._root / region.key.lstrip("/")
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as error:
            raise InferenceError(400, f"shared memory region {region.name!r}: cannot open object {region.key!r}: "
                                      f"{error.strerror}") from None  # fmt: skip
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            os.close(fd)
            raise InferenceError(400, f"shared memory region {region.name!r}: {region.key!r} is not a shared-memory "
                                      "object with data")  # fmt: skip
        return fd, info.st_size

    def _unmap(self, name: str) -> None:
        mapped = self._mapped.pop(name, None)
        if mapped is not None:
            mapped[2].close()
            os.close(mapped[1])
