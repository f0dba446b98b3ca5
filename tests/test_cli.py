"""``mainspring simulate`` end to end, as a user runs it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mainspring.cli import build_parser, main
from mainspring.cli.workload import duration_s
from mainspring.scheduler.registry import parse_policies
from mainspring.time import s_to_ns

SMALL = ["simulate", "--models", "200", "--devices", "2", "--duration-s", "20", "--trace-scale", "20", "--quiet"]


def test_simulate_writes_table_json_plots_and_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [*SMALL, "--policy", "triton,clipper", "--json", str(tmp_path / "r.json")]
    args += ["--plot", str(tmp_path / "plots"), "--log-dir", str(tmp_path / "logs")]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "SLO attainment" in table and "triton" in table and "clipper" in table
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert [r["policy"] for r in results] == ["triton", "clipper"]
    for r in results:
        assert r["requests"] > 100 and 0 <= r["slo_attainment"] <= 1
        assert set(r["latency_ms"]) == {"p50", "p99", "p999", "p9999", "max"}
        assert {"infer_p99", "load_p99"} <= set(r["prediction_error_ms"])
        for key in ("goodput_rps", "throughput_rps", "rejected", "timed_out", "cold_starts", "loads", "evictions"):
            assert key in r
        assert r["simulated_s"] >= 20 and r["wall_s"] > 0
        # the policy's own CPU, for sizing a controller: some, and less than the whole run's wall time
        assert 0 < r["policy_cpu_us_per_request"] * r["requests"] / 1e6 < r["wall_s"]
        assert r["policy_cpu_s_per_sim_s"] > 0
    assert "policy CPU (us/request)" in table
    assert results[0]["requests"] == results[1]["requests"]  # identical arrivals
    for png in ("latency-cdf.png", "over-time.png"):
        assert (tmp_path / "plots" / png).read_bytes()[:4] == b"\x89PNG"
    requests_log = (tmp_path / "logs" / "triton-requests.tsv").read_text().splitlines()
    assert requests_log[0].split("\t")[:3] == ["request_id", "model", "arrival_ns"]
    assert len(requests_log) == results[0]["requests"] + 1
    assert (tmp_path / "logs" / "clipper-actions.tsv").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--policy", "fifo"], "unknown policy fifo"),
        (["--duration-s", "-5"], "argument --duration-s: must be a finite number in [0.001, 86400], got '-5'"),
        (["--workload", "sine"], "unknown workload 'sine'"),
        (["--trace", "/nonexistent/trace.csv"], "does not exist"),
        (["--models", "0"], "argument --models: must be an integer in [1, 1000000], got '0'"),
        (["--warmup-s", "-1"], "argument --warmup-s: must be a finite number in [0, 86400]"),
        (["--warmup-s", "30", "--trace-start-minute", "5"], "must be whole minutes, got 30"),
        (["--warmup-s", "60"], "the trace has no minute before 0"),
        (["--clockwork", "estimate_percentile"], "--clockwork 'estimate_percentile': expected KEY=VALUE"),
        (["--clockwork", "colour=red"], "--clockwork: unknown setting 'colour'"),
        (["--clockwork", "estimate_window=many"], "estimate_window='many' is not an int"),
        (["--clockwork", "estimate_percentile=120"], "estimate_percentile=120.0 must lie in (0, 100]"),
        (["--clockwork", "deadline_margin_ms=3"], "'deadline_margin_ms' is not set here"),
        (["--policy", "triton", "--clockwork", "lookahead=off"], "apply to policy clockwork, which --policy triton"),
        (["--network-latency-us", "-1"], "argument --network-latency-us: must be a finite number in [0, 1000000]"),
        (["--network-latency-us", "nan"], "argument --network-latency-us: must be a finite number in [0, 1000000]"),
        (["--slo-ms", "1e300"], "argument --slo-ms: must be a finite number in [0.001, 86400000], got '1e300'"),
        (["--device-memory-gib", "0.001"], "--device-memory-gib 0.001 holds no page of --page-mib 16"),
        # told before the run, whose results would otherwise be lost at its end
        (["--plot", "/proc/mainspring-plots"], "--plot /proc/mainspring-plots: cannot write there"),
        (["--log-dir", "/proc/mainspring-logs"], "--log-dir /proc/mainspring-logs: cannot write there"),
        (["--json", "/"], "--json /: cannot write there: is a folder, not a file"),
        # a rate mistyped by orders of magnitude: refused at once (it filled the memory first)
        (["--workload", "poisson", "--rate", "5e6"], "--rate 5e+06 for 20 s is 1e+08 requests; a run holds at most"),
        (["--trace-scale", "1e6"], "--trace-scale 1e+06 for 20 s is about 2.69e+08 requests; a run holds at most"),
    ],
)
def test_bad_flags_give_one_clear_line(extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main([*SMALL, *extra])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_a_network_latency_delays_every_answer_by_its_round_trip(tmp_path: Path) -> None:
    run = ["simulate", "--policy", "infer5", "--workload", "poisson", "--rate", "200", "--models", "4"]
    run += ["--devices", "1", "--duration-s", "2", "--quiet"]
    assert main([*run, "--json", str(tmp_path / "instant.json")]) == 0
    assert main([*run, "--network-latency-us", "3000", "--json", str(tmp_path / "lan.json")]) == 0
    (instant,) = json.loads((tmp_path / "instant.json").read_text())["results"]
    (lan,) = json.loads((tmp_path / "lan.json").read_text())["results"]
    assert instant["requests"] == lan["requests"]  # the same arrivals
    assert lan["latency_ms"]["p50"] >= instant["latency_ms"]["p50"] + 5  # 3 ms out, 3 ms back


def test_a_warm_up_is_served_but_not_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    window = [*SMALL, "--policy", "triton", "--trace-start-minute", "5"]
    assert main([*window, "--json", str(tmp_path / "cold.json")]) == 0
    assert main([*window, "--warmup-s", "60", "--json", str(tmp_path / "warm.json"), "--log-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "from minute 4" in table and "counted after a 60 s warm-up" in table
    (cold,) = json.loads((tmp_path / "cold.json").read_text())["results"]
    (warm,) = json.loads((tmp_path / "warm.json").read_text())["results"]
    arrivals = [int(line.split("\t")[2]) for line in (tmp_path / "triton-requests.tsv").read_text().splitlines()[1:]]
    counted = sum(1 for t in arrivals if t >= 60 * 10**9)
    assert warm["warmup_s"] == 60 and 0 < counted == warm["requests"] < len(arrivals)  # the log keeps the warm-up
    assert warm["offered_rps"] == pytest.approx(counted / 20)
    # Every model starts cold at time 0: counted warm, the same window sees far fewer cold starts.
    assert warm["cold_starts"] < cold["cold_starts"] / 2


def test_malformed_trace_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("no,minutes,here\n1,2,3\n")
    with pytest.raises(SystemExit):
        main([*SMALL, "--trace", str(trace)])
    assert "no 'minute_1'" in capsys.readouterr().err


def test_clockwork_settings_change_the_clockwork_run_only(tmp_path: Path) -> None:
    """``--clockwork max_batch_size=1``: clockwork runs no batch larger than one; triton, beside it, still batches."""
    logs = tmp_path / "logs"
    args = ["simulate", "--models", "4", "--devices", "1", "--workload", "poisson", "--rate", "1500"]
    args += ["--duration-s", "2", "--quiet", "--policy", "clockwork,triton", "--log-dir", str(logs)]
    assert main([*args, "--clockwork", "max_batch_size=1"]) == 0

    def batch_sizes(policy: str) -> set[int]:
        rows = (logs / f"{policy}-actions.tsv").read_text().splitlines()
        column = rows[0].split("\t").index("batch_size")
        return {int(r.split("\t")[column]) for r in rows[1:] if r.split("\t")[1] == "infer"}

    assert batch_sizes("clockwork") == {1}
    assert max(batch_sizes("triton")) > 1
    assert main(args) == 0  # the defaults batch
    assert max(batch_sizes("clockwork")) > 1


def test_a_bare_simulate_shows_clockwork_beside_the_reactive_baselines(tmp_path: Path) -> None:
    """What a newcomer sees: the three policies side by side on the bundled trace at x10 for five
    minutes (only the length is cut here); other workloads keep a minute."""
    args = build_parser().parse_args(["simulate"])
    assert parse_policies(args.policy) == ["clockwork", "triton", "clipper"]
    assert (args.workload, args.trace_scale, duration_s(args)) == ("azure", 10.0, 300.0)
    assert duration_s(build_parser().parse_args(["simulate", "--workload", "poisson"])) == 60.0
    assert duration_s(build_parser().parse_args(["bench"])) == 60.0
    assert main([*SMALL, "--json", str(tmp_path / "r.json")]) == 0
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert [r["policy"] for r in results] == ["clockwork", "triton", "clipper"]
    assert results[0]["slo_attainment"] > 0.99


def test_console_script_runs() -> None:
    exe = Path(sys.executable).parent / "mainspring"
    assert exe.exists(), "the package is not installed with its console script"
    command = [str(exe), *SMALL, "--duration-s", "5"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "goodput" in done.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--log", "/proc/mainspring/requests.tsv"], "--log /proc/mainspring/requests.tsv: cannot write there"),
        (["--slo-ms", "0"], "argument --slo-ms: must be a finite number in [0.001, 86400000], got '0'"),
        (["--models", " , "], "--models ' , ' names no model"),
        (["--workload", "closed", "--clients", "0"], "argument --clients: must be an integer in [1, 10000]"),
        # a rate mistyped by orders of magnitude (was: sent as fast as it could, a record of each kept)
        (["--rate", "1e6", "--duration-s", "60"], "--rate 1e+06 for 60 s is 6e+07 requests; a run holds at most"),
    ],
)
def test_bench_refuses_bad_flags_before_it_sends(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["bench", "--url", "127.0.0.1:9", "--duration-s", "1", *extra])  # nothing listens on port 9
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_a_workload_past_what_one_run_holds_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any workload (here the Azure trace at a huge scale), counted as it is generated."""
    from mainspring.models.profile import builtin_profiles, model_copies
    from mainspring.sim import run
    from mainspring.workload import AzureTrace

    monkeypatch.setattr(run, "MAX_ARRIVALS", 500)
    config = run.SimulationConfig(duration_ns=s_to_ns(60), devices=1)
    models = model_copies(builtin_profiles(), 100)
    with pytest.raises(ValueError, match="asks for more than 500 requests in 60 s"):
        run.generate_arrivals(AzureTrace(scale=1000.0), models, config)
    assert len(run.generate_arrivals(AzureTrace(scale=0.01), models, config)) <= 500


def test_simulated_cells_charge_the_live_processes_unless_asked_for_the_policy_alone(tmp_path: Path) -> None:
    """``--cells``: the controller's core is charged the live process around the policy and a frontend core
    stands in front (its table and JSON rows); ``--controller-cost policy`` is the policy alone, no frontend."""
    args = ["simulate", "--models", "24", "--devices", "2", "--workload", "poisson", "--rate", "300"]
    args += ["--duration-s", "2", "--quiet", "--policy", "clockwork", "--cells", "1"]

    def cells(*extra: str) -> dict[str, list[dict[str, float]]]:
        assert main([*args, *extra, "--json", str(tmp_path / "r.json")]) == 0
        results = json.loads((tmp_path / "r.json").read_text())["results"]
        summary: dict[str, list[dict[str, float]]] = results[0]["cells"]
        return summary

    live, policy = cells("--frontends", "2"), cells("--controller-cost", "policy")
    assert [f["frontend"] for f in live["frontends"]] == [0, 1] and policy["frontends"] == []
    assert live["cells"][0]["cost_us_per_request"] > 2 * policy["cells"][0]["cost_us_per_request"]
