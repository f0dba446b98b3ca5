"""A model reloaded in place is known to the policy by its key (``name@n``); what a client reads in an
answer names it as the client does, for every policy, without rewriting the reason's text afterwards."""

from __future__ import annotations

import random

import pytest

from mainspring.protocol import DeviceSpec, Outcome
from mainspring.protocol.model_names import MODEL_KEY, MODEL_NAME, client_name, reload_key
from mainspring.scheduler.base import Membership
from mainspring.scheduler.registry import make_scheduler, policy_names
from tests.fakes import PAGE, profile, request


def test_a_reload_key_maps_back_to_its_name_and_no_repository_folder_has_one() -> None:
    key = reload_key("resnet18", 2)
    assert client_name(key) == "resnet18" and client_name("resnet18") == "resnet18"
    assert MODEL_KEY.fullmatch(key) and not MODEL_NAME.fullmatch(key)


@pytest.mark.parametrize("policy", policy_names())
def test_the_answers_of_a_reloaded_model_name_it_as_clients_do(policy: str) -> None:
    key = reload_key("m", 2)
    devices = [DeviceSpec(0, "v100", 64 * PAGE, PAGE)]
    scheduler = make_scheduler(policy, {key: profile(key)}, devices, random.Random(0))
    assert isinstance(scheduler, Membership)
    scheduler.on_request(request(1, key, 0), 0)
    scheduler.remove_model(key, 0)
    (answer,) = scheduler.schedule(0).responses
    assert answer.outcome is Outcome.MODEL_UNLOADED and answer.reason == "model 'm' was unloaded"

    big = reload_key("big", 3)
    scheduler.add_model(profile(big, pages=10_000))  # more pages than the device has
    scheduler.on_request(request(2, big, 0), 0)
    (refused,) = scheduler.schedule(0).responses
    assert refused.outcome is Outcome.DOES_NOT_FIT and refused.reason == "model 'big' does not fit on any device"
