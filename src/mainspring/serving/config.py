"""The settings of ``mainspring serve``: defaults, a TOML file, ``MAINSPRING_*`` variables, then flags,
each checked with an error that names the setting and where it came from; and the model repository
they point at (the built-in zoo written there on first start)."""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mainspring.cells.placement import CELL_DEVICES
from mainspring.frontend.limits import RequestLimits
from mainspring.models.repository import ModelRepository
from mainspring.protocol.pages import DEFAULT_PAGE_BYTES, MIB
from mainspring.protocol.requests import DEFAULT_DEADLINE_MARGIN_MS, slo_problem
from mainspring.scheduler.clockwork.config import NOT_A_POLICY_SETTING, ClockworkConfig
from mainspring.scheduler.registry import DEFAULT_POLICY, SETTABLE, clockwork_config, policy_names
from mainspring.settings import dataclass_values, key_values

log = logging.getLogger("mainspring.serve")

ENV_PREFIX = "MAINSPRING_"
CLOCKWORK_ENV_PREFIX = f"{ENV_PREFIX}CLOCKWORK_"  # MAINSPRING_CLOCKWORK_ESTIMATE_PERCENTILE=90
DEFAULT_ZOO = ("resnet18", "mobilenetv2", "bert_tiny", "mlp")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
OTEL_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")  # the otel extra's


