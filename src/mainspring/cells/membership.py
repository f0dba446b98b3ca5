"""Which cells a frontend can use, as a state machine per cell (``frontend/cells_port.py`` carries out
its effects).

A cell is JOINING until this frontend is taken in (at the start, after a restart, or when a live cell
no longer knows it); then LIVE while its load signal comes, SILENT once it has not for ``stale_ns``
(no new request goes to it, but what it holds is left to it); DEAD once its process is known to have
exited or a signal comes from a new run of it (the calls it held fail at once: it never answers them);
DEPARTED for good (its node left). Pure: the time comes from the injected clock, and every event
returns the effects (``Effect``) the port must carry out, in order.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mainspring.cells.placement import CellCapacity
from mainspring.protocol.pages import DEFAULT_POOL_BYTES
from mainspring.time import NS_PER_S, Clock

STALE_NS = NS_PER_S  # a cell silent this long is taken as gone


class Phase(enum.Enum):
    JOINING = "joining"
    LIVE = "live"
    SILENT = "silent"
    DEAD = "dead"
    DEPARTED = "departed"


class Do(enum.Enum):
    FAIL_WAITING = "fail the calls the cell holds (they are tried elsewhere); ``text``: why it is gone"
    DISCONNECT = "drop the cell's socket"
    REJOIN = "join the cell again on a fresh socket, then report ``rejoined``"
    SETTLE = "bring the cell in line with its peers before it serves (``cells_settle``)"
    LOG = "log ``text``"
    WARN = "log ``text`` as a warning"


@dataclass(frozen=True)
class Effect:
    do: Do
    cell: int
    text: str = ""


@dataclass
class Member:
    phase: Phase = Phase.JOINING
    seen_ns: int | None = None  # its last signal
    incarnation: int | None = None  # the run of its process that signalled last
    rejoining: bool = False  # a REJOIN is under way
    settling: bool = False  # back from a restart, or joined late: serves only as its settled peers do
    devices: int = 0  # its last report with devices (a restarting cell keeps its place in the plan)
    pool_bytes: int = 0


class Membership:
    """Every cell's phase; ``settles``: this port brings returning cells in line (the server's port)."""

    def __init__(self, clock: Clock, settles: bool = False, stale_ns: int = STALE_NS) -> None:
        self._clock = clock
        self._settles = settles
        self.stale_ns = stale_ns
        self.members: list[Member] = []

    def phase(self, index: int) -> Phase:
        return self.members[index].phase

    # --- events -------------------------------------------------------------------------------------
    def add(self, late: bool = False) -> tuple[int, list[Effect]]:
        """A new cell, JOINING; one added after the start may have missed a change: it settles."""
        self.members.append(Member())
        index = len(self.members) - 1
        return index, self._settle(index) if late else []

    def joined(self, index: int) -> list[Effect]:
        """The cell took this frontend in (its state came)."""
        member = self.members[index]
        if member.phase is Phase.JOINING and not member.rejoining:
            member.phase = self._heard(member)
        return []

    def signal(self, index: int, incarnation: int) -> list[Effect]:
        """A load signal from the cell's run ``incarnation``."""
        member = self.members[index]
        if member.phase is Phase.DEPARTED:
            return []
        effects: list[Effect] = []
        known, member.incarnation = member.incarnation, incarnation
        if known is not None and known != incarnation and member.phase in (Phase.LIVE, Phase.SILENT):
            effects += self._die(index, "it was restarted", disconnect=False)  # the rejoin replaces the socket
        member.seen_ns = self._clock.now_ns()
        if member.phase is Phase.SILENT:
            member.phase = Phase.LIVE
            effects.append(Effect(Do.LOG, index, f"cell {index} signals again"))
        elif member.phase is Phase.DEAD and not member.rejoining:  # a new run: it knows this frontend no more
            effects += self._rejoin(index)
        return effects

    def tick(self) -> list[Effect]:
        """Live cells whose signal is stale turn silent (logged once)."""
        effects = []
        for index, member in enumerate(self.members):
            if member.phase is Phase.LIVE and member.seen_ns is not None and not self._fresh(member):
                member.phase = Phase.SILENT
                effects.append(Effect(Do.WARN, index, f"cell {index} sent no load signal for "
                                      f"{self.stale_ns / NS_PER_S:g} s: no new request goes to it"))  # fmt: skip
        return effects

    def exited(self, index: int, why: str) -> list[Effect]:
        """The cell's process is gone (idempotent)."""
        if self.members[index].phase in (Phase.DEAD, Phase.DEPARTED):
            return []
        return self._die(index, why, disconnect=True)

    def never_ran(self, index: int) -> list[Effect]:
        """A live cell refused a call as from a stranger (it no longer knows this frontend): join it again."""
        member = self.members[index]
        if member.phase not in (Phase.LIVE, Phase.SILENT) or member.rejoining:
            return []
        member.phase = Phase.JOINING
        return self._rejoin(index)

    def rejoined(self, index: int, ok: bool, why: str = "") -> list[Effect]:
        """A REJOIN ended: taken back, or not (then the next signal tries again)."""
        member = self.members[index]
        member.rejoining = False
        if member.phase is Phase.DEPARTED:
            return [Effect(Do.DISCONNECT, index)] if ok else []  # it left while this ran: it stays gone
        if not ok:
            member.phase = Phase.DEAD
            return [Effect(Do.WARN, index, f"cell {index} did not take this frontend back: {why}")]
        member.phase = self._heard(member)
        return [Effect(Do.LOG, index, f"cell {index} is back")]

    def departed(self, index: int, why: str) -> list[Effect]:
        """The cell is gone for good (its node left): as ``exited``, and it counts nowhere from now on."""
        member = self.members[index]
        if member.phase is Phase.DEPARTED:
            return []
        effects = [] if member.phase is Phase.DEAD else self._die(index, why, disconnect=True, settle=False)
        member.phase = Phase.DEPARTED
        member.settling = False
        return effects

    def settled(self, index: int) -> None:
        self.members[index].settling = False

    def report(self, index: int, devices: int, pool_bytes: int) -> None:
        """The cell's devices and their pools together (0: an old cell that does not say: the default
        pool per device); a report without devices (a cell restarting) keeps the last one."""
        if devices > 0:
            member = self.members[index]
            member.devices, member.pool_bytes = devices, pool_bytes or devices * DEFAULT_POOL_BYTES

    # --- views --------------------------------------------------------------------------------------
    def is_live(self, index: int) -> bool:
        """Taken in and its signal fresh (read now, whatever ``tick`` has seen)."""
        member = self.members[index]
        return member.phase in (Phase.LIVE, Phase.SILENT) and self._fresh(member)

    def taken_in(self, index: int) -> bool:
        """A call can reach it (joined, not dead, no rejoin under way): the others would only make a call
        wait out its bound."""
        return self.members[index].phase in (Phase.LIVE, Phase.SILENT)

    def reachable(self) -> list[int]:
        return [i for i in range(len(self.members)) if self.taken_in(i)]

    def present(self) -> list[int]:
        return [i for i, m in enumerate(self.members) if m.phase is not Phase.DEPARTED]

    def down(self, index: int) -> bool:
        """Its process is gone (for now or for good)."""
        return self.members[index].phase in (Phase.DEAD, Phase.DEPARTED)

    def capacities(self) -> list[CellCapacity]:
        """What the planner plans over: every cell still there that reported devices once."""
        return [CellCapacity(i, m.devices, m.pool_bytes) for i, m in enumerate(self.members)
                if m.phase is not Phase.DEPARTED and m.devices > 0]  # fmt: skip

    # --- helpers ------------------------------------------------------------------------------------
    def _fresh(self, member: Member) -> bool:
        return member.seen_ns is not None and self._clock.now_ns() - member.seen_ns <= self.stale_ns

    def _heard(self, member: Member) -> Phase:
        return Phase.LIVE if self._fresh(member) or member.seen_ns is None else Phase.SILENT

    def _die(self, index: int, why: str, disconnect: bool, settle: bool = True) -> list[Effect]:
        member = self.members[index]
        effects = [Effect(Do.FAIL_WAITING, index, why)]
        if disconnect and not member.rejoining:  # a rejoin under way replaces the socket itself
            effects.append(Effect(Do.DISCONNECT, index))
        member.phase = Phase.DEAD
        return effects + (self._settle(index) if settle else [])

    def _rejoin(self, index: int) -> list[Effect]:
        member = self.members[index]
        member.rejoining = True
        if member.phase is Phase.DEAD:
            member.phase = Phase.JOINING
        return [Effect(Do.REJOIN, index)]

    def _settle(self, index: int) -> list[Effect]:
        member = self.members[index]
        if not self._settles or member.settling or member.phase is Phase.DEPARTED:
            return []
        member.settling = True
        return [Effect(Do.SETTLE, index)]
