"""Issue 55's bad values for ``plan``, ``simulate`` and ``worker``, run as a user runs them: the real
``mainspring`` console script, each answered with exit 2 and one line naming the option, file or
line, with no traceback and in little memory. Before, these overflowed, filled the memory, ran for a
minute or more, or named nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

EXE = str(Path(sys.executable).parent / "mainspring")
MAX_RSS_MB = 200
HANG_S = 60  # each case takes about half a second; only a hang gets near this
HEADER = "HashFunction,HashOwner,HashApp,minute_1,minute_2\n"
# Runs the command as its child and writes the child's peak RSS (KiB) into $MAX_RSS_FILE. A child
# forked from pytest itself would report pytest's peak: Linux keeps the high-water mark across exec.
MEASURED = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
with open(os.environ["MAX_RSS_FILE"], "w") as out:
    out.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""

CASES: list[tuple[list[str], str]] = [
    # OverflowError before
    (["simulate", "--duration-s", "inf"], "argument --duration-s: must be a finite number in [0.001, 86400]"),
    (["simulate", "--warmup-s", "inf"], "argument --warmup-s: must be a finite number in [0, 86400]"),
    (["plan", "--device-memory-gib", "inf"], "argument --device-memory-gib: must be a finite number in (0, 4096]"),
    (["simulate", "--device-memory-gib", "inf"], "argument --device-memory-gib: must be a finite number"),
    (["simulate", "--trace", "{inf}"], "inf.csv, line 2: invocation count inf is not in [0, 10,000,000] a minute"),
    (["plan", "--trace", "{huge}"], "huge.csv, line 3: invocation count inf is not in [0, 10,000,000] a minute"),
    # MemoryError before
    (["plan", "--device-memory-gib", "1e9"], "argument --device-memory-gib: must be a finite number in (0, 4096]"),
    (["simulate", "--devices", "1000000"], "argument --devices: must be an integer in [1, 4096], got '1000000'"),
    (["simulate", "--trace", "{count}"], "count.csv, line 2: invocation count 1e+12 is not in [0, 10,000,000]"),
    (["simulate", "--trace-scale", "1e9"], "argument --trace-scale: must be a finite number in (0, 1000000]"),
    (["simulate", "--devices", "4096", "--page-mib", "1"], "are 134,217,728 pages; a run holds at most 10,000,000"),
    # plan ran 50-70 s and took 2 GB before refusing
    (["plan", "--duration-s", "1e9"], "argument --duration-s: must be a finite number in [0.001, 86400], got '1e9'"),
    (["plan", "--workload", "poisson", "--rate", "1e9"], "argument --rate: must be a finite number in (0, 10000000]"),
    (["plan", "--workload", "poisson", "--rate", "inf"], "argument --rate: must be a finite number"),
    (["plan", "--workload", "poisson", "--rate", "1e6"], "--rate 1e+06 for 60 s is 6e+07 requests; a run holds at"),
    (["plan", "--what-if-scale", "inf"], "argument --what-if-scale: comma-separated numbers: each must be a finite"),
    # the what-if was refused after the plan was printed, naming no option
    (["plan", "--what-if-scale", "1000", "--duration-s", "300"], "--what-if-scale 1000: --trace-scale 10000 for 300"),
    (["plan", "--what-if-slo", "5,0"], "argument --what-if-slo: comma-separated numbers: each must be a finite"),
    # killed at 120 s and 7.1 GB
    (["plan", "--models", "10000000"], "argument --models: must be an integer in [1, 1000000], got '10000000'"),
    # doubled devices forever
    (["plan", "--max-devices", "1000000"], "argument --max-devices: must be an integer in [1, 4096]"),
    # named no option, file or line
    (["simulate", "--duration-s", "nan"], "argument --duration-s: must be a finite number in [0.001, 86400], got 'nan"),
    (["simulate", "--trace-scale", "inf"], "argument --trace-scale: must be a finite number in (0, 1000000]"),
    (["simulate", "--trace", "{binary}"], "binary.csv, line 2: not UTF-8 text (a trace is a CSV file)"),
    (["plan", "--trace", "{nul}"], "nul.csv, line 2: invocation counts must be numbers"),
    (
        ["plan", "--trace-start-minute", "-1"],
        "argument --trace-start-minute: must be an integer in [0, 1439], got '-1'",
    ),
    (["worker", "--controller", "foo"], "argument --controller: expected tcp://HOST:PORT (port 1-65535) or ipc://PATH"),
    (["simulate", "--policy=--"], "argument --policy: expected one argument"),  # argparse gave [] to the command
    # read until the memory ran out (MemoryError)
    (["simulate", "--profiles", "/dev/zero"], "argument --profiles: /dev/zero is not a regular file"),
    (["plan", "--trace", "/dev/zero"], "argument --trace: /dev/zero is not a regular file"),
    (["worker", "--controller", "tcp://127.0.0.1:9", "--emulate", "/dev/zero"], "argument --emulate: /dev/zero is not"),
    # raised ValueError, not the command line's error; the profiles' problem named no option
    (
        ["worker", "--controller", "tcp://127.0.0.1:9", "--emulate", "{empty}"],
        "--emulate {empty}: repository {empty} holds",
    ),
    (
        ["worker", "--controller", "tcp://127.0.0.1:9", "--emulate", "{torn}"],
        "--emulate {torn}: profile file {torn} is not",
    ),
    (["worker", "--controller", "tcp://127.0.0.1:9", "--emulate", "--repo", "{empty}"], "give --repo (a real device's"),
    (["worker", "--controller", "tcp://127.0.0.1:9", "--repo", "{empty}", "--count", "2"], "--count (at least 1) and"),
    # an OSError traceback: a name longer than the file system takes
    (["simulate", "--trace", "x" * 5000], ": File name too long"),
    (["analyze", "x" * 5000], ": File name too long"),
]


def _inputs(folder: Path) -> dict[str, str]:
    """The bad files the cases name: traces, a folder with no profiles, a profile file cut short."""
    files = {
        "inf": HEADER + "f,o,a,1,inf\n",
        "huge": HEADER + "f,o,a,1,2\ng,o,a,1e400,1\n",
        "count": HEADER + "f,o,a,1e12,1\n",
        "nul": HEADER + "f,o,a,1,\x002\n",
    }
    paths = {}
    for name, text in files.items():
        paths[name] = str(folder / f"{name}.csv")
        (folder / f"{name}.csv").write_text(text)
    (folder / "binary.csv").write_bytes(HEADER.encode() + b"f,o,a,\xff\xfe\x00\x01,1\n")
    paths["binary"] = str(folder / "binary.csv")
    (folder / "empty").mkdir()
    paths["empty"] = str(folder / "empty")
    (folder / "torn.json").write_text('{"profiles": [')
    paths["torn"] = str(folder / "torn.json")
    return paths


def test_each_bad_value_is_one_line_naming_it_in_little_memory(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path)
    running = []
    for index, (argv, expected) in enumerate(CASES):  # all at once: each is a short process
        out, err, rss = (tmp_path / f"{index}.{kind}" for kind in ("out", "err", "rss"))
        command = [sys.executable, "-c", MEASURED, EXE, *(a.format(**inputs) for a in argv)]
        with out.open("w") as stdout, err.open("w") as stderr:
            environment = dict(os.environ, MAX_RSS_FILE=str(rss))
            process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=environment, start_new_session=True)
        running.append((process, argv, expected.format(**inputs), out, err, rss))
    failures = []
    for process, argv, expected, out, err, rss in running:
        try:
            code = process.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the launcher and the command it runs
            code = process.wait()
        printed, told = out.read_text(), err.read_text()
        rss_mb = int(rss.read_text()) / 1024 if rss.exists() else float("inf")
        if not (code == 2 and printed == "" and told.count("\n") == 1 and expected in told):
            failures.append(f"{argv}: exit {code}, stdout {printed[:200]!r}, stderr {told[-600:]!r}")
        if "Traceback" in told or rss_mb > MAX_RSS_MB:
            failures.append(f"{argv}: a traceback, or {rss_mb:.0f} MB")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("argv", [["plan", "--slo-ms", "2", "--attainment", "100", "--max-devices", "4096"]])
def test_a_plan_no_device_count_can_meet_ends_at_once(argv: list[str]) -> None:
    """It doubled devices while the attainment stayed flat; now: no plan, and why, with exit 1."""
    done = subprocess.run(
        [EXE, *argv, "--duration-s", "10"], capture_output=True, text=True, timeout=HANG_S, check=False
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stdout.startswith("no plan: at most ") and "no number of devices reaches 100.0000%" in done.stdout
