"""A small model repository exported once per test session, and a helper to run actions on a worker."""

from __future__ import annotations

import queue
from pathlib import Path

from mainspring.models.loading import export_zoo_model
from mainspring.models.repository import ModelRepository
from mainspring.protocol import ActionResult, EvictWeights, Infer, LoadWeights
from mainspring.time import NS_PER_S, WallClock

# Small enough for a test on two CPU cores, big enough that a batch of 8 takes tens of milliseconds.
RESNET_ARGS = {"image_size": 48}
ZOO_SET = (("mlp", "torch_export", {}), ("resnet18", "torchscript", RESNET_ARGS), ("bert_tiny", "safetensors", {}))


def export_small_zoo(root: Path) -> ModelRepository:
    repo = ModelRepository(root) if root.is_dir() else ModelRepository(_mkdir(root))
    for name, fmt, args in ZOO_SET:
        export_zoo_model(repo, name, fmt=fmt, args=args)
    return repo


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


class Results:
    """Collects results delivered from the worker's threads; ``wait`` returns the one for an action."""

    def __init__(self) -> None:
        self._queue: queue.Queue[ActionResult] = queue.Queue()
        self._seen: dict[int, ActionResult] = {}
        self.clock = WallClock()
        self._next_id = 0

    def put(self, result: ActionResult) -> None:
        self._queue.put(result)

    def wait(self, action_id: int, timeout_s: float = 30.0) -> ActionResult:
        while action_id not in self._seen:
            result = self._queue.get(timeout=timeout_s)
            assert result.action_id not in self._seen, f"action {result.action_id} answered twice"
            self._seen[result.action_id] = result
        return self._seen[action_id]

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def load(self, model: str, start_in_ms: float = 0, device: int = 0) -> LoadWeights:
        now = self.clock.now_ns()
        start = now + round(start_in_ms * 1e6)
        return LoadWeights(self.new_id(), device, model, start, start + NS_PER_S, 0)

    def evict(self, model: str, start_in_ms: float = 0, device: int = 0) -> EvictWeights:
        start = self.clock.now_ns() + round(start_in_ms * 1e6)
        return EvictWeights(self.new_id(), device, model, start, start + NS_PER_S, 0)

    def infer(self, model: str, requests: int, batch: int, start_in_ms: float = 0, device: int = 0) -> Infer:
        start = self.clock.now_ns() + round(start_in_ms * 1e6)
        ids = tuple(range(1000 * self._next_id, 1000 * self._next_id + requests))
        return Infer(self.new_id(), device, model, start, start + NS_PER_S, 0, request_ids=ids, batch_size=batch)
