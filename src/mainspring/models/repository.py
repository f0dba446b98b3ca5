"""The model repository on disk: ``<repo>/<model>/<version>/`` with a model file and ``config.json``,
or Triton's layout, ``<repo>/<model>/config.pbtxt`` beside numbered version folders holding the
model file (``models/triton_config.py``); both may sit in one repository.

``config.json`` names the format and file, the inputs and outputs (KServe datatypes,
shapes with -1 for the batch dimension), the supported batch sizes and the runtime.
``profile.json`` beside it (written by ``mainspring profile``) holds measured profiles,
one per device kind, in the format the simulator reads.

Names come from clients (the repository API), so a model name is one plain path component
and nothing it names may lead outside the repository, through ``..`` or a symbolic link.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import msgspec

from mainspring.models.errors import ModelLoadError
from mainspring.models.profile import ModelProfile, builtin_profiles, dump_profiles, load_profiles
from mainspring.protocol.model_names import MODEL_NAME
from mainspring.protocol.models import ModelConfig

CONFIG_FILE = "config.json"
PROFILE_FILE = "profile.json"


class ModelRepository:
    """A folder of models; the served version of a model is its highest version."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ModelLoadError(f"model repository {self.root} is not a folder")

    def models(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if self._inside(p) and self.versions(p.name))

    def versions(self, model: str) -> list[int]:
        folder = self._folder(model)
        if not folder.is_dir():
            return []
        triton = self.is_triton(model)
        return sorted(
            int(p.name)
            for p in folder.iterdir()
            if p.name.isdigit() and self._inside(p) and ((triton and p.is_dir()) or (p / CONFIG_FILE).is_file())
        )

    def is_triton(self, model: str) -> bool:
        """The model is laid out as Triton's: ``config.pbtxt`` beside its version folders."""
        from mainspring.models.triton_config import TRITON_CONFIG

        return (self._folder(model) / TRITON_CONFIG).is_file()

    def latest_version(self, model: str) -> int:
        """The version served: the highest, or the one a Triton ``version_policy`` selects."""
        versions = self.versions(model)
        if not versions:
            raise ModelLoadError(f"model {model!r} is not in repository {self.root}")
        if self.is_triton(model):
            from mainspring.models.triton_config import served_version

            return served_version(self._folder(model), versions)
        return versions[-1]

    def path(self, model: str, version: int | None = None) -> Path:
        folder = self._folder(model) / str(self.latest_version(model) if version is None else version)
        if not self._inside(folder):
            raise ModelLoadError(f"model {model!r}: {folder} leads outside the repository")
        return folder

    def config_file(self, model: str, version: int | None = None) -> Path:
        """The model's config: Triton's ``config.pbtxt`` beside its versions, or the version's ``config.json``."""
        from mainspring.models.triton_config import TRITON_CONFIG

        return (
            self._folder(model) / TRITON_CONFIG if self.is_triton(model) else self.path(model, version) / "config.json"
        )

    def _folder(self, model: str) -> Path:
        if not MODEL_NAME.fullmatch(model):
            raise ModelLoadError(f"model name {model!r} is not a plain name (letters, digits, '_', '.', '-')")
        folder = self.root / model
        if not self._inside(folder):
            raise ModelLoadError(f"model {model!r}: {folder} leads outside the repository")
        return folder

    def _inside(self, path: Path) -> bool:
        """``path`` (a plain name below the root) stays inside the repository once links are followed."""
        return MODEL_NAME.fullmatch(path.name) is not None and path.resolve().is_relative_to(self.root.resolve())

    def fingerprint(self, model: str) -> tuple[tuple[str, int, int], ...]:
        """What changes when anything in the model's folder does: each file's path, size and modification time."""
        folder = self._folder(model)
        files = []
        for path in folder.rglob("*"):
            with contextlib.suppress(OSError):  # a file removed while the folder is read
                if path.is_file():
                    stat = path.stat()
                    files.append((str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
        return tuple(sorted(files))

    def config(self, model: str, version: int | None = None) -> ModelConfig:
        if self.is_triton(model):
            from mainspring.models.triton_config import read_triton_config

            return read_triton_config(self._folder(model), self.path(model, version))
        file = self.path(model, version) / CONFIG_FILE
        try:
            config = msgspec.json.decode(file.read_bytes(), type=ModelConfig)
        except OSError as error:
            raise ModelLoadError(f"cannot read {file}: {error.strerror}") from None
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as error:
            raise ModelLoadError(f"bad config {file}: {error}") from None
        if config.name != model:
            raise ModelLoadError(f"bad config {file}: name {config.name!r} does not match its folder {model!r}")
        return config

    def model_file(self, model: str, version: int | None = None) -> Path:
        """The model's file; ``ModelLoadError`` if it is a link that leads outside the repository."""
        file = self.path(model, version) / self.config(model, version).file
        if not file.resolve().is_relative_to(self.root.resolve()):
            raise ModelLoadError(f"model {model!r}: {file} leads outside the repository")
        return file

    def write(self, config: ModelConfig, version: int = 1) -> Path:
        """Create the version folder and its ``config.json``; returns the folder (the model file goes there)."""
        folder = self.root / config.name / str(version)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_FILE).write_text(json.dumps(msgspec.to_builtins(config), indent=2) + "\n")
        return folder

    def profiles(self, model: str, version: int | None = None) -> list[ModelProfile]:
        file = self.path(model, version) / PROFILE_FILE
        return load_profiles(file) if file.is_file() else []

    def profile(self, model: str, device_kind: str, version: int | None = None) -> ModelProfile | None:
        return next((p for p in self.profiles(model, version) if p.device_kind == device_kind), None)

    def write_profile(self, profile: ModelProfile, version: int | None = None) -> Path:
        """Store ``profile``, replacing an older one of the same device kind."""
        file = self.path(profile.model, version) / PROFILE_FILE
        kept = [p for p in self.profiles(profile.model, version) if p.device_kind != profile.device_kind]
        dump_profiles([*kept, profile], file, source="measured by mainspring profile")
        return file

    def all_profiles(self, device_kind: str | None = None) -> list[ModelProfile]:
        """Every stored profile (of one device kind if given): what ``mainspring simulate --profiles REPO`` reads."""
        found = []
        for model in self.models():
            found += [p for p in self.profiles(model) if device_kind in (None, p.device_kind)]
        return found


def profiles_from(source: Path | None) -> list[ModelProfile]:
    """The profiles in ``source``: a profile file, a profiled model repository, or (None) the built-in ones;
    ``ValueError`` naming it when it holds none."""
    if source is None:
        return builtin_profiles()
    if source.is_dir():
        found = ModelRepository(source).all_profiles()
        if not found:
            raise ValueError(f"repository {source} holds no profiles: run `mainspring profile {source}`")
        return found
    return load_profiles(source)
