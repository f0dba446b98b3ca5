"""``EmulatedWorker`` runs the emulated devices in real time behind the same interface as ``TorchWorker``."""

from __future__ import annotations

from mainspring.protocol import ActionStatus, DeviceSpec
from mainspring.worker.api import Worker
from mainspring.worker.emulated_worker import EmulatedWorker
from mainspring.worker.runtimes.emulated import NoiseModel
from tests.fakes import profile
from tests.torch_models import Results


def test_emulated_worker_loads_and_infers_in_real_time() -> None:
    results = Results()
    worker: Worker = EmulatedWorker(
        [DeviceSpec(0, "v100")],
        {"m": profile("m", exec_ms={1: 4.0, 2: 5.0}, load_ms=10)},
        results.put,
        NoiseModel.exact(),
    )
    try:
        assert set(worker.profiles()) == {"m"} and worker.devices[0].device == 0
        not_resident = results.infer("m", 2, 2)
        worker.submit(not_resident)
        assert results.wait(not_resident.action_id).status is ActionStatus.NOT_RESIDENT
        load = results.load("m")
        worker.submit(load)
        loaded = results.wait(load.action_id)
        assert loaded.status is ActionStatus.OK and loaded.timing.duration_ns == 10_000_000
        assert results.clock.now_ns() >= loaded.timing.end_ns
        infer = results.infer("m", 2, 2)
        worker.submit(infer)
        done = results.wait(infer.action_id)
        assert done.status is ActionStatus.OK and done.outputs == [None, None]
    finally:
        worker.close()
