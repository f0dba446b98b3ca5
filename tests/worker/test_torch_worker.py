"""The torch worker on this CPU: real inference on paged weights, windows, refusals, versioning."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch

from mainspring.models.profiler import sample_inputs
from mainspring.models.repository import ModelRepository
from mainspring.models.zoo import build_model
from mainspring.protocol import ActionStatus
from mainspring.protocol.pages import MIB
from mainspring.protocol.tensors import TensorSpec
from mainspring.worker.torch_worker import TorchWorker
from tests.torch_models import RESNET_ARGS, Results

POOL = 256 * MIB


@pytest.fixture
def results() -> Results:
    return Results()


@pytest.fixture
def worker(small_zoo: ModelRepository, results: Results) -> Iterator[TorchWorker]:
    w = TorchWorker(small_zoo, results.put, pool_bytes=POOL)
    yield w
    w.close()


def run(worker: TorchWorker, results: Results, action: object, inputs: object = None) -> object:
    worker.submit(action, inputs)  # type: ignore[arg-type]
    return results.wait(action.action_id)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("model", "args"), [("mlp", {}), ("resnet18", RESNET_ARGS), ("bert_tiny", {})])
def test_outputs_equal_an_eager_forward_of_the_same_weights(
    worker: TorchWorker, results: Results, model: str, args: dict[str, int]
) -> None:
    config = worker.configs()[model]
    assert run(worker, results, results.load(model)).status is ActionStatus.OK
    samples = sample_inputs(config, 3, seed=11)
    result = run(worker, results, results.infer(model, requests=3, batch=4), samples)  # padded 3 -> 4
    assert result.status is ActionStatus.OK, result.message
    assert len(result.outputs) == 3 and result.timing.duration_ns > 0
    reference = build_model(model, args)
    inputs = [torch.from_numpy(np.concatenate([s[spec.name] for s in samples])) for spec in config.inputs]
    with torch.inference_mode():
        expected = reference(*inputs).numpy()
    name = config.outputs[0].name
    got = np.concatenate([o[name] for o in result.outputs])
    assert got.shape == expected.shape and got.shape[0] == 3
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_weights_live_in_pages_and_no_tensor_straddles_a_page(worker: TorchWorker, results: Results) -> None:
    assert run(worker, results, results.load("resnet18")).status is ActionStatus.OK
    device = worker._devices[0]
    pages = device.pool.page_numbers("resnet18")
    assert pages == list(range(worker.profiles()["resnet18"].pages(16 * MIB)))
    arena = device.arena.tensor
    base, page_bytes = arena.data_ptr(), device.spec.page_bytes
    binding = device._bindings["resnet18"]
    for param in binding.params:
        start = param.data_ptr() - base
        end = start + param.numel() * param.element_size() - 1
        assert 0 <= start < arena.numel(), "a parameter is not in the page arena"
        assert start // page_bytes == end // page_bytes, "a tensor straddles two pages"
        assert start // page_bytes in pages


def test_a_model_that_does_not_fit_is_refused_and_evict_frees_exactly_its_pages(
    small_zoo: ModelRepository, results: Results
) -> None:
    worker = TorchWorker(small_zoo, results.put, pool_bytes=4 * 16 * MIB)  # 4 pages; resnet18 needs 3
    try:
        resnet_pages = worker.profiles()["resnet18"].pages(16 * MIB)
        bert_pages = worker.profiles()["bert_tiny"].pages(16 * MIB)
        assert resnet_pages + bert_pages > 4
        assert run(worker, results, results.load("resnet18")).status is ActionStatus.OK
        refused = run(worker, results, results.load("bert_tiny"))
        assert refused.status is ActionStatus.OUT_OF_MEMORY and "bert_tiny" in refused.message
        pool = worker._devices[0].pool
        assert pool.used_pages == resnet_pages
        assert run(worker, results, results.evict("resnet18")).status is ActionStatus.OK
        assert pool.used_pages == 0
        assert run(worker, results, results.load("bert_tiny")).status is ActionStatus.OK
        assert pool.used_pages == bert_pages
    finally:
        worker.close()


def test_window_refusals_run_nothing(worker: TorchWorker, results: Results) -> None:
    late = results.load("mlp", start_in_ms=-2000)  # window [now-2 s, now-1 s] has closed
    assert run(worker, results, late).status is ActionStatus.TOO_LATE
    early = results.load("mlp", start_in_ms=11_000)  # opens more than the lane's 10 s ahead
    assert run(worker, results, early).status is ActionStatus.TOO_EARLY
    assert worker.resident_models() == frozenset()
    waited = results.load("mlp", start_in_ms=50)
    result = run(worker, results, waited)
    assert result.status is ActionStatus.OK and result.timing.begin_ns >= waited.earliest_ns


def test_infer_refusals_name_the_problem(worker: TorchWorker, results: Results) -> None:
    samples = sample_inputs(worker.configs()["mlp"], 1)
    not_resident = run(worker, results, results.infer("mlp", 1, 1), samples)
    assert not_resident.status is ActionStatus.NOT_RESIDENT
    assert run(worker, results, results.load("mlp")).status is ActionStatus.OK
    unknown = run(worker, results, results.infer("nosuchmodel", 1, 1), samples)
    assert unknown.status is ActionStatus.ERROR and "nosuchmodel" in unknown.message
    bad_batch = run(worker, results, results.infer("mlp", 1, 3), samples)
    assert bad_batch.status is ActionStatus.ERROR and "batch size 3" in bad_batch.message
    wrong_dtype = [{"input": samples[0]["input"].astype(np.float64)}]
    refused = run(worker, results, results.infer("mlp", 1, 1), wrong_dtype)
    assert refused.status is ActionStatus.ERROR and "'input'" in refused.message and "FP64" in refused.message
    assert run(worker, results, results.infer("mlp", 1, 1), samples).status is ActionStatus.OK


class HeldForward:
    """While open, an inference of ``model`` on ``worker`` waits in its forward pass, once begun, until
    ``release`` is set (60 s at most): what runs meanwhile runs during the inference, however slow the machine."""

    def __init__(self, worker: TorchWorker, model: str) -> None:
        self.begun, self.release = threading.Event(), threading.Event()
        self._module = worker._devices[0]._bindings[model].module

    def __enter__(self) -> HeldForward:
        self._hook = self._module.register_forward_pre_hook(self._hold)
        return self

    def __exit__(self, *_: object) -> None:
        self.release.set()
        self._hook.remove()

    def _hold(self, module: object, args: object) -> None:
        self.begun.set()
        self.release.wait(60)


def test_load_runs_beside_an_inference_on_its_own_lane(worker: TorchWorker, results: Results) -> None:
    assert run(worker, results, results.load("mlp")).status is ActionStatus.OK
    samples = sample_inputs(worker.configs()["mlp"], 8)
    with HeldForward(worker, "mlp") as held:
        infer = results.infer("mlp", 8, 8)
        worker.submit(infer, samples)
        assert held.begun.wait(60)
        loaded = run(worker, results, results.load("bert_tiny"))  # on one lane it would wait for the inference
        held.release.set()
        done = results.wait(infer.action_id)
    assert loaded.status is ActionStatus.OK and done.status is ActionStatus.OK
    assert loaded.timing is not None and done.timing is not None
    assert done.timing.begin_ns <= loaded.timing.begin_ns <= loaded.timing.end_ns <= done.timing.end_ns


def test_an_evict_during_an_inference_turns_it_into_an_error_not_wrong_outputs(
    worker: TorchWorker, results: Results
) -> None:
    """The evict runs while the inference is in its forward pass: the outputs it computes on the weights
    that went away meanwhile are never returned."""
    assert run(worker, results, results.load("mlp")).status is ActionStatus.OK
    samples = sample_inputs(worker.configs()["mlp"], 8)
    with HeldForward(worker, "mlp") as held:
        infer = results.infer("mlp", 8, 8)
        worker.submit(infer, samples)
        assert held.begun.wait(60)
        evicted = run(worker, results, results.evict("mlp"))
        held.release.set()
        result = results.wait(infer.action_id)
    assert evicted.status is ActionStatus.OK and worker.resident_models() == frozenset()
    assert result.status is ActionStatus.ERROR and "evicted" in result.message and result.outputs is None


@pytest.fixture
def damaged_repo(small_zoo: ModelRepository, tmp_path: Path) -> ModelRepository:
    root = tmp_path / "repo"
    shutil.copytree(small_zoo.root, root)
    repo = ModelRepository(root)
    (repo.path("resnet18") / "model.pt").write_bytes(b"not a torchscript archive")
    config = repo.config("bert_tiny")
    wrong = msgspec.structs.replace(config, outputs=(TensorSpec("pooled", "FP32", (-1, 64)),))  # the model gives 128
    repo.write(wrong)
    return repo


def test_a_corrupt_file_and_a_wrong_shape_are_named_and_the_rest_is_served(
    damaged_repo: ModelRepository, results: Results
) -> None:
    worker = TorchWorker(damaged_repo, results.put, pool_bytes=POOL)
    try:
        assert set(worker.profiles()) == {"mlp"}
        assert "model.pt" in worker.load_errors["resnet18"] and "cannot load" in worker.load_errors["resnet18"]
        assert "'pooled'" in worker.load_errors["bert_tiny"] and "[-1, 64]" in worker.load_errors["bert_tiny"]
        assert run(worker, results, results.load("mlp")).status is ActionStatus.OK
        samples = sample_inputs(worker.configs()["mlp"], 2)
        assert run(worker, results, results.infer("mlp", 2, 2), samples).status is ActionStatus.OK
    finally:
        worker.close()


def test_profiles_count_pages_as_the_worker_packs_them(worker: TorchWorker) -> None:
    for name, profile in worker.profiles().items():
        assert profile.device_kind == "cpu" and profile.load_ns > 0
        assert set(profile.exec_ns) == set(worker.configs()[name].batch_sizes)
        assert profile.pages(16 * MIB) == len(worker._devices[0]._bindings[name].model.layout)


def test_a_failing_batch_is_run_again_one_request_at_a_time(worker: TorchWorker, results: Results) -> None:
    config = worker.configs()["bert_tiny"]
    assert run(worker, results, results.load("bert_tiny")).status is ActionStatus.OK
    good = sample_inputs(config, 3, seed=5)
    bad = {"input_ids": np.full((1, 32), -7, dtype=np.int64)}  # the embedding raises IndexError on it
    lone = run(worker, results, results.infer("bert_tiny", requests=1, batch=1), [bad])
    assert lone.status is ActionStatus.ERROR and "IndexError" in lone.message  # never served: the model's fault
    mixed = run(worker, results, results.infer("bert_tiny", requests=4, batch=4), [good[0], bad, good[1], good[2]])
    assert mixed.status is ActionStatus.OK and list(mixed.failed) == [1] and "IndexError" in mixed.failed[1]
    alone = run(worker, results, results.infer("bert_tiny", requests=3, batch=4), good)
    for index in (0, 2, 3):  # the neighbours' outputs are the ones they get in a batch without the bad input
        np.testing.assert_allclose(mixed.outputs[index]["pooled"], alone.outputs[index - 1 if index else 0]["pooled"],
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
    assert mixed.outputs[1] == {}
    lone = run(worker, results, results.infer("bert_tiny", requests=1, batch=1), [bad])
    assert lone.status is ActionStatus.OK and list(lone.failed) == [0]  # it has served: now the input's fault
    both = run(worker, results, results.infer("bert_tiny", requests=2, batch=2), [bad, bad])
    assert both.status is ActionStatus.ERROR  # every request failed alone: the batch's failure is the model's


def test_a_failing_batch_runs_requests_alone_only_while_their_deadlines_allow(
    worker: TorchWorker, results: Results
) -> None:
    config = worker.configs()["bert_tiny"]
    assert run(worker, results, results.load("bert_tiny")).status is ActionStatus.OK
    good = sample_inputs(config, 3, seed=5)
    bad = {"input_ids": np.full((1, 32), -7, dtype=np.int64)}
    now, second = results.clock.now_ns(), 10**9
    infer = msgspec.structs.replace(
        results.infer("bert_tiny", requests=4, batch=4),
        expected_duration_ns=50 * 10**6,
        deadlines_ns=(now + 10 * second, now + 10 * second, now, now + 10 * second),  # the third's has passed
    )
    mixed = run(worker, results, infer, [good[0], bad, good[1], good[2]])
    assert mixed.status is ActionStatus.OK and list(mixed.failed) == [1] and mixed.unchecked == (2,)
    assert "IndexError" in mixed.message  # the batch's failure, for the request that could not be checked
    assert mixed.outputs[0] and mixed.outputs[3] and mixed.outputs[2] == {}
    # No deadline left for any of them: nothing runs again; the model is not blamed.
    none = msgspec.structs.replace(infer, action_id=infer.action_id + 100, deadlines_ns=(now,) * 4)
    late = run(worker, results, none, [good[0], bad, good[1], good[2]])
    assert late.status is ActionStatus.OK and late.unchecked == (0, 1, 2, 3) and not late.failed


def test_a_model_that_fails_its_shape_guard_is_named_and_a_bad_stored_profile_is_measured_again(
    small_zoo: ModelRepository, tmp_path: Path, results: Results, caplog: pytest.LogCaptureFixture
) -> None:
    """torch.export's shape guard raises AssertionError (it once took the whole worker down); a
    profile that cannot be read, or that describes other weights, is measured again, not trusted."""
    from mainspring.models.loading import copy_model
    from mainspring.models.profile import ModelProfile, dump_profiles

    shutil.copytree(small_zoo.root, tmp_path / "repo")
    repo = ModelRepository(tmp_path / "repo")
    narrow = copy_model(repo, "mlp", "mlp_narrow")
    repo.write(msgspec.structs.replace(narrow, inputs=(TensorSpec("input", "FP32", (-1, 128)),)))  # the model takes 256
    copy_model(repo, "mlp", "mlp_unreadable")
    (repo.path("mlp_unreadable") / "profile.json").write_text("garbage")
    copy_model(repo, "mlp", "mlp_stale")
    stale = ModelProfile("mlp_stale", "cpu", 999, 1_000, {1: 1_000, 2: 1_000, 4: 1_000, 8: 1_000})
    dump_profiles([stale], repo.path("mlp_stale") / "profile.json", source="another model file")
    models = ["mlp", "mlp_narrow", "mlp_unreadable", "mlp_stale"]
    worker = TorchWorker(repo, results.put, models=models, pool_bytes=POOL)
    try:
        assert set(worker.profiles()) == {"mlp", "mlp_unreadable", "mlp_stale"}
        assert "does not run as" in worker.load_errors["mlp_narrow"], worker.load_errors
        weights = worker.profiles()["mlp"].weights_bytes
        assert worker.profiles()["mlp_stale"].weights_bytes == weights != 999
        assert worker.profiles()["mlp_unreadable"].weights_bytes == weights
        assert "mlp_unreadable: ignoring its stored profile" in caplog.text
        assert "mlp_stale: its stored profile is stale (999 bytes of weights" in caplog.text
        samples = sample_inputs(worker.configs()["mlp_stale"], 1)
        assert run(worker, results, results.load("mlp_stale")).status is ActionStatus.OK
        assert run(worker, results, results.infer("mlp_stale", 1, 1), samples).status is ActionStatus.OK
    finally:
        worker.close()


def test_models_of_one_input_signature_share_their_input_buffers_and_each_answers_with_its_own_weights(
    tmp_path: Path, results: Results
) -> None:
    """A buffer per model and batch size stayed on the device for every registered model (19 MB for a
    224x224 image model with sizes up to 16): models whose inputs agree share one set instead."""
    from mainspring.models.loading import export_zoo_model

    repo = ModelRepository(tmp_path)
    export_zoo_model(repo, "mlp", seed=1)
    export_zoo_model(repo, "mlp", served_as="mlp_other", seed=2)  # the same inputs, other weights
    export_zoo_model(repo, "mlp", served_as="mlp_wide", batch_sizes=(1, 2, 4, 8, 16), seed=3)
    worker = TorchWorker(repo, results.put, pool_bytes=POOL)
    try:
        device = worker._devices[0]
        buffers = {name: device._bindings[name].inputs for name in ("mlp", "mlp_other", "mlp_wide")}
        for batch in (1, 2, 4, 8):
            assert buffers["mlp"][batch][0] is buffers["mlp_other"][batch][0] is buffers["mlp_wide"][batch][0]
        one_set = sum(b[0].numel() * b[0].element_size() for b in buffers["mlp_wide"].values())
        assert device.inputs.bytes == one_set  # not three sets
        for model in ("mlp", "mlp_other"):
            assert run(worker, results, results.load(model)).status is ActionStatus.OK
        samples = {model: sample_inputs(worker.configs()[model], 3, seed=seed) for model, seed in
                   (("mlp", 5), ("mlp_other", 6))}  # fmt: skip
        for model, seed in (("mlp", 1), ("mlp_other", 2), ("mlp", 1)):  # turn about on the same buffers
            result = run(worker, results, results.infer(model, requests=3, batch=4), samples[model])
            assert result.status is ActionStatus.OK, result.message
            inputs = torch.from_numpy(np.concatenate([s["input"] for s in samples[model]]))
            with torch.inference_mode():
                expected = build_model("mlp", seed=seed)(inputs).numpy()
            np.testing.assert_allclose(
                np.concatenate([o["logits"] for o in result.outputs]), expected, rtol=1e-4, atol=1e-5
            )
    finally:
        worker.close()


def test_a_model_warms_up_on_buffers_of_its_own_and_shared_buffers_go_with_their_last_user(
    small_zoo: ModelRepository, tmp_path: Path, results: Results
) -> None:
    """A model registering while the exec lane runs another must not write into the buffers that one
    is using; unregistering frees the buffers only once no model uses them."""
    from mainspring.models.loading import copy_model

    shutil.copytree(small_zoo.root, tmp_path / "repo")
    repo = ModelRepository(tmp_path / "repo")
    copy_model(repo, "mlp", "mlp_copy")
    worker = TorchWorker(repo, results.put, models=["mlp"], pool_bytes=POOL)
    try:
        device = worker._devices[0]
        shared = device._bindings["mlp"].inputs
        with torch.inference_mode():
            for buffers in shared.values():
                buffers[0].fill_(7.0)  # what an inference on the exec lane would have copied in
        worker.register("mlp_copy")
        assert device._bindings["mlp_copy"].inputs == shared
        assert all(bool((buffers[0] == 7.0).all()) for buffers in shared.values())
        held = device.inputs.bytes
        worker.unregister("mlp_copy")
        assert device.inputs.bytes == held > 0
        worker.unregister("mlp")
        assert device.inputs.bytes == 0
    finally:
        worker.close()


def test_a_padded_batch_pads_with_zeros_not_with_another_models_inputs(tmp_path: Path, results: Results) -> None:
    """With shared buffers the rows past a batch's requests held the last inputs of whichever model ran
    before: token ids past this model's vocabulary would fail its batch (on a GPU, a device-side assert)."""
    from mainspring.models.loading import export_zoo_model

    repo = ModelRepository(tmp_path)
    export_zoo_model(repo, "mlp", seed=1)
    export_zoo_model(repo, "mlp", served_as="mlp_other", seed=2)
    worker = TorchWorker(repo, results.put, pool_bytes=POOL)
    try:
        for model in ("mlp", "mlp_other"):
            assert run(worker, results, results.load(model)).status is ActionStatus.OK
        full = [{"input": np.full((1, 256), 5.0, np.float32)} for _ in range(4)]
        assert run(worker, results, results.infer("mlp", requests=4, batch=4), full).status is ActionStatus.OK
        one = [{"input": np.full((1, 256), 1.0, np.float32)}]
        assert run(worker, results, results.infer("mlp_other", requests=1, batch=4), one).status is ActionStatus.OK
        buffer = worker._devices[0]._bindings["mlp_other"].inputs[4][0]
        assert bool((buffer[0] == 1.0).all()) and not buffer[1:].any()
    finally:
        worker.close()
