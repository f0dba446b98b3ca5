"""What the frontends show of several cells: one metrics text with a ``cell`` label; cells that join later."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mainspring.cells.membership import Phase
from mainspring.controller.service import ControllerService
from mainspring.frontend.cells_port import CellsPort, merge_expositions
from mainspring.frontend.dataplane import DataPlane, InferenceError
from mainspring.frontend.remote import RemoteController

CELL_TEXT = """# HELP mainspring_requests_total Requests answered
# TYPE mainspring_requests_total counter
mainspring_requests_total{model="a",outcome="success"} 3.0
mainspring_requests_total{model="odd}name",outcome="success"} 1.0
# HELP mainspring_devices Connected devices
# TYPE mainspring_devices gauge
mainspring_devices 2.0
"""


@contextlib.asynccontextmanager
async def one_cell(service: ControllerService, tmp_path: Path) -> AsyncIterator[CellsPort]:
    """A started port over one cell: ``service`` behind a hub on an ipc socket."""
    from mainspring.controller.frontends import FrontendHub

    hub = FrontendHub(service, f"ipc://{tmp_path}/cell-0")
    await hub.start()
    cells = CellsPort("frontend-1", [hub.endpoint], [f"ipc://{tmp_path}/cell-0-signal"])
    await cells.start(timeout_s=5)
    try:
        yield cells
    finally:
        await cells.close()
        await hub.close()


def test_every_sample_gets_its_cell_and_each_family_stays_whole() -> None:
    merged = merge_expositions([(0, CELL_TEXT.encode()), (1, CELL_TEXT.replace("3.0", "5.0").encode())]).decode()
    families = {f.name: f for f in text_string_to_metric_families(merged)}  # a strict parser reads it
    requests = families["mainspring_requests"].samples
    assert sorted((s.labels["cell"], s.labels["model"], s.value) for s in requests) == [
        ("0", "a", 3.0), ("0", "odd}name", 1.0), ("1", "a", 5.0), ("1", "odd}name", 1.0)
    ]  # fmt: skip
    assert [(s.labels, s.value) for s in families["mainspring_devices"].samples] == [
        ({"cell": "0"}, 2.0), ({"cell": "1"}, 2.0)
    ]  # fmt: skip
    assert merged.count("# TYPE mainspring_devices gauge") == 1


def test_a_cell_with_a_family_the_first_lacks_still_has_its_header() -> None:
    other = "# HELP extra_total An extra\n# TYPE extra_total counter\nextra_total 1.0\n"
    merged = merge_expositions([(0, CELL_TEXT.encode()), (1, other.encode())]).decode()
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    assert [(s.labels, s.value) for s in families["extra"].samples] == [({"cell": "1"}, 1.0)]


def test_a_frontend_follows_the_cells_file_and_reaches_a_tcp_cell_only_with_the_secret(tmp_path: Path) -> None:
    """Cells on Ray: a cell listed after the frontend started (the server's cells file) is joined and
    served, over a TCP port the worker secret guards; a frontend with another secret is not let in."""
    from mainspring.controller.frontends import FrontendHub
    from tests.controller.test_service import tensor, with_service
    from tests.serving.processes import free_ports
    from tests.waiting import until

    async def test(service: ControllerService, _: DataPlane, __: object) -> None:
        channel, signal = free_ports(2)
        hub = FrontendHub(service, f"tcp://127.0.0.1:{channel}", secret="the secret")
        await hub.start()
        listed = tmp_path / "cells.json"
        cells = CellsPort("frontend-1", [], [], secret="the secret", cells_file=str(listed))
        await cells.start(timeout_s=5)
        outsider = RemoteController(hub.endpoint, "outsider", secret="another secret")
        values = np.arange(6, dtype=np.float32).reshape(2, 3)
        try:
            with pytest.raises(InferenceError, match="not served yet"):  # no cell yet: 503
                await DataPlane(cells).infer("a", None, [tensor(values)], None, {})
            listed.write_text(json.dumps([[hub.endpoint, f"tcp://127.0.0.1:{signal}", False]]))
            await until(lambda: len(cells.cells) == 1 and cells.device_count == 2, timeout_s=10)
            _, outputs = await DataPlane(cells).infer("a", None, [tensor(values)], None, {})
            np.testing.assert_array_equal(outputs[0].data, values)  # the echo model: its own answer
            with pytest.raises(TimeoutError):  # CURVE refuses its handshake: it never joins
                await outsider.start(timeout_s=1.0)
            listed.write_text(json.dumps([[hub.endpoint, f"tcp://127.0.0.1:{signal}", True]]))  # its node left
            await until(lambda: cells.device_count == 0 and not cells.models, timeout_s=10)
            with pytest.raises(InferenceError, match="not served"):
                await DataPlane(cells).infer("a", None, [tensor(values)], None, {})
        finally:
            await outsider.close()
            await cells.close()
            await hub.close()

    with_service(test)


def test_a_cell_that_no_longer_knows_the_frontend_is_joined_again(tmp_path: Path) -> None:
    """The frontend's socket reconnected under a new identity (a dropped TCP link): the live cell
    refuses its calls as from a stranger; the frontend joins it again instead of failing for good."""

    from tests.controller.test_service import tensor, with_service
    from tests.waiting import until

    async def test(service: ControllerService, _: DataPlane, __: object) -> None:
        async with one_cell(service, tmp_path) as cells:
            values = np.arange(3, dtype=np.float32).reshape(1, 3)
            cell = cells.cells[0]
            await cell._stop_receiving()  # a new socket, never joined: what the cell sees after the drop
            cell._open()  # a socket, never joined
            with pytest.raises(InferenceError, match="restarted since the call was sent"):  # its only cell
                await DataPlane(cells).infer("a", None, [tensor(values)], None, {})
            await until(lambda: cells.membership.phase(0) is Phase.LIVE and cell.joined, timeout_s=10)
            _, outputs = await DataPlane(cells).infer("a", None, [tensor(values)], None, {})
            np.testing.assert_array_equal(outputs[0].data, values)

    with_service(test)


def test_a_model_operation_a_restarted_cell_refuses_is_asked_again_after_joining_it(tmp_path: Path) -> None:
    """A load reaches a cell that no longer knows the frontend (as after its controller restarted):
    the frontend joins it again and asks once more, instead of failing the load."""

    from tests.controller.test_service import with_service

    async def test(service: ControllerService, _: DataPlane, __: object) -> None:
        async with one_cell(service, tmp_path) as cells:
            cell = cells.cells[0]
            await cell._stop_receiving()  # a new socket, never joined
            cell._open()  # a socket, never joined
            await cells.load_model("a", timeout_s=10)
            assert cell.joined and cells.membership.phase(0) is Phase.LIVE

    with_service(test)


def test_the_port_warms_a_model_on_its_cells_and_plans_over_their_real_pools(tmp_path: Path) -> None:
    """``ControllerPort.warm`` through the cells: the cell loads a model it does not hold (an unknown
    model warms nothing, and fails nothing); each cell reports its devices' pools, which the plan uses."""
    from mainspring.protocol import DeviceSpec
    from tests.controller.test_service import with_service

    async def test(service: ControllerService, _: DataPlane, __: object) -> None:
        async with one_cell(service, tmp_path) as cells:
            pool = 2 * DeviceSpec(0, "v100").total_pages * DeviceSpec(0, "v100").page_bytes
            assert cells.cells[0].pool_bytes == pool
            replan = cells._plan_tick()
            assert replan is not None and sorted(replan.placement) == ["a", "b"]
            assert [(c.devices, c.pool_bytes) for c in cells.membership.capacities()] == [(2, pool)]
            assert await cells.warm("a") is True
            assert await cells.warm("unknown") is False

    with_service(test)


def test_a_cell_signals_only_the_models_the_plan_shares_once_the_frontends_say(tmp_path: Path) -> None:
    """A cell's load signal carries, per model, when a batch of one would end there; routing reads it
    only for models served by several cells. Until the frontends' plan says which, a cell signals every
    model it holds; then only those (with one cell: none, so its signal costs nothing per model)."""
    from mainspring.serving.cell import Cell, CellRole
    from tests.controller.test_service import with_service
    from tests.waiting import until

    async def test(service: ControllerService, _: DataPlane, __: object) -> None:
        role = CellRole(0, f"ipc://{tmp_path}/cell-0", f"ipc://{tmp_path}/cell-0-signal")
        cell = Cell(role, service, "")
        await cell.start()
        assert await service.warm("a") is True
        await until(lambda: "a" in cell.signal().finish_ns)  # no frontend has said: every model held
        cells = CellsPort("frontend-1", [role.endpoint], [role.signal_endpoint], settles=True)  # as serve's
        try:
            await cells.start(timeout_s=5)  # its plan, in the background, says: none shared
            await until(lambda: cell._hub.signal_models == frozenset())
            await service.warm("a")  # (again, should the plan have let it go)
            await until(lambda: "a" in service.policy.residency.holders)  # type: ignore[attr-defined]
            assert cell.signal().finish_ns == {}  # held, not signalled
        finally:
            await cells.close()
            await cell.stop()

    with_service(test)
