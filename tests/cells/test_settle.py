"""What a cell that returns must change to serve what the other cells serve (``cells_settle.py``)."""

from __future__ import annotations

from mainspring.frontend.cells_settle import LOAD, RELOAD, UNLOAD, agrees, differences
from mainspring.frontend.port import ServedModel
from mainspring.models.profile import builtin_profiles
from mainspring.worker.emulated_worker import echo_config


def served(name: str, version: int = 1, batch_sizes: tuple[int, ...] = (1, 2)) -> ServedModel:
    profile = builtin_profiles()[0].renamed(name)
    return ServedModel(echo_config(name, batch_sizes), profile, version)


def test_a_returning_cell_unloads_what_no_peer_serves_loads_what_it_lacks_and_reloads_what_changed() -> None:
    own = {"a": served("a"), "b": served("b"), "c": served("c"), "d": served("d", batch_sizes=(1,))}
    peers = [{"b": served("b"), "c": served("c", version=2), "d": served("d"), "e": served("e")}]
    assert differences(own, peers) == [(UNLOAD, "a"), (RELOAD, "c"), (RELOAD, "d"), (LOAD, "e")]
    assert differences(own, [own]) == []
    assert not agrees("a", own, peers) and agrees("b", own, peers) and not agrees("c", own, peers)
    assert not agrees("e", own, peers)  # it does not serve it (yet)
    assert agrees("a", own, [])  # no settled peer: nothing to compare with


def test_one_peer_serving_it_alike_is_enough() -> None:
    """Peers that differ among themselves (a load that failed on one): the returning cell matches either."""
    own = {"a": served("a", version=2)}
    peers = [{"a": served("a", version=1)}, {"a": served("a", version=2)}]
    assert differences(own, peers) == [] and agrees("a", own, peers)
