"""A cell that comes back (its controller restarted) or joins late is brought in line with the other
cells before it serves: a repository change made while it was down (a load, reload or unload through the
API reaches only the cells that are up) is applied to it when it returns. Without this, a restarted cell
served again a model the user had unloaded (its workers still held it), 200 having been answered.

Until then the cell is *settling*: the server's port sends it a model's requests only where a settled peer
serves that model at the same version and config (with no settled peer there is nothing to compare with:
it serves what it holds), and makes the changes it missed; then it tells the cell, whose state says so to
every frontend (``in_line``). A frontend process's port routes to a cell only once it is in line: a cell
(re)started is not, until then.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from mainspring.frontend.port import ServedModel
from mainspring.frontend.remote import RemoteController

LOAD, RELOAD, UNLOAD = "load", "reload", "unload"
Change = tuple[str, str]  # (LOAD, RELOAD or UNLOAD; the model)
Models = Mapping[str, ServedModel]


def same(one: ServedModel, other: ServedModel) -> bool:
    return one.version == other.version and one.config == other.config


def differences(own: Models, peers: Sequence[Models]) -> list[Change]:
    """What a cell serving ``own`` must change to serve what its settled ``peers`` serve: unload a model
    none serves, load one it lacks, reload one it serves at another version or config."""
    changes: list[Change] = []
    for name in sorted(own):
        served = [peer[name] for peer in peers if name in peer]
        if not served:
            changes.append((UNLOAD, name))
        elif not any(same(own[name], other) for other in served):
            changes.append((RELOAD, name))
    wanted = {name for peer in peers for name in peer}
    changes += [(LOAD, name) for name in sorted(wanted - set(own))]
    return changes


def agrees(model: str, own: Models, peers: Sequence[Models]) -> bool:
    """``own`` serves ``model`` as a settled peer does (or there is no peer to ask)."""
    served = own.get(model)
    if served is None:
        return False
    return not peers or any(same(served, peer[model]) for peer in peers if model in peer)


def change_call(change: Change) -> Callable[[RemoteController], Awaitable[None]]:
    """What makes ``change`` on one cell."""
    what, model = change
    if what == LOAD:
        return lambda cell: cell.load_model(model)
    if what == RELOAD:
        return lambda cell: cell.reload_model(model)
    return lambda cell: cell.unload_model(model)
