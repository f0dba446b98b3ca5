"""The emulated device's lanes, driven by hand on a virtual clock."""

import random

import pytest

from mainspring.protocol import ActionStatus, DeviceSpec, EvictWeights, Infer, LoadWeights
from mainspring.sim.engine import EventLoop
from mainspring.time import NS_PER_MS, NS_PER_S
from mainspring.worker.runtimes.emulated import EmulatedDevice, NoiseModel
from tests.fakes import PAGE, ResultLog, profile

MS = NS_PER_MS


def make_device(pool_pages: int = 10, noise: NoiseModel | None = None) -> tuple[EventLoop, EmulatedDevice, ResultLog]:
    loop = EventLoop()
    log = ResultLog()
    profiles = {"a": profile("a", pages=4), "b": profile("b", pages=4), "big": profile("big", pages=11)}
    spec = DeviceSpec(0, "v100", pool_pages * PAGE, PAGE)
    device = EmulatedDevice(spec, profiles, loop, log, noise or NoiseModel.exact())
    return loop, device, log


def load(action_id: int, model: str, earliest: int = 0, latest: int = NS_PER_S) -> LoadWeights:
    return LoadWeights(action_id, 0, model, earliest, latest, 5 * MS)


def infer(action_id: int, model: str, earliest: int = 0, latest: int = NS_PER_S, size: int = 1) -> Infer:
    return Infer(action_id, 0, model, earliest, latest, 2 * MS, tuple(range(size)), size)


def test_exact_durations_and_timing() -> None:
    loop, device, log = make_device()
    device.submit(load(1, "a"))
    device.submit(infer(2, "a", earliest=5 * MS))
    loop.run()
    assert [r.status for r in log.results] == [ActionStatus.OK, ActionStatus.OK]
    assert log.by_id(1).timing is not None and log.by_id(1).timing.duration_ns == 5 * MS
    timing = log.by_id(2).timing
    assert timing is not None and (timing.begin_ns, timing.end_ns) == (5 * MS, 7 * MS)


def test_infer_on_non_resident_weights_is_refused_and_nothing_runs() -> None:
    loop, device, log = make_device()
    device.submit(infer(1, "a"))
    loop.run()
    assert log.by_id(1).status is ActionStatus.NOT_RESIDENT
    assert log.by_id(1).timing is None


def test_infer_waits_for_its_window_then_too_late_when_lane_busy_past_it() -> None:
    loop, device, log = make_device()
    device.submit(load(1, "a"))
    loop.run()
    # Lane busy 5..9 ms with a batch of 8; the next action must start by 6 ms: refused.
    device.submit(infer(2, "a", earliest=5 * MS, size=8))
    device.submit(infer(3, "a", earliest=5 * MS, latest=6 * MS))
    loop.run()
    assert log.by_id(2).status is ActionStatus.OK
    refused = log.by_id(3)
    assert refused.status is ActionStatus.TOO_LATE and refused.timing is None
    assert loop.now_ns() == 14 * MS  # the batch of 8 took 9 ms from 5 ms


def test_too_early_when_window_opens_beyond_the_wait_limit() -> None:
    loop, device, log = make_device()
    device.submit(load(1, "a", earliest=device.max_wait_ns + 1))
    loop.run()
    assert log.by_id(1).status is ActionStatus.TOO_EARLY


def test_lane_runs_in_order_of_earliest_not_of_arrival() -> None:
    loop, device, log = make_device()
    device.submit(load(1, "a"))
    loop.run()
    device.submit(infer(2, "a", earliest=20 * MS))
    device.submit(infer(3, "a", earliest=10 * MS))
    loop.run()
    begins = {r.action_id: r.timing.begin_ns for r in log.results if r.timing is not None}
    assert begins[3] == 10 * MS and begins[2] == 20 * MS
    assert [r.action_id for r in log.results[1:]] == [3, 2]


def test_out_of_memory_and_evict_frees_exactly_its_pages() -> None:
    loop, device, log = make_device(pool_pages=10)
    device.submit(load(1, "a"))
    device.submit(load(2, "b"))
    device.submit(load(3, "big"))
    loop.run()
    assert log.by_id(3).status is ActionStatus.OUT_OF_MEMORY
    assert device.pool.used_pages == 8
    device.submit(EvictWeights(4, 0, "a", loop.now_ns(), loop.now_ns() + MS, 0))
    device.submit(infer(5, "a", earliest=loop.now_ns() + MS))
    loop.run()
    assert log.by_id(4).status is ActionStatus.OK
    assert device.pool.used_pages == 4 and device.resident_models == {"b"}
    assert log.by_id(5).status is ActionStatus.NOT_RESIDENT
    assert device.peak_used_pages == 8


def test_load_and_infer_lanes_run_concurrently() -> None:
    loop, device, log = make_device()
    device.submit(load(1, "a"))
    loop.run()
    device.submit(infer(2, "a", earliest=loop.now_ns(), size=8))  # 9 ms
    device.submit(load(3, "b", earliest=loop.now_ns()))  # 5 ms, on the other lane
    loop.run()
    t2, t3 = log.by_id(2).timing, log.by_id(3).timing
    assert t2 is not None and t3 is not None
    assert t2.begin_ns == t3.begin_ns == 5 * MS


def test_evict_during_inference_does_not_disturb_it() -> None:
    loop, device, log = make_device()
    device.submit(load(1, "a"))
    loop.run()
    device.submit(infer(2, "a", earliest=loop.now_ns(), size=8))
    device.submit(EvictWeights(3, 0, "a", loop.now_ns() + MS, loop.now_ns() + 2 * MS, 0))
    loop.run()
    assert log.by_id(2).status is ActionStatus.OK and log.by_id(3).status is ActionStatus.OK


def test_noise_is_seeded_and_multiplicative() -> None:
    noise = NoiseModel(jitter_sigma=0.05, spike_probability=0.01, spike_min_factor=2.0, spike_max_factor=3.0)
    first = [noise.apply(1_000_000, random.Random(7)) for _ in range(3)]
    assert first == [noise.apply(1_000_000, random.Random(7)) for _ in range(3)]
    samples = [noise.apply(1_000_000, rng) for rng in [random.Random(3)] for _ in range(20_000)]
    spikes = sum(s > 1_500_000 for s in samples)
    assert 100 < spikes < 320  # ~1% spikes
    ordinary = sorted(s for s in samples if s < 1_500_000)
    assert 0.99e6 < ordinary[len(ordinary) // 2] < 1.01e6
    assert NoiseModel.exact().apply(1_234, random.Random(1)) == 1_234


def test_bad_noise_model_is_refused() -> None:
    with pytest.raises(ValueError, match="spike factors"):
        NoiseModel(spike_min_factor=3.0, spike_max_factor=2.0)


def test_noise_models_are_named_as_the_command_lines_take_them() -> None:
    assert NoiseModel.named("default") == NoiseModel() and NoiseModel.named("exact") == NoiseModel.exact()
    shared = NoiseModel.named("shared-cpu")
    rng = random.Random(5)
    slow = sum(shared.apply(1_000_000, rng) > 1_400_000 for _ in range(20_000))
    assert 800 < slow < 1_400  # 5% of runs spike to 1.5-3.5x, besides the wider jitter
    with pytest.raises(ValueError, match="unknown noise model 'gpu'; choose from default, exact, shared-cpu"):
        NoiseModel.named("gpu")
