"""Bookkeeping every policy needs besides its decisions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from mainspring.models.profile import ModelProfile
from mainspring.protocol import ActionResult, DeviceSpec, Outcome, Request, Response
from mainspring.protocol.model_names import client_name


class PolicyBookkeeping:
    """Answers waiting to be handed out, action ids, page counts per model, and the
    refusal of requests no device could ever serve."""

    def __init__(self, profiles: Mapping[str, ModelProfile]) -> None:
        self.profiles: dict[str, ModelProfile] = dict(profiles)  # owned: models come and go (``Membership``)
        self._responses: list[Response] = []
        self._next_action_id = 0
        self._pages: dict[tuple[str, int], int] = {}

    def _answer(self, request: Request, outcome: Outcome, reason: str = "", action_id: int | None = None) -> None:
        self._responses.append(Response(request.id, outcome, reason, action_id))

    def _answer_served(self, batch: Sequence[Request], result: ActionResult, action_id: int) -> None:
        """Answer a batch that ran: served, except the requests whose own input failed (run alone)."""
        failed = result.failed or {}
        for index, request in enumerate(batch):
            if index in failed:
                self._answer(request, Outcome.INPUT_FAILED, f"inference failed on this input: {failed[index]}")
            elif index in result.unchecked:
                reason = f"inference failed on its batch ({result.message}); no time to run this request alone"
                self._answer(request, Outcome.INFERENCE_FAILED, reason)
            else:
                self._answer(request, Outcome.SERVED, action_id=action_id)

    def _take_responses(self) -> list[Response]:
        responses, self._responses = self._responses, []
        return responses

    def number_actions_from(self, first: int) -> None:
        """Action ids start at ``first`` (cells: each cell's ids apart from the others', in merged logs)."""
        self._next_action_id = first - 1

    def _new_action_id(self) -> int:
        self._next_action_id += 1
        return self._next_action_id

    def pages_of(self, model: str, spec: DeviceSpec) -> int:
        """Pages ``model`` occupies on a device of ``spec`` (cached: profiles do not change)."""
        key = (model, spec.page_bytes)
        pages = self._pages.get(key)
        if pages is None:
            pages = self._pages[key] = self.profiles[model].pages(spec.page_bytes)
        return pages

    def adoptable(self, spec: DeviceSpec) -> list[tuple[str, int]]:
        """The models a joining device already holds that this policy serves, with their pages, in the
        order reported, as many as fit its pool (``add_device``: a worker rejoining a restarted
        controller keeps its weights, and the policy books them as loaded), then every served model
        without weights (resident wherever a worker registered it: nothing to load)."""
        adopted, free = [], spec.total_pages
        weightless = [model for model, profile in self.profiles.items() if profile.weightless]
        for model in dict.fromkeys([*spec.resident, *weightless]):
            if model in self.profiles and (pages := self.pages_of(model, spec)) <= free:
                adopted.append((model, pages))
                free -= pages
        return adopted

    def add_model(self, profile: ModelProfile) -> None:
        """Serve a new model (``Membership``); its profile is all a policy needs to plan it."""
        if profile.model in self.profiles:
            raise ValueError(f"model {profile.model!r} is already served")
        self.profiles[profile.model] = profile
        if profile.weightless:
            self._hold_everywhere(profile.model)

    def _hold_weightless(self) -> None:
        """Book every model without weights as resident on every device (a policy built with its devices)."""
        for model, profile in self.profiles.items():
            if profile.weightless:
                self._hold_everywhere(model)

    def _hold_everywhere(self, model: str) -> None:
        """Book ``model``, which has no weights, as resident on every device (each policy its own way)."""
        raise NotImplementedError(f"{type(self).__name__} does not serve models without weights")

    def evictable(self, model: str) -> bool:
        """May a policy evict ``model``? Not one without weights: it frees nothing, and is always resident."""
        profile = self.profiles.get(model)
        return profile is None or not profile.weightless

    def _forget_model(self, model: str) -> None:
        del self.profiles[model]
        for key in [k for k in self._pages if k[0] == model]:
            del self._pages[key]

    def _refuse_unservable(self, request: Request, specs: Iterable[DeviceSpec]) -> bool:
        """Answer with an error a request for an unknown model or one that fits on no device."""
        if request.model not in self.profiles:
            self._answer(request, Outcome.UNKNOWN_MODEL, f"unknown model {client_name(request.model)!r}")
            return True
        any_device = False
        for spec in specs:  # stops at the first device it fits: asked for every request
            if self.pages_of(request.model, spec) <= spec.total_pages:
                return False
            any_device = True
        if not any_device:
            self._answer(request, Outcome.NO_WORKER, "no worker is connected")
        else:
            name = client_name(request.model)
            self._answer(request, Outcome.DOES_NOT_FIT, f"model {name!r} does not fit on any device")
        return True
