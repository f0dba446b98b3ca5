"""Which models a peer holds in "device" memory, for the peers' many-models runs.

Mainspring's worker holds at most ``--pool-mib`` of weights; a peer given the same memory holds
at most ``capacity`` models and evicts the least recently used one to make room (Ray Serve's
``@serve.multiplexed`` does exactly this; Triton has no automatic eviction, so its server uses this
class too). Two ways to bring a model in:

- ``docs``: read the model file from the repository on every load, as the peers' documentation
  shows (``torch.export.load`` of a resnet18 takes a few hundred ms here);
- ``expert``: every model's weights are read once at start and kept in host memory; a load copies
  them into the module being evicted when it has the same layout (``load_state_dict``, 5 ms for
  resnet18 here; a ``deepcopy`` of an exported module otherwise, 174 ms), the best a user would
  build on the peer.

Used only by the peer servers in this folder (run in their own environments).
"""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict

import torch
from torch import nn

from mainspring.models.loading import load_module
from mainspring.models.repository import ModelRepository
from mainspring.models.zoo import example_inputs

LOADINGS = ("docs", "expert")


def _layout(module: nn.Module) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((name, tuple(t.shape)) for name, t in module.state_dict().items())


class Residency:
    """At most ``capacity`` resident modules (None: all, loaded at start); LRU eviction; thread-safe."""

    def __init__(self, repo: ModelRepository, models: list[str], capacity: int | None, loading: str) -> None:
        if loading not in LOADINGS:
            raise ValueError(f"loading must be one of {LOADINGS}, got {loading!r}")
        self.repo = repo
        self.capacity = capacity if capacity is not None else len(models)
        self.loading = loading
        self.loads = 0
        self.load_seconds = 0.0
        self._lock = threading.Lock()
        self._resident: OrderedDict[str, nn.Module] = OrderedDict()
        self._host: dict[str, nn.Module] = {}
        if loading == "expert":
            self._host = {m: load_module(repo, m)[1] for m in models}
        for model in models[: self.capacity]:
            self.warm_up(model, self.get(model))
        self.loads = 0
        self.load_seconds = 0.0

    def get(self, model: str) -> nn.Module:
        """The model's resident module, loading it (and evicting the least recently used) if needed."""
        with self._lock:
            module = self._resident.get(model)
            if module is not None:
                self._resident.move_to_end(model)
                return module
            started = time.perf_counter()
            victim = self._resident.popitem(last=False)[1] if len(self._resident) >= self.capacity else None
            module = self._load(model, victim)
            self._resident[model] = module
            self.loads += 1
            self.load_seconds += time.perf_counter() - started
            return module

    def warm_up(self, model: str, module: nn.Module) -> None:
        """Run every batch size once: the first call of an exported module at a size is slow."""
        config = self.repo.config(model)
        for size in config.batch_sizes:
            run_batch(module, list(example_inputs(config.inputs, size)))

    def _load(self, model: str, victim: nn.Module | None) -> nn.Module:
        if self.loading == "docs":
            return load_module(self.repo, model)[1]
        host = self._host[model]
        # the same layout is enough: exported modules of one architecture each get their own class
        if victim is not None and _layout(victim) == _layout(host):
            with torch.no_grad():
                victim.load_state_dict(host.state_dict())
            return victim
        return copy.deepcopy(host)


def run_batch(module: nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """One forward pass, its outputs as a list."""
    with torch.inference_mode():
        out = module(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]
