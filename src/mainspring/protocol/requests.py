"""Client requests and the answers the scheduler gives them."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# The longest SLO a request or model may ask for. Deadlines travel to workers as 64-bit integers
# (``msgspec``), and a day is beyond any inference SLO: a longer one is a mistake, not an SLO.
MAX_SLO_MS = 24 * 3600 * 1000

NS_PER_MS_INT = 1_000_000


def slo_problem(name: str, value: object, unit_ns: int = NS_PER_MS_INT) -> str | None:
    """What is wrong with ``value`` as an SLO in ``unit_ns`` nanoseconds (``name`` says where it came
    from), or None: it must be a positive number of at most a day. The one range check of every SLO
    (a request's ``slo_ms`` or ``timeout``, a model's config, ``serve``, ``simulate`` and ``bench``);
    the range is checked before any conversion, which a value such as 1e308 would overflow."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:  # NaN too
        return f"{name} must be a positive number, got {value!r}"[:300]
    most = MAX_SLO_MS * NS_PER_MS_INT // unit_ns
    if value > most:  # infinity, and an integer too large for a float (math.isinf would overflow on it)
        return f"{name} must be at most {most} (one day), got {value!r}"[:300]
    return None


def resolve_slo_ns(requested_ns: int | None, model_slo_ms: float | None, default_ns: int) -> int:
    """A request's SLO: its own, else its model's, else the server's (the one precedence, at the edge)."""
    if requested_ns is not None:
        return requested_ns
    if model_slo_ms is not None:
        return round(model_slo_ms * NS_PER_MS_INT)
    return default_ns


# Every batch is planned to end this long before its deadline: the result's trip from the worker
# (ZeroMQ round trip on loopback: 0.06 ms p50, 0.12 ms p99, MEASUREMENTS.md) plus the answer's way
# out through the frontend (0.5-1 ms for a JSON response, benchmarks/serving_overhead.py).
DEFAULT_DEADLINE_MARGIN_MS = 1.0


@dataclass(frozen=True, slots=True)
class Request:
    """One client inference. ``deadline_ns`` (absolute) is its arrival plus ``slo_ns``: when the client
    must have its answer. ``ready_by_ns`` is when its result must be ready at the worker: the deadline
    less the controller's margin for the answer's trip back. Every policy plans by ``ready_by_ns`` and
    sends it in ``Infer.deadlines_ns``; neither is ever rewritten."""

    id: int
    model: str
    arrival_ns: int
    deadline_ns: int
    slo_ns: int
    ready_by_ns: int
    inputs: object = field(default=None, compare=False, repr=False)

    @classmethod
    def arriving(
        cls, request_id: int, model: str, arrival_ns: int, slo_ns: int, margin_ns: int, inputs: object = None
    ) -> Request:
        """A request that arrived at ``arrival_ns`` with ``slo_ns``, its answer's trip back taking ``margin_ns``."""
        deadline_ns = arrival_ns + slo_ns
        return cls(request_id, model, arrival_ns, deadline_ns, slo_ns, deadline_ns - margin_ns, inputs)


class ResponseStatus(enum.Enum):
    SUCCESS = "success"
    REJECTED = "rejected"  # answered early: the deadline cannot be met
    TIMED_OUT = "timed_out"  # dropped after waiting too long
    ERROR = "error"


class Outcome(enum.Enum):
    """Why a request got the answer it got: set where the answer is made, so that clients
    (through HTTP and gRPC status codes), metrics and tests never read it from the wording."""

    SERVED = "served"
    DEADLINE_AT_ARRIVAL = "deadline_at_arrival"  # rejected on arrival: no device could finish in time
    OVERLOADED = "overloaded"  # rejected on arrival: the model's queue already fills its share
    EXPIRED_IN_QUEUE = "expired_in_queue"  # rejected from the queue once no device could finish in time
    QUEUE_TIMEOUT = "queue_timeout"  # dropped after waiting in the queue until (nearly) its deadline
    UNKNOWN_MODEL = "unknown_model"
    DOES_NOT_FIT = "does_not_fit"  # the model's weights fit on no connected device
    NO_WORKER = "no_worker"
    MODEL_UNLOADED = "model_unloaded"
    WORKER_LOST = "worker_lost"  # its worker was lost and the deadline no longer allows another try
    LOAD_FAILED = "load_failed"
    INPUT_FAILED = "input_failed"  # the model failed on this request's input, run alone; others were served
    INFERENCE_FAILED = "inference_failed"  # the model failed on the batch and has served no input yet
    BAD_RESULT = "bad_result"  # its worker answered with a malformed result (it is dropped)
    SHUTTING_DOWN = "shutting_down"

    @property
    def status(self) -> ResponseStatus:
        return _STATUS.get(self, ResponseStatus.ERROR)


_STATUS = {
    Outcome.SERVED: ResponseStatus.SUCCESS,
    Outcome.DEADLINE_AT_ARRIVAL: ResponseStatus.REJECTED,
    Outcome.OVERLOADED: ResponseStatus.REJECTED,
    Outcome.EXPIRED_IN_QUEUE: ResponseStatus.REJECTED,
    Outcome.QUEUE_TIMEOUT: ResponseStatus.TIMED_OUT,
}


@dataclass(frozen=True, slots=True)
class Response:
    """The scheduler's answer to one request; ``action_id`` names the Infer that served it."""

    request_id: int
    outcome: Outcome
    reason: str = ""
    action_id: int | None = None

    @property
    def status(self) -> ResponseStatus:
        return self.outcome.status
