"""``TorchWorker``: real PyTorch inference on the CPU or CUDA devices of this machine.

Models come from a repository. Registering a model reads its file once, keeps its
weights in host memory, binds a module per device, checks the config against the
model (warm-up of every batch size) and takes its profile from the repository or,
where none was measured for this device kind, from the warm-up runs and a timed copy.
A model that cannot be served is reported by name and reason; the others go on.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import msgspec
import torch

from mainspring.models.errors import ModelLoadError
from mainspring.models.loading import load_module, state_tensors
from mainspring.models.profile import ModelProfile
from mainspring.models.repository import ModelRepository
from mainspring.protocol import CPU_KIND, Action, DeviceSpec
from mainspring.protocol.devices import GpuMemory
from mainspring.protocol.models import ModelConfig
from mainspring.protocol.pages import DEFAULT_PAGE_BYTES, MIB
from mainspring.protocol.tensors import Sample
from mainspring.time import Clock, WallClock
from mainspring.worker.api import ResultCallback
from mainspring.worker.runtimes.device_memory import pool_after_registration
from mainspring.worker.runtimes.gpu_memory import GpuMemoryReader
from mainspring.worker.runtimes.host_weights import HostModel, PinningError, drop_weights
from mainspring.worker.runtimes.load_leftovers import LoadLeftovers
from mainspring.worker.runtimes.torch_device import ExecSettings, TorchDevice

log = logging.getLogger(__name__)

DEFAULT_CPU_POOL_BYTES = 2048 * MIB


def device_kind(device: torch.device) -> str:
    """The profile key of a device: ``cpu`` or the GPU's name (``nvidia-h200``)."""
    if device.type != "cuda":
        return CPU_KIND if device.type == "cpu" else device.type
    return torch.cuda.get_device_name(device).lower().replace(" ", "-")


