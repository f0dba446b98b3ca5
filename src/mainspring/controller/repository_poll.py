"""Triton's poll mode (``serve --repository-poll-s``): what changes in the model repository is served.

Every period the poller reads a fingerprint of each model's folder (every file's path, size and
modification time). A model whose folder appeared is loaded, one whose folder changed is reloaded in
place (no request refused; a failure leaves the old version served), one whose folder is gone is
unloaded. Each change is tried once: a broken model is tried again when its files change again,
not on every poll. The repository API keeps working beside it: a model unloaded by hand stays
unloaded until its files change.
"""

from __future__ import annotations

import asyncio
import logging

from mainspring.controller.service import ControllerService
from mainspring.frontend.port import ServiceError
from mainspring.models.errors import ModelLoadError
from mainspring.models.repository import ModelRepository

log = logging.getLogger(__name__)

Fingerprints = dict[str, tuple[tuple[str, int, int], ...]]


class RepositoryPoller:
    def __init__(self, service: ControllerService, repo: ModelRepository, period_s: float) -> None:
        if period_s <= 0:
            raise ValueError(f"repository_poll_s must be positive, got {period_s}")
        self.service = service
        self.repo = repo
        self.period_s = period_s
        self._seen: Fingerprints | None = None

    async def run(self) -> None:
        """Poll until cancelled; the first reading is the baseline (what serving started from)."""
        while True:
            await self.poll()
            await asyncio.sleep(self.period_s)

    async def poll(self) -> list[str]:
        """One poll: bring what is served in line with what changed since the last; what was done, in words."""
        now = await asyncio.to_thread(self._fingerprints)
        if self._seen is None:
            self._seen = now
            return []
        done = []
        for name in sorted(now.keys() | self._seen.keys()):
            if now.get(name) == self._seen.get(name):
                continue
            try:
                done.append(await self._follow(name, name in now))
            except (ServiceError, ModelLoadError) as error:
                done.append(f"{name}: {error}")
                log.warning("repository poll: %s changed, and serving the change failed: %s", name, error)
            else:
                log.info("repository poll: %s", done[-1])
            if name in now:  # tried once per change, whether it worked or not
                self._seen[name] = now[name]
            else:
                del self._seen[name]
        return done

    async def _follow(self, name: str, present: bool) -> str:
        served = name in self.service.models
        if not present:
            if not served:
                return f"{name}: gone from the repository (not served)"
            await self.service.unload_model(name)
            return f"{name}: gone from the repository, unloaded"
        if served:
            await self.service.reload_model(name)
            return f"{name}: changed, reloaded"
        await self.service.load_model(name)
        return f"{name}: new in the repository, loaded"

    def _fingerprints(self) -> Fingerprints:
        found: Fingerprints = {}
        for name in self.repo.models():
            try:
                found[name] = self.repo.fingerprint(name)
            except ModelLoadError as error:  # e.g. a folder that leads outside the repository
                log.warning("repository poll: %s", error)
        return found
