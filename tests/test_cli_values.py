"""Every numeric option of every command, fuzzed: a bad value is one line naming the option (exit 2),
never a traceback, a hang or a run that fills the memory (issue 55). The parser and the checks each
command makes before its work are what decide, so they are called in-process here;
``test_cli_bad_values.py`` runs the real entry point on the issue's cases."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import math
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mainspring.cli.commands import build_parser, simulate_setup
from mainspring.cli.plan import plan_setup
from mainspring.cli.values import bounded_int, endpoint, finite_float, number_list, server_address
from mainspring.cli.workload import CliError
from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.serving.config import ServeConfig, load_config
from mainspring.sim.plan import plan
from mainspring.sim.run import SimulationConfig
from mainspring.time import NS_PER_S
from mainspring.workload import PoissonOpenLoop

PARSER = build_parser()
# What each command needs besides the option fuzzed (zoo's options are export's).
PREFIX = {
    "zoo": ["zoo", "export", "--out", "/nonexistent/zoo"],
    "profile": ["profile", "/nonexistent/repo"],
    "worker": ["worker", "--controller", "tcp://127.0.0.1:9"],
    "analyze": ["analyze", "/nonexistent/logs"],
}
SMALL = ["--models", "4"]  # simulate and plan: checks of a small model set (unless --models is fuzzed)
HANG = 10.0  # s: far above what a check takes (well under 1 s); only a hang or a huge allocation gets near it


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _commands() -> dict[str, argparse.ArgumentParser]:
    commands = _subparsers(PARSER)
    commands["zoo"] = _subparsers(commands["zoo"])["export"]
    return commands


def _valued_options() -> list[tuple[str, argparse.Action]]:
    """Each command's options whose value is parsed by a type (paths aside), and every option of
    ``simulate`` and ``plan`` that takes a value (their checks are run too)."""
    return [
        (command, action)
        for command, parser in _commands().items()
        for action in parser._actions
        if action.option_strings
        and action.type is not Path
        and (action.type is not None or (command in ("simulate", "plan") and action.nargs is None))
    ]


OPTIONS = _valued_options()


def test_no_numeric_option_is_parsed_unbounded() -> None:
    """A plain int or float type would let inf, NaN or 1e9 through to the command (where they overflowed)."""
    for command, parser in _commands().items():
        for action in parser._actions:
            assert action.type not in (int, float), f"{command} {action.option_strings}: use a cli_values type"
            if isinstance(action.default, int | float) and not isinstance(action.default, bool):
                assert action.type is not None, f"{command} {action.option_strings}: a number with no type"
    names = {(command, a.option_strings[0]) for command, a in OPTIONS}
    assert {("simulate", "--devices"), ("plan", "--what-if-scale"), ("serve", "--http-port")} <= names
    assert {("worker", "--controller"), ("bench", "--rate"), ("zoo", "--copies"), ("analyze", "--top")} <= names


BAD = ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400", "1e308", "1e9", "1e30", "-1", "-0", "0", "",
       " ", "1_000", "0x10", "١٢", "9" * 40, "1e3", "2.5", "a\nb", "-", "--", "1,2", "tcp://", "%s",
       "x" * 5000]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(BAD),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.text(max_size=12),
)


def _parse(argv: list[str]) -> tuple[argparse.Namespace | None, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            return PARSER.parse_args(argv), ""
        except SystemExit as stop:
            code = stop.code
    assert code == 2
    return None, stderr.getvalue()


def _one_clear_line(text: str, option: str) -> None:
    assert text.count("\n") == 1 and text.endswith("\n"), text
    assert text.startswith("mainspring ") and ": error: " in text and "Traceback" not in text
    assert option in text, text


def _serve_setup(args: argparse.Namespace) -> None:
    """``serve``'s settings from its flags, as ``run_serve`` merges them (with the file and environment)."""
    fields = {f.name for f in dataclasses.fields(ServeConfig)}
    load_config(None, {}, {k: v for k, v in vars(args).items() if k in fields and k != "clockwork"}, args.clockwork)


def _checked_before_the_work(command: str, args: argparse.Namespace) -> None:
    """``simulate``, ``plan`` and ``serve``: their checks before any work, on a value the parser took."""
    setup = {"simulate": simulate_setup, "plan": plan_setup, "serve": _serve_setup}.get(command)
    if setup is None:
        return
    started = time.perf_counter()
    with contextlib.suppress(CliError, ValueError):  # main tells these on one line, exit 2
        setup(args)
    assert time.perf_counter() - started < HANG


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(OPTIONS), value=VALUES)
def test_any_value_of_any_option_is_taken_in_range_or_named_in_one_line(
    case: tuple[str, argparse.Action], value: str
) -> None:
    _taken_in_range_or_named(case, value)


@pytest.mark.parametrize("case", OPTIONS, ids=lambda case: f"{case[0]} {case[1].option_strings[0]}")
def test_every_option_on_every_listed_bad_value(case: tuple[str, argparse.Action]) -> None:
    for value in BAD:
        _taken_in_range_or_named(case, value)


def _taken_in_range_or_named(case: tuple[str, argparse.Action], value: str) -> None:
    command, action = case
    option = action.option_strings[0]
    small = SMALL if command in ("simulate", "plan") and option != "--models" else []
    args, error = _parse([*PREFIX.get(command, [command]), *small, f"{option}={value}"])
    if args is None:
        _one_clear_line(error, option)
        return
    parsed = getattr(args, action.dest)
    for number in parsed if isinstance(parsed, list) else [parsed]:
        assert not isinstance(number, float) or math.isfinite(number)
    _checked_before_the_work(command, args)