def torch_device(name: str) -> torch.device:
    """``name`` as a device of this machine that a worker can serve, or a ValueError saying why not."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} is not a device name (cpu, cuda or cuda:N)") from None
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if (device.index or 0) >= count:
            raise ValueError(f"device {name!r} is not on this machine, which has {count} CUDA device(s)")
    elif device.type != "cpu":
        raise ValueError(f"device {name!r}: a worker serves cpu and cuda devices")
    return device


def default_pool_bytes(device: torch.device) -> int:
    """The page pool of a device not given one; 0: sized once the models are registered (a GPU's)."""
    return 0 if device.type == "cuda" else DEFAULT_CPU_POOL_BYTES


# While a model registers, the interpreter switches threads this often instead of every 5 ms. Reading a
# model (torch.export builds its graph in Python) and warming it up hold the interpreter in long runs,
# and an inference on the exec lane needs it between operators: with the default interval each of its
# calls waited 150-164 ms on average during a load, 36-43 ms at this one (quiet: 22 ms; resnet18 64x64
# on this 2-core machine; benchmarks/reload_stall.py measures it live).
LOAD_SWITCH_INTERVAL_S = 50e-6


@contextmanager
def switching_often(interval_s: float = LOAD_SWITCH_INTERVAL_S) -> Iterator[None]:
    """Run the block with the interpreter's switch interval at ``interval_s``, then restore it."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, interval_s))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class TorchWorker:
    """Executes actions on real devices; results arrive through ``on_result`` from the lane threads."""

    def __init__(
        self,
        repo: ModelRepository,
        on_result: ResultCallback,
        devices: Sequence[str] = ("cpu",),
        *,
        models: Iterable[str] | None = None,
        pool_bytes: int | None = None,
        page_bytes: int = DEFAULT_PAGE_BYTES,
        settings: ExecSettings | None = None,
        clock: Clock | None = None,
        use_stored_profiles: bool = True,
        on_lost: Callable[[str], None] | None = None,
        keep_load_leftovers: bool = False,
    ) -> None:
        """``on_lost``: told (once, after the result that says so) when a device's CUDA context is lost, which
        only a new process recovers from. ``keep_load_leftovers``: keep what reading a model leaves in the process
        (``load_leftovers.py``), as before issue 55; only ``benchmarks/worker_churn.py`` compares."""
        self.repo = repo
        self.settings = settings or ExecSettings()
        self.use_stored_profiles = use_stored_profiles
        if self.settings.intra_op_threads is not None:
            torch.set_num_threads(self.settings.intra_op_threads)  # process-wide: one worker process per device
        torch.backends.cudnn.benchmark = False  # the same kernels every run
        self._clock = clock or WallClock()
        self._devices: list[TorchDevice] = []
        for index, name in enumerate(devices):
            target = torch_device(name)
            pool = pool_bytes if pool_bytes is not None else default_pool_bytes(target)
            if pool == 0 and target.type != "cuda":
                raise ValueError(f"{name}: a page pool of 0 bytes (only a GPU's is sized after registration)")
            spec = DeviceSpec(index, device_kind(target), pool, page_bytes)
            self._devices.append(TorchDevice(spec, target, self._clock, on_result, self.settings, on_lost))
        kinds = {d.spec.kind for d in self._devices}
        if len(kinds) > 1:
            raise ValueError(f"one worker serves one device kind, got {sorted(kinds)}")
        self.kind = kinds.pop()
        self._models: dict[str, tuple[ModelConfig, ModelProfile]] = {}
        self._versions: dict[str, int] = {}
        self._load_ns: dict[str, int] = {}  # how long each registration took
        self._gpus = GpuMemoryReader([d.device for d in self._devices], self._clock)
        self._lock = threading.Lock()
        self.leftovers = LoadLeftovers(enabled=not keep_load_leftovers)
        self.load_errors: dict[str, str] = {}
        for model in repo.models() if models is None else models:
            try:
                self.register(model)
            except ModelLoadError as error:
                self.load_errors[model] = str(error)
                log.error("not serving %s: %s", model, error)
        for device in self._devices:
            if not device.pool_open:
                self._size_pool(device)

    def _size_pool(self, device: TorchDevice) -> None:
        """Open a GPU's page pool in the memory left once the models are registered (``device_memory.py``)."""
        with torch.cuda.device(device.device):
            torch.cuda.empty_cache()  # what the caching allocator holds from the warm-ups is free to the pool
        free, _ = torch.cuda.mem_get_info(device.device)
        weights = [config_and_profile[1].weights_bytes for config_and_profile in self._models.values()]
        size, outside = pool_after_registration(free, device.spec.page_bytes, weights, device.activation_peaks.values())
        device.open_pool(size)
        log.info("%s: a page pool of %.0f MiB (%.0f MiB free after registering %d models; %s)",
                 device.device, size / MIB, free / MIB, len(weights), outside.describe())  # fmt: skip

    @property
    def devices(self) -> Sequence[DeviceSpec]:
        return [d.spec for d in self._devices]

    def profiles(self) -> Mapping[str, ModelProfile]:
        return {name: profile for name, (_, profile) in self._models.items()}

    def configs(self) -> Mapping[str, ModelConfig]:
        return {name: config for name, (config, _) in self._models.items()}

    def version_of(self, model: str) -> int:
        return self._versions[model]

    def load_ns_of(self, model: str) -> int:
        return self._load_ns.get(model, 0)

    def gpu_memory(self) -> tuple[GpuMemory, ...]:
        return self._gpus.read()

    def resident_models(self, device: int = 0) -> frozenset[str]:
        return self._devices[device].resident_models

    def register(self, model: str, version: int | None = None, served_as: str = "") -> ModelProfile:
        """Read, check and warm up ``model`` (kept under ``served_as`` when given: a reload in place);
        ``ModelLoadError`` (naming the file and the reason) if it cannot serve."""
        key = served_as or model
        with self._lock, switching_often():  # the exec lane keeps serving the models already here
            if key in self._models:
                raise ModelLoadError(f"model {key!r} is already registered")
            try:
                begin = self._clock.now_ns()
                with self.leftovers.reading(key):
                    profile = self._register(model, version, key)
                self._load_ns[key] = self._clock.now_ns() - begin
                return profile
            except ModelLoadError:
                raise
            except Exception as error:  # a bad config, a profile that does not validate: this model alone fails
                for device in self._devices:
                    device.remove(key)
                reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
                raise ModelLoadError(f"model {model!r}: {reason}") from error

    def _register(self, model: str, version: int | None, key: str) -> ModelProfile:
        """``register`` under the lock: read the file, hold its weights, warm it up on every device, profile it."""
        config, module = load_module(self.repo, model, version, self._devices[0].device)
        if key != model:
            config = msgspec.structs.replace(config, name=key)
        first = self._devices[0]
        try:
            pin_for = first.device if first.device.type == "cuda" else None
            host = HostModel.from_tensors(config, state_tensors(module), first.spec.page_bytes, pin_for)
        except PinningError as error:  # page-locked host memory is limited: refuse this model alone
            drop_weights(module)  # moved to the GPU already, perhaps
            reason = f"cannot hold its weights in page-locked host memory: {error}"
            raise ModelLoadError(f"model {model!r}: {reason}") from None
        timings: dict[int, list[int]] = {}
        try:
            for index, device in enumerate(self._devices):
                module_here = module if index == 0 else load_module(self.repo, model, version, device.device)[1]
                timings = device.add(host, module_here)
        except Exception as error:  # whatever the model raises (torch.export's guards: AssertionError)
            for device in self._devices:
                device.remove(key)
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ModelLoadError(
                f"model {model!r}: does not run as {self.repo.config_file(model, version)} describes it: {reason}"
            ) from error
        profile = self._stored_profile(model, host, version) or self._measured_profile(host, timings)
        self._models[key] = (config, profile)
        self._versions[key] = self.repo.latest_version(model) if version is None else version
        self.load_errors.pop(model, None)
        log.info(
            "serving %s (%d tensors, %.1f MB, %d pages)",
            key,
            len(host.host),
            host.weights_bytes / 1e6,
            len(host.layout),
        )
        return profile

    def unregister(self, model: str) -> None:
        """Stop serving ``model`` and free its pages. The controller must not send it actions afterwards."""
        with self._lock:
            self._models.pop(model, None)
            self._load_ns.pop(model, None)
            for device in self._devices:
                device.remove(model)
            self.leftovers.forget(model)

    def submit(self, action: Action, inputs: Sequence[Sample] | None = None) -> None:
        if not 0 <= action.device < len(self._devices):
            raise ValueError(
                f"action {action.action_id} names device {action.device}, this worker has {len(self._devices)}"
            )
        self._devices[action.device].submit(action, inputs)

    def close(self) -> None:
        for device in self._devices:
            device.close()

    def settle(self, timeout_s: float = 60.0) -> bool:
        """Wait until every device's CUDA graph captures are done (``TorchDevice.settle``)."""
        return all(device.settle(timeout_s) for device in self._devices)

    def _stored_profile(self, model: str, host: HostModel, version: int | None) -> ModelProfile | None:
        """The repository's profile for this device kind, unless it is unreadable or describes another
        model than the one registered (other weights, other batch sizes): then the warm-up's figures."""
        if not self.use_stored_profiles:
            return None
        try:
            stored = self.repo.profile(model, self.kind, version)
        except ValueError as error:
            log.warning("%s: ignoring its stored profile (%s); measuring here instead", model, error)
            return None
        if stored is None:
            return None
        stale = []
        if stored.weights_bytes != host.weights_bytes:
            stale.append(f"{stored.weights_bytes} bytes of weights, the model has {host.weights_bytes}")
        if sorted(stored.exec_ns) != sorted(host.config.batch_sizes):
            stale.append(f"batch sizes {sorted(stored.exec_ns)}, the config has {sorted(host.config.batch_sizes)}")
        if stale:
            log.warning("%s: its stored profile is stale (%s); measuring here instead", model, "; ".join(stale))
            return None
        log.info("%s: using the profile stored in the repository for %s", model, self.kind)
        return stored.renamed(host.config.name)

    def _measured_profile(self, host: HostModel, timings: Mapping[int, list[int]]) -> ModelProfile:
        """A first profile from the warm-up runs (the median of each: registration may overlap other work, and the
        controller's estimator replaces these figures with its own measurements within a few actions) and one timed
        copy of the weights into memory that was touched before."""
        scratch = [torch.zeros_like(t, device=self._devices[0].device) for t in host.host]
        begin = self._clock.now_ns()
        for target, source in zip(scratch, host.host, strict=True):
            target.copy_(source)
        if self._devices[0].device.type == "cuda":
            torch.cuda.synchronize(self._devices[0].device)
        load_ns = self._clock.now_ns() - begin
        return ModelProfile(
            model=host.config.name,
            device_kind=self.kind,
            weights_bytes=host.weights_bytes,
            load_ns=max(1, load_ns),
            exec_ns={b: sorted(runs)[len(runs) // 2] for b, runs in timings.items()},
            tensor_bytes=host.tensor_bytes,
        )
