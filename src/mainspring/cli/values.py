"""The one place where the command line's numbers are bounded: ``type=`` helpers for argparse.

Every numeric option is parsed by one of these, so a value that is not a number, not finite, or
out of range is told by argparse as ``mainspring CMD: error: argument --OPTION: ...`` (exit 2,
one line) before any command runs. The bounds are generous for real use and keep every run within
what one machine holds: a value past them (``--devices 1000000``, ``--duration-s inf``) filled the
memory or overflowed a conversion before it was refused.
"""

from __future__ import annotations

import argparse
import math
import re
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

DAY_S = 86_400.0
MAX_DEVICES = 4096  # simulated or planned devices (a simulated 10,000 took 13 s and 850 MB to set up)
MAX_MODELS = 1_000_000  # model copies (plan: 28 s and 1 GB at this; 10 million filled 7 GB)
MAX_POOL_GIB = 4096.0  # weight pool per device
MAX_PAGE_MIB = 4096
MAX_RATE_RPS = 10_000_000.0  # besides the arrivals' own limit (MAX_ARRIVALS over the run)
MAX_TRACE_SCALE = 1_000_000.0
MAX_SCALE_FACTOR = 1000.0  # plan --what-if-scale
MAX_SLO_MS = 86_400_000.0  # a day, as ``protocol.requests.slo_problem``
# The shortest span and SLO taken: 1e-300 s passed as positive and was 0 ns once converted.
MIN_S = 0.001
MIN_SLO_MS = 0.001
MAX_NETWORK_LATENCY_US = 1_000_000.0  # simulate: a second each way, past any SLO a run could keep
MAX_CLIENTS = 10_000  # closed loop: clients x outstanding are all in flight at time 0
MAX_OUTSTANDING = 100
MAX_SEED = 2**63 - 1
MAX_PORT = 65_535
MAX_POOL_MIB = 2**24  # 16 TiB
MAX_CORE = 4095
MAX_PID = 2**22  # Linux's pid_max ceiling
MAX_TEXT = 40  # characters of a bad value quoted back
MAX_PROFILES_BYTES = 256 * 2**20  # a profile file (the bundled Clockwork profiles are 1.5 KB)


class OneLineParser(argparse.ArgumentParser):
    """argparse, with an error told on one line (no usage block): ``prog: error: message``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, one_line(f"{self.prog}: error: {message}"))

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        for action in self._actions:  # argparse gives ``--policy=--`` as [], with no error and no type applied
            value = getattr(parsed, action.dest, None)
            given = value if isinstance(action, argparse._AppendAction) and isinstance(value, list) else [value]
            if action.option_strings and action.nargs is None and [] in given and action.default != []:
                self.error(f"argument {'/'.join(action.option_strings)}: expected one argument")
        return parsed, extras


def one_line(message: str) -> str:
    """``message`` on one line (a value with a newline in it cannot split it), ending in a newline."""
    return " ".join(message.split()) + "\n"


def _quoted(text: str) -> str:
    return repr(text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "...")


def _interval(low: float, high: float, low_open: bool) -> str:
    return f"{'(' if low_open else '['}{_plain(low)}, {_plain(high)}]"


def _plain(bound: float) -> str:
    """A bound as typed: 86400000, not 8.64e+07."""
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e16 else f"{bound:g}"


def finite_float(low: float, high: float, *, low_open: bool = False) -> Callable[[str], float]:
    """A float in [low, high] (``low_open``: (low, high]), never NaN or infinite."""
    interval = _interval(low, high, low_open)

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {_quoted(text)}") from None
        if not math.isfinite(value) or value < low or value > high or (low_open and value == low):
            raise argparse.ArgumentTypeError(f"must be a finite number in {interval}, got {_quoted(text)}")
        return value

    parse.__name__ = "number"
    return parse


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An integer in [low, high]; a huge one is refused before it is converted."""

    def parse(text: str) -> int:
        if not re.fullmatch(r"\s*[-+]?\d{1,30}\s*", text):
            raise argparse.ArgumentTypeError(f"expected an integer in [{low}, {high}], got {_quoted(text)}")
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer in [{low}, {high}], got {_quoted(text)}")
        return value

    parse.__name__ = "integer"
    return parse


def number_list(low: float, high: float, *, low_open: bool = False) -> Callable[[str], list[float]]:
    """Comma-separated numbers, each as ``finite_float(low, high)``; empty text is an empty list."""
    one = finite_float(low, high, low_open=low_open)

    def parse(text: str) -> list[float]:
        try:
            return [one(part.strip()) for part in text.split(",") if part.strip()]
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"comma-separated numbers: each {error}") from None

    parse.__name__ = "numbers"
    return parse


def endpoint(text: str) -> str:
    """A ZeroMQ address a worker connects to: ``tcp://HOST:PORT`` or ``ipc://PATH``."""
    tcp = re.fullmatch(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})", text)  # a name, IPv4 or [IPv6]
    if tcp is not None and 1 <= int(tcp.group(2)) <= MAX_PORT:
        return text
    if re.fullmatch(r"ipc://.+", text, flags=re.DOTALL):
        return text
    raise argparse.ArgumentTypeError(f"expected tcp://HOST:PORT (port 1-{MAX_PORT}) or ipc://PATH, got {_quoted(text)}")


def server_address(text: str) -> str:
    """A server ``bench`` sends to: ``[http://|https://]HOST[:PORT]``."""
    address = re.fullmatch(r"(https?://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(:(\d{1,5}))?/?", text)
    if address is not None and (address.group(4) is None or 1 <= int(address.group(4)) <= MAX_PORT):
        return text
    raise argparse.ArgumentTypeError(f"expected [http://]HOST[:PORT] (port 1-{MAX_PORT}), got {_quoted(text)}")


def input_path(most_bytes: int, folder_too: bool = False) -> Callable[[str], Path]:
    """A file read whole (a folder too, with ``folder_too``): refused before it is read where it is
    missing, a device or pipe (``/dev/zero`` was read until the memory ran out), or past ``most_bytes``."""

    def parse(text: str) -> Path:
        path, shown = Path(text), text if len(text) <= 200 else text[:200] + "..."
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            raise argparse.ArgumentTypeError(f"{shown} does not exist") from None
        except (OSError, ValueError) as error:  # a name too long, a NUL byte, no permission
            raise argparse.ArgumentTypeError(f"{shown}: {getattr(error, 'strerror', None) or error}") from None
        if stat.S_ISDIR(mode) and folder_too:
            return path
        if not stat.S_ISREG(mode):
            raise argparse.ArgumentTypeError(f"{shown} is not a regular file")
        if (size := path.stat().st_size) > most_bytes:
            raise argparse.ArgumentTypeError(f"{shown} is {size:,} bytes; at most {most_bytes:,} are read")
        return path

    parse.__name__ = "path"
    return parse


POSITIVE_SECONDS = finite_float(MIN_S, DAY_S)
SECONDS = finite_float(0, DAY_S)
SLO_MS = finite_float(MIN_SLO_MS, MAX_SLO_MS)
PORT = bounded_int(0, MAX_PORT)
SEED = bounded_int(0, MAX_SEED)
POOL_GIB = finite_float(0, MAX_POOL_GIB, low_open=True)
PAGE_MIB = bounded_int(1, MAX_PAGE_MIB)
NETWORK_LATENCY_US = finite_float(0, MAX_NETWORK_LATENCY_US)