@pytest.mark.parametrize(
    ("parse", "text", "expected"),
    [
        (finite_float(0, 10, low_open=True), "10", 10.0),
        (finite_float(0, 10), "0", 0.0),
        (bounded_int(1, 5), " 5 ", 5),
        (number_list(0, 10, low_open=True), "2, 5,", [2.0, 5.0]),
        (number_list(0, 10, low_open=True), "", []),
        (endpoint, "tcp://127.0.0.1:8002", "tcp://127.0.0.1:8002"),
        (endpoint, "ipc:///tmp/mainspring/workers", "ipc:///tmp/mainspring/workers"),
        (endpoint, "tcp://[::1]:8002", "tcp://[::1]:8002"),
        (server_address, "http://localhost:8000/", "http://localhost:8000/"),
        (server_address, "127.0.0.1", "127.0.0.1"),
    ],
)
def test_values_in_range_are_taken(parse: object, text: str, expected: object) -> None:
    assert callable(parse) and parse(text) == expected


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (finite_float(0, 10, low_open=True), "0", "must be a finite number in (0, 10], got '0'"),
        (finite_float(0, 10), "nan", "must be a finite number in [0, 10], got 'nan'"),
        (finite_float(0, 86_400_000), "1e400", "in [0, 86400000], got '1e400'"),
        (finite_float(0, 10), "ten", "expected a number in [0, 10], got 'ten'"),
        (bounded_int(1, 5), "1e3", "expected an integer in [1, 5], got '1e3'"),
        (bounded_int(1, 5), "9" * 5000, "got '" + "9" * 40 + "...'"),  # not converted: no 4300-digit ValueError
        (number_list(0, 10, low_open=True), "2,inf", "each must be a finite number in (0, 10], got 'inf'"),
        (endpoint, "foo", "expected tcp://HOST:PORT (port 1-65535) or ipc://PATH, got 'foo'"),
        (endpoint, "tcp://host:70000", "got 'tcp://host:70000'"),
        (endpoint, "tcp://*:8002", "got 'tcp://*:8002'"),
        (server_address, "127.0.0.1:99999", "expected [http://]HOST[:PORT] (port 1-65535), got '127.0.0.1:99999'"),
        (server_address, "ftp://x", "got 'ftp://x'"),  # ZeroMQ binds there but cannot connect: a traceback
    ],
)
def test_values_out_of_range_are_refused_with_the_range(parse: object, text: str, message: str) -> None:
    assert callable(parse)
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse(text)
    assert message in str(refused.value)


def test_plan_stops_doubling_once_more_devices_stop_helping() -> None:
    """Every model's first request misses a 5 ms SLO (its load alone takes longer) and most requests are
    first ones: no number of devices reaches 90%. The doubling stops at once, not at 4096 devices."""
    models = model_copies([p for p in builtin_profiles() if p.model == "resnet50_v2"], 400)
    config = SimulationConfig(duration_ns=2 * NS_PER_S, seed=2, slo_ns=5_000_000)
    result = plan(models, PoissonOpenLoop(100.0), config, 0.9, max_devices=4096)
    assert result.devices is None and result.reason.startswith("more devices stopped helping: ")
    assert max(p.devices for p in result.points) <= 8
    fewer, more = (p for p in result.points if p.complete)
    assert (
        more.devices == 2 * fewer.devices and abs(more.attainment - fewer.attainment) < 0.0001 < 0.9 - more.attainment
    )


def test_plan_refuses_an_slo_most_requests_cannot_meet(capsys: pytest.CaptureFixture[str]) -> None:
    """Most requests of the bundled trace are for models slower than 2 ms at batch 1: no plan, said at once."""
    from mainspring.cli import main

    started = time.perf_counter()
    assert main(["plan", "--slo-ms", "2", "--attainment", "100", "--max-devices", "4096", "--duration-s", "5"]) == 1
    assert time.perf_counter() - started < HANG
    out = capsys.readouterr().out
    assert out.startswith("no plan: at most ") and "of the requests can meet their SLO" in out


def test_an_slo_sweep_long_past_its_cap_stays_at_the_cap() -> None:
    """``--sweep-growth 100 --sweep-interval-s 0.001``: 100 ** 1000 after a second overflowed a float."""
    from mainspring.workload import SloSweep

    sweep = SloSweep(PoissonOpenLoop(10.0), growth=100.0, interval_s=0.001)
    assert sweep.factor_at(0) == 1.0 and sweep.factor_at(1_000_000) == 100.0
    assert sweep.factor_at(3600 * NS_PER_S) == sweep.max_factor == 100.0


def test_zoo_copies_past_the_free_disk_are_refused_before_copying(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """100,000 copies of resnet18 (45 MB each) are 4.4 TB: refused after the first file, not once the disk is full."""
    from mainspring.cli import main

    out = tmp_path / "zoo"
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "zoo",
                "export",
                "--out",
                str(out),
                "--models",
                "resnet18",
                "--copies",
                "100000",
                "--format",
                "torchscript",
            ]
        )
    assert exited.value.code == 2
    assert "--copies 100000 of resnet18 need 4.37e+03 GiB; " in capsys.readouterr().err
    assert len(list(out.iterdir())) == 1  # the first export only
