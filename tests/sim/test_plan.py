"""``mainspring plan``: the smallest configuration that meets the target, the same on every run, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mainspring.cli import main
from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.sim.plan import PlanError, _fewest, _misses_allowed, plan
from mainspring.sim.run import SimulationConfig, generate_arrivals, simulate
from mainspring.time import NS_PER_S
from mainspring.workload import ClosedLoop, PoissonOpenLoop

RESNET50 = [p for p in builtin_profiles() if p.model == "resnet50_v2"]


def test_the_search_finds_the_first_n_that_works_in_few_tries() -> None:
    for answer in (1, 2, 3, 7, 8, 33, 64):
        tried: list[int] = []

        def ok(n: int, answer: int = answer, tried: list[int] = tried) -> bool:
            tried.append(n)
            return n >= answer

        assert _fewest(ok, 1, 64) == (answer, answer - 1)
        assert len(tried) <= 2 * 7 + 1  # doubling, then bisecting: logarithmic
    assert _fewest(lambda n: False, 1, 64) == (None, 64)
    assert _fewest(lambda n: True, 5, 4) == (None, 4)
    # to within a share of the answer: a hit no more than that above the answer, a miss below it
    hit, miss = _fewest(lambda n: n >= 1000, 1, 4096, precision=1 / 32)
    assert 1000 <= hit <= 1000 * (1 + 1 / 32) and miss < 1000 and hit - miss <= hit / 32


def test_the_plan_is_the_fewest_devices_an_exhaustive_search_finds_and_the_same_every_run() -> None:
    models = model_copies(RESNET50, 40)
    workload = PoissonOpenLoop(1500.0)
    config = SimulationConfig(duration_ns=3 * NS_PER_S, seed=2, pool_bytes=48 * 2**30)
    target = 0.999
    arrivals = generate_arrivals(workload, models, config)
    exhaustive = []
    for devices in range(1, 7):
        run = SimulationConfig(duration_ns=config.duration_ns, seed=2, pool_bytes=config.pool_bytes, devices=devices)
        exhaustive.append(simulate("clockwork", models, workload, run, arrivals).report.slo_attainment)
    fewest = next(n for n, attained in enumerate(exhaustive, start=1) if attained >= target)
    assert 1 < fewest < 6  # the workload needs more than one device and fewer than six
    first = plan(models, workload, config, target, max_devices=6)
    assert first.devices == fewest
    assert first.pool_bytes is not None and first.pool_bytes <= config.pool_bytes
    chosen = first.point(fewest, first.pool_bytes)
    assert chosen is not None and chosen.attainment >= target
    below = first.point(fewest - 1, config.pool_bytes)
    assert below is not None and below.complete  # the margin is run to the end, whatever the search stopped
    assert below.attainment == exhaustive[fewest - 2] < target
    assert plan(models, workload, config, target, max_devices=6).to_json() == first.to_json()


def test_a_target_no_device_count_reaches_says_so() -> None:
    models = model_copies(RESNET50, 40)
    config = SimulationConfig(duration_ns=2 * NS_PER_S, seed=1)
    result = plan(models, PoissonOpenLoop(3000.0), config, 0.999, max_devices=1)
    assert result.devices is None and result.pool_bytes is None
    best = result.point(1, config.pool_bytes)
    assert best is not None and best.complete and best.attainment < 0.999  # the best there is, in full


def test_the_miss_budget_is_the_most_misses_that_still_meet_the_target() -> None:
    for counted in (1, 7, 1000, 58_123, 1_000_000):
        for target in (0.5, 0.9, 0.96, 0.999, 0.9999, 1.0):
            allowed = _misses_allowed(counted, target)
            assert (counted - allowed) / counted >= target or allowed == 0
            assert allowed == counted or (counted - allowed - 1) / counted < target


def test_a_closed_loop_runs_every_candidate_to_the_end() -> None:
    models = model_copies(RESNET50, 8)
    config = SimulationConfig(duration_ns=NS_PER_S, seed=1)
    result = plan(models, ClosedLoop(64), config, 0.999, max_devices=2)
    assert ClosedLoop(1).closed_loop and not PoissonOpenLoop(1.0).closed_loop
    assert result.points and all(p.complete for p in result.points)


def test_a_run_stops_once_it_has_missed_more_than_its_budget_and_not_before() -> None:
    models = model_copies(RESNET50, 40)
    workload = PoissonOpenLoop(2500.0)  # about twice what one device serves
    config = SimulationConfig(duration_ns=3 * NS_PER_S, seed=3, devices=1)
    arrivals = generate_arrivals(workload, models, config)
    whole = simulate("clockwork", models, workload, config, arrivals)
    missed = whole.report.requests - round(whole.report.slo_attainment * whole.report.requests)
    assert whole.stopped_after_misses == 0 and missed > 100
    stopped = simulate("clockwork", models, workload, config, arrivals, miss_budget=100)
    assert stopped.stopped_after_misses > 100 and stopped.end_ns < whole.end_ns
    enough = simulate("clockwork", models, workload, config, arrivals, miss_budget=missed)
    assert enough.stopped_after_misses == 0 and enough.report.slo_attainment == whole.report.slo_attainment


def test_bad_inputs_get_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = model_copies(RESNET50, 4)
    config = SimulationConfig(duration_ns=NS_PER_S, slo_ns=3_000_000)  # below resnet50_v2's 3.32 ms
    with pytest.raises(PlanError, match="below every model's batch-1 time"):
        plan(models, PoissonOpenLoop(100.0), config, 0.999, max_devices=4)
    with pytest.raises(PlanError, match="attainment"):
        plan(models, PoissonOpenLoop(100.0), SimulationConfig(duration_ns=NS_PER_S), 1.5, max_devices=4)
    header = "HashOwner,HashApp,HashFunction,Trigger," + ",".join(str(m) for m in range(1, 1441)) + "\n"
    empty, silent = tmp_path / "empty.csv", tmp_path / "silent.csv"
    empty.write_text(header)
    silent.write_text(header + "o,a,f,http," + ",".join("0" for _ in range(1440)) + "\n")
    for argv, expected in (
        (["--workload", "azure", "--trace", str(empty)], "has no functions"),
        (["--workload", "azure", "--trace", str(silent)], "no requests"),
        (["--workload", "poisson", "--slo-ms", "1"], "below every model's batch-1 time"),
        (["--workload", "poisson", "--attainment", "0"], "--attainment"),
        (["--workload", "poisson", "--policy", "clockwork,triton"], "one policy"),
        (["--workload", "poisson", "--device-kind", "cpu"], "--device-kind cpu: no profile of that kind"),
        (["--workload", "poisson", "--cell-devices", "0"], "argument --cell-devices: must be an integer in [1, 4096]"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(["plan", "--models", "4", "--duration-s", "1", "--quiet", *argv])
        assert exited.value.code == 2
        assert expected in capsys.readouterr().err


def test_the_cli_writes_the_plan_its_placement_and_what_ifs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    argv = ["plan", "--workload", "poisson", "--rate", "600", "--models", "12", "--duration-s", "2", "--quiet"]
    argv += ["--max-devices", "4", "--what-if-scale", "2", "--what-if-slo", "200", "--json", str(out)]
    argv += ["--plot", str(tmp_path / "plan.png"), "--cell-devices", "1"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("plan: ") and "what if load x2: " in printed and "what if SLO 200 ms: " in printed
    document = json.loads(out.read_text())
    assert document["devices"] >= 1 and set(document["what_if"]) == {"load x2", "SLO 200 ms"}
    placement = document["placement"]  # a cell per device: every model served, by cells that exist
    assert len(placement) == 12 and all(
        cells and set(cells) <= set(range(document["devices"])) for cells in placement.values()
    )
    assert (tmp_path / "plan.png").stat().st_size > 0


def test_each_what_if_changes_one_input_and_leaves_the_plan_as_given() -> None:
    from dataclasses import replace

    from mainspring.cli.commands import build_parser
    from mainspring.cli.plan import plan_setup

    argv = ["plan", "--workload", "closed", "--clients", "10", "--models", "4", "--slo-ms", "150"]
    args = build_parser().parse_args([*argv, "--what-if-slo", "300", "--what-if-scale", "2.5"])
    (_, config, workload), (_, slower_config, slower_load), (_, scaled_config, scaled) = plan_setup(args).cases
    assert slower_config == replace(config, slo_ns=300 * 10**6) and slower_load == workload
    assert scaled_config == config and scaled == replace(workload, clients=25)
    assert config.slo_ns == 150 * 10**6 and workload == ClosedLoop(10, 1) and args.clients == 10