@dataclass(frozen=True)
class ServeConfig:
    """Every setting of ``mainspring serve``; from defaults, a TOML file, ``MAINSPRING_*`` variables, then flags."""

    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    worker_port: int = 8002
    workers: str = "local"  # or "tcp": wait for external workers
    frontends: int = 0  # HTTP + gRPC frontend processes sharing the ports; 0: one per two cores, at most 4
    # Controller processes, each planning its share of the devices (local_cells.py); 1: one controller
    # in this process; 0: sized to the machine (``cell_count``). Cell i takes workers on worker_port + i.
    # With ray: a cell per node's devices (up to 16), N the cells serving waits for (ray_cells.py).
    cells: int = 0
    ray: str = ""  # a Ray cluster's address ("auto": the local one): one worker per device of each node, as actors
    repo: str = ""  # default: ~/.mainspring/zoo, created with the built-in zoo on first start
    policy: str = DEFAULT_POLICY
    slo_ms: float = 100.0
    deadline_margin_ms: float = DEFAULT_DEADLINE_MARGIN_MS  # time kept for the answer's trip back
    devices: str = ""  # comma-separated; default every CUDA GPU, else "cpu"
    pool_mib: int = 0  # per device; 0 = the runtime's default
    pin_cpu_workers: bool = False  # pin each local CPU worker's exec thread to its own core (the last ones)
    heartbeat_s: float = 0.1
    worker_timeout_s: float = 2.0
    drain_s: float = 5.0
    join_timeout_s: float = 180.0
    max_restarts_per_minute: int = 5  # per local worker
    max_outstanding: int = 100_000  # unanswered requests; past it 429 (bounds memory under a flood)
    log_dir: str = ""  # write request and action logs (TSV) here, for `mainspring analyze`
    # Triton's poll mode: every this many seconds, load new models, reload changed ones in place and
    # unload removed ones (controller/repository_poll.py); 0: the repository changes only through its API.
    repository_poll_s: float = 0.0
    max_outstanding_mib: int = 512  # their input tensors (the server holds about 3x this); past it 429
    # The controller's event loop this far behind: new requests 429 (its CPU is spent); 0: half of slo_ms.
    max_loop_lag_ms: float = 0.0
    # Refuse new calls at arrival, before reading them, while the frontend's event loop runs late (past a
    # twentieth of slo_ms, in three wakes of a 5 ms timer running): the share taken adapts to what the
    # process's CPU keeps up with (``frontend/shedding.py``); false: every call is read and judged alone.
    shed_at_arrival: bool = True
    # Split the controller's CPU by part of the work (mainspring_controller_cpu_seconds{part}): about 2 us a
    # part, several parts a request (benchmarks/controller_cost_live.py turns it on).
    cpu_ledger: bool = False
    # "uvloop": more requests/s through one controller, but its millisecond timers cost attainment
    # (docs/benchmarks/serving.md, "Controller throughput"); needs `pip install uvloop`.
    event_loop: str = "asyncio"
    # OpenTelemetry traces (the otel extra): the collector's OTLP/HTTP address ("": off, no cost), and the share
    # of calls traced that come without a client's traceparent (one with a sampled traceparent always is).
    otlp_endpoint: str = ""
    trace_sample_ratio: float = 1.0
    # Security: set the secrets in the config file or the environment, never as flags (``ps`` shows flags).
    auth_token: str = field(default="", repr=False)  # bearer token for the repository API (and see auth_inference)
    auth_inference: bool = False  # require the token for inference, metadata, statistics and metrics too
    worker_secret: str = field(default="", repr=False)  # workers must hold it to join (ZeroMQ CURVE)
    # Without worker_secret, local workers join over a socket in a folder only this user may enter; this
    # opens the TCP worker port to any process that reaches it instead (needed for workers="tcp" without
    # a secret): such a process receives clients' inputs and answers for the models.
    allow_open_workers: bool = False
    # What one request may be (``frontend/limits.py``).
    max_body_bytes: int = RequestLimits.max_body_bytes
    max_header_bytes: int = RequestLimits.max_header_bytes
    max_inputs: int = RequestLimits.max_inputs
    max_elements: int = RequestLimits.max_elements
    max_string_bytes: int = RequestLimits.max_string_bytes
    max_json_depth: int = RequestLimits.max_json_depth
    # How many clients, and how long each may take (``frontend/limits.py``; per frontend process).
    max_connections: int = RequestLimits.max_connections
    header_timeout_s: float = RequestLimits.header_timeout_s
    body_timeout_s: float = RequestLimits.body_timeout_s
    idle_timeout_s: float = RequestLimits.idle_timeout_s
    max_connection_age_s: float = RequestLimits.max_connection_age_s
    max_connection_age_grace_s: float = RequestLimits.max_connection_age_grace_s
    # The clockwork policy's settings (``ClockworkConfig`` field: value), from the file's [clockwork]
    # table, MAINSPRING_CLOCKWORK_* variables and --clockwork KEY=VALUE; defaults where not given.
    clockwork: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        problems = [
            f"{f.name}={getattr(self, f.name)} must be a finite number"
            for f in fields(self)
            if isinstance(getattr(self, f.name), float) and not math.isfinite(getattr(self, f.name))
        ]  # a file or the environment may say nan or inf, which every bound below would let through
        for port in ("http_port", "grpc_port", "worker_port"):
            if not 0 <= getattr(self, port) <= 65535:
                problems.append(f"{port}={getattr(self, port)} is not a port")
        if self.workers not in ("local", "tcp"):
            problems.append(f"workers={self.workers!r} must be 'local' or 'tcp'")
        if self.policy not in policy_names():
            problems.append(f"policy={self.policy!r} is not one of {', '.join(policy_names())}")
        if (problem := slo_problem("slo_ms", self.slo_ms)) is not None:
            problems.append(problem)
        if not 0 <= self.deadline_margin_ms < self.slo_ms:
            problems.append(f"deadline_margin_ms={self.deadline_margin_ms} must lie in [0, slo_ms)")
        if self.event_loop not in ("asyncio", "uvloop"):
            problems.append(f"event_loop={self.event_loop!r} must be 'asyncio' or 'uvloop'")
        problems += _tracing_problems(self.otlp_endpoint, self.trace_sample_ratio)
        if self.repository_poll_s < 0:
            problems.append(f"repository_poll_s={self.repository_poll_s} must not be negative (0: no polling)")
        if self.max_loop_lag_ms < 0:
            problems.append(f"max_loop_lag_ms={self.max_loop_lag_ms} must not be negative")
        if self.ray and self.workers != "local":
            problems.append("ray places the workers itself: leave workers at 'local'")
        if self.cells < 0:
            problems.append(f"cells={self.cells} must not be negative (0: sized to the machine)")
        if self.frontends < 0:
            problems.append(f"frontends={self.frontends} must not be negative (0: sized to the machine)")
        if self.pool_mib and self.pool_mib * MIB < DEFAULT_PAGE_BYTES:
            problems.append(
                f"pool_mib={self.pool_mib} must hold at least one {DEFAULT_PAGE_BYTES // MIB} MiB page "
                "(0: the runtime's default)"
            )
        if self.devices and not self.device_list():
            problems.append(f"devices={self.devices!r} names no device")
        if self.max_restarts_per_minute < 0:
            problems.append(f"max_restarts_per_minute={self.max_restarts_per_minute} must not be negative")
        if self.clockwork and self.policy not in SETTABLE:
            named = ", ".join(self.clockwork)
            problems.append(f"clockwork settings ({named}) apply to policy clockwork, not {self.policy!r}")
        elif self.clockwork:
            try:
                clockwork_config(self.clockwork, "clockwork settings")
            except ValueError as error:
                problems.append(str(error))
        if self.workers == "tcp" and not self.worker_secret and not self.allow_open_workers:
            problems.append(
                "workers='tcp' needs worker_secret (MAINSPRING_WORKER_SECRET or the config file), or "
                "allow_open_workers to let any process that reaches worker_port join as a worker"
            )
        if self.auth_inference and not self.auth_token:
            problems.append("auth_inference needs auth_token to be set")
        try:
            self.limits()
        except ValueError as error:
            problems.append(str(error))
        for positive in (
            "heartbeat_s",
            "worker_timeout_s",
            "join_timeout_s",
            "max_outstanding",
            "max_outstanding_mib",
        ):
            if not getattr(self, positive) > 0:
                problems.append(f"{positive}={getattr(self, positive)} must be positive")
        if problems:
            raise ValueError("bad serve configuration: " + "; ".join(problems))

    def limits(self) -> RequestLimits:
        return RequestLimits(**{f.name: getattr(self, f.name) for f in fields(RequestLimits)})

    @property
    def repo_path(self) -> Path:
        return Path(self.repo).expanduser() if self.repo else Path.home() / ".mainspring" / "zoo"

    @property
    def frontend_count(self) -> int:
        """Frontend processes in all, this one included."""
        return self.frontends or max(1, min(4, (os.cpu_count() or 1) // 2))

    def cell_count(self) -> int:
        """``cells``, or when 0 a cell per ``CELL_DEVICES`` local devices, at most one per two cores (a
        cell's controller wants a core, and so do the frontends): 1, today's single controller, for a
        machine of up to 16 devices, for remote workers (their number is not known at start) and on Ray."""
        if self.cells:
            return self.cells
        if self.workers != "local" or self.ray:
            return 1
        devices = len(self.device_list())
        return max(1, min(math.ceil(devices / CELL_DEVICES), (os.cpu_count() or 1) // 2, devices))

    def device_list(self) -> list[str]:
        if self.devices:
            return [d.strip() for d in self.devices.split(",") if d.strip()]
        import torch

        return [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"]


def _tracing_problems(endpoint: str, ratio: float) -> list[str]:
    problems = [] if 0.0 <= ratio <= 1.0 else [f"trace_sample_ratio={ratio} must lie in [0, 1]"]
    if not endpoint:
        return problems
    url = urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname:
        problems.append(f"otlp_endpoint={endpoint!r} must be an http:// or https:// URL (OTLP/HTTP)")
    try:
        missing = any(importlib.util.find_spec(name) is None for name in OTEL_MODULES)
    except ModuleNotFoundError:  # a parent package is missing
        missing = True
    if missing:
        problems.append(
            "otlp_endpoint needs OpenTelemetry's SDK and OTLP/HTTP exporter: pip install 'mainspring[otel]'"
        )
    return problems


def load_config(
    file: Path | None, environ: dict[str, str], flags: dict[str, Any], clockwork_flags: list[str] | None = None
) -> ServeConfig:
    """Merge the sources; each value is converted to the field's type, with an error naming the source.
    ``clockwork_flags``: ``KEY=VALUE`` texts for the clockwork policy's settings."""
    values: dict[str, Any] = {}
    clockwork: dict[str, Any] = {}
    if file is not None:
        try:
            document = tomllib.loads(file.read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise ValueError(f"cannot read config file {file}: {error}") from None
        clockwork.update(_clockwork_values(document.pop("clockwork", {}), f"config file {file} [clockwork]"))
        values.update(_serve_values(document.get("serve", document), f"config file {file}"))
    for key, value in environ.items():
        if key.startswith(CLOCKWORK_ENV_PREFIX):
            name = key[len(CLOCKWORK_ENV_PREFIX) :].lower()
            clockwork.update(_clockwork_values({name: value}, f"environment variable {key}"))
        elif key.startswith(ENV_PREFIX) and key != f"{ENV_PREFIX}HOME":
            values.update(_serve_values({key[len(ENV_PREFIX) :].lower(): value}, f"environment variable {key}"))
    for text in clockwork_flags or []:
        clockwork.update(_clockwork_values(key_values([text], "--clockwork"), f"--clockwork {text}"))
    values.update(_serve_values({k: v for k, v in flags.items() if v is not None}, "flags"))
    return replace(ServeConfig(), **values, clockwork=clockwork)


def _serve_values(table: Mapping[str, object], where: str) -> dict[str, Any]:
    devices = table.get("devices")
    if isinstance(devices, list) and devices and all(isinstance(device, str) for device in devices):
        table = {**table, "devices": ",".join(devices)}  # TOML's natural spelling: devices = ["cpu", "cpu"]
    refused = {"clockwork": "the [clockwork] table, MAINSPRING_CLOCKWORK_<NAME> or --clockwork NAME=VALUE"}
    return dataclass_values(ServeConfig, table, where, refused)


def _clockwork_values(table: object, where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a table of settings, got {table!r}")
    return dataclass_values(ClockworkConfig, table, where, NOT_A_POLICY_SETTING)


def ensure_repository(config: ServeConfig) -> ModelRepository:
    """The configured repository; the built-in zoo is written there on first start."""
    path = config.repo_path
    if not path.exists() and not config.repo:
        from mainspring.models.loading import export_zoo_model

        log.info("first start: writing the built-in zoo into %s", path)
        path.mkdir(parents=True)
        repo = ModelRepository(path)
        for name in DEFAULT_ZOO:
            export_zoo_model(repo, name)
        return repo
    return ModelRepository(path)
