"""The machine the simulated processes share: by default each frontend and each cell's controller has a
core of its own; on a machine with fewer cores than processes wanting one, each runs slower.

``MachineShare(cores, background)``: ``cores`` in all, ``background`` of them busy with what the simulation
does not run as a core of its own (on a benchmark machine: the emulated workers' processes and the load
generator). A piece of work starting while more processes want a core than there are takes longer in
proportion (processor sharing, judged when the piece starts). It exists to predict a small test machine's
knee (``benchmarks/knee_live_vs_sim.py``); a production server gives its processes cores of their own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MachineShare:
    cores: float
    background: float = 0.0  # cores busy with processes that are not simulated as cores

    def __post_init__(self) -> None:
        if self.cores <= 0 or self.background < 0:
            raise ValueError(f"a machine needs cores > 0 and a background >= 0, got {self.cores}, {self.background}")


class Machine:
    """How many simulated cores are working now, and how long a piece of work takes on the machine."""

    def __init__(self, share: MachineShare | None = None) -> None:
        self.share = share
        self.working = 0

    def start(self, ns: int) -> int:
        """``ns`` of one process's work starting now: how long it takes (``end`` when it is done)."""
        self.working += 1
        share = self.share
        if share is None:
            return ns
        wanting = self.working + share.background
        return ns if wanting <= share.cores else round(ns * wanting / share.cores)

    def end(self) -> None:
        self.working -= 1
