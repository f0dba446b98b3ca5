"""The load signal on the wire (``cells/wire.py``): real ZeroMQ sockets on loopback TCP, as cells on
Ray use them."""

from __future__ import annotations

import asyncio

from mainspring.cells.routing import CellSignal
from mainspring.cells.wire import SignalPublisher, SignalSubscriber, on_this_clock
from tests.serving.processes import free_port
from tests.waiting import until


def test_a_signal_from_another_machines_clock_is_read_on_this_ones() -> None:
    """Times move with the signal's moment onto the receiver's clock: what is 3 ms ahead there is 3 ms
    ahead here, whatever the two clocks read."""
    far = CellSignal(1, at_ns=9_000_000_000_000, devices=2, finish_ns={"m": 9_000_003_000_000},
                     cold_start_ns=9_000_001_000_000, incarnation=7)  # fmt: skip
    here = on_this_clock(far, received_ns=5_000_000)
    assert here == CellSignal(1, 5_000_000, 2, {"m": 8_000_000}, 6_000_000, 7)


def test_only_a_subscriber_with_the_secret_hears_a_tcp_cell() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    signal = CellSignal(0, 1, 1, {"m": 2}, 1, 5)

    async def test() -> None:
        publisher = SignalPublisher(endpoint, lambda: signal, secret="the secret")
        publisher.start()
        heard: list[CellSignal] = []
        overheard: list[CellSignal] = []
        subscriber = SignalSubscriber([endpoint], heard.append, secret="the secret")
        stranger = SignalSubscriber([endpoint], overheard.append, secret="another secret")
        plain = SignalSubscriber([endpoint], overheard.append)
        for listener in (subscriber, stranger, plain):
            listener.start()
        try:

            async def tick_until_heard() -> bool:
                publisher._last_shape = None  # every tick sends
                publisher.tick()
                return bool(heard)

            await until(tick_until_heard, timeout_s=10)
            for _ in range(20):  # the others had as long, and more
                publisher._last_shape = None
                publisher.tick()
                await asyncio.sleep(0.01)
            assert heard[0].finish_ns.keys() == {"m"} and heard[0].incarnation == 5
            assert not overheard
        finally:
            for listener in (subscriber, stranger, plain):
                await listener.close()
            publisher.close()

    asyncio.run(test())
