"""Settings of the Clockwork policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from mainspring.settings import dataclass_values
from mainspring.time import ms_to_ns

# Set by whoever runs the policy, not by the policy's own settings.
NOT_A_POLICY_SETTING = {
    "deadline_margin_ms": "the server's deadline_margin_ms (the simulator: its network latency)",
}


@dataclass(frozen=True)
class ClockworkConfig:
    """``horizon_ms``: how far ahead a lane's work is planned (Clockwork: 5-10 ms).
    ``window_slack_ms``: how late after its earliest start an action may still start
    (default: the horizon), so the controller's view of a device never drifts far.
    ``max_batch_size`` caps the profile's supported sizes.
    ``replica_min_demand``: unmet demand (share of one device's time) that earns a
    hot model another replica; below it, replicas would churn memory for little.
    ``replicas_by_wait``: a model whose requests its holders turn away for their deadline, while a
    device without it has a lane free in time for them, gets a replica once its holders turn away
    ``replica_min_waits_per_s`` such requests a second (decayed over ``rate_memory_ms``); the replica
    takes only free memory (``docs/scheduler/loads-and-evictions.md``, "Replicas by wait"). Off:
    replicas only for demand beyond what the holders serve.
    ``min_share``: the share of its devices' time a model may always fill with queued
    work, however busy the other models are; beyond it a model only gets what the
    others' recent demand (remembered over ``rate_memory_ms``) leaves free. This is
    what keeps a burst on one model from starving the rest.
    ``device_admission``: at arrival, count the work other models have queued on a device
    (due no later) before this request, not only its own model's.
    ``deadline_margin_ms``: the margin for the result's trip back to the client that every request's
    ``ready_by_ns`` already takes off its deadline (the policy plans batches by ``ready_by_ns``); the
    tight-class guard plans a class's slack by it (see ``docs/scheduler/admission.md``).
    ``demand_counts_rejected``: count rejected arrivals in a model's demand (on: an open-loop
    burst's rejected requests are real demand; without them the burst looks within its share).
    ``whole_batches``: when the most urgent request allows only part of a backlog and the rest
    could not follow, pass over it for the largest batch that fits (INFER4's skip).
    ``lookahead_within_share``: the lookahead only spares models within their share.
    ``share_full_batch``: a model over its share may still queue one full batch.
    ``share_protects_only``: share admission holds a model to its share only where another model on
    its holders asks for less than its max-min fair share (one there to protect).
    ``share_by_cost``: shares weigh a model's demand at the batch its rate fills in half its SLO, and,
    beside a model that has asked for ``share_steady_after_ms``, the models that have not or that fill no
    batch of two share one entry of the fair level, the flood; the guard's tight models are never held
    (``cost_shares.py``; it replaces ``share_protects_only`` and ``share_full_batch``). Off (the
    default): demand at batch-1 cost, one entry per model (``docs/scheduler/admission.md``, "Shares by
    what a rate costs").
    ``split_padding``: a batch that would be padded runs instead as the first of the batches that
    serve its requests in the least lane time (12 requests: 8 now and 4 next, not 16 with 4 empty).
    ``start_early``: infers may start as soon as the lane is free (earliest = now), as INFER4's do.
    ``efficient_when_contended``: when the waiting models' batches cannot all meet their deadlines
    in deadline order, run the one that serves the most requests per unit of lane time (a model
    within its share keeps deadline order against models over theirs).
    ``spill_after``: a queued request that has waited this share of its SLO on a holder whose
    exec lane is booked marks its model for a new replica (None: never).
    ``probe_after_ms``: a model that an idle holder refuses by its own estimates, and that has not
    been measured for this long, gets one request run at once (a probe); the probe's measurement
    replaces the estimate that refused it (None: never; then only ``estimate_max_age_s`` lifts
    such a lockout). A batch size whose estimate stands 1.5x above its profile times the kind's
    ratio and that has not been measured for this long is forgotten too (it borrows the ratio
    again): a size its stall keeps from being planned is never measured again to correct it.
    ``monotone_estimates``: plan a batch size at no more than the estimate of any larger size (a
    batch runs no slower than a larger one), so a spike in one size's window neither pads batches
    past it nor stops that size from being run and measured again.
    ``estimate_percentile_cpu``: the percentile for devices of kind ``cpu``: the median. A CPU worker
    shares its cores with the server and the clients, so its timings have a heavy tail that a GPU's
    lack; with a window of 10 the p99 is the largest of the last 10, one interference spike, and
    even p90 priced two batches in a row past SLOs they meet most of the time (live figures in
    ``docs/scheduler/estimates.md``, "Estimates on a CPU").
    ``admission_percentile_cpu``: admission on devices of kind ``cpu`` judges by estimates at this
    percentile while planning keeps ``estimate_percentile_cpu`` (None: admission judges by the
    planner's estimates); the demand admission records, which shares, replica priorities and the
    trade-off read, is priced by the same estimates. Made for planning at p90, whose two estimates
    end to end (the running batch's and the next one's) refused requests that would make it
    (``benchmarks/closed_loop_noise.py``; ``docs/scheduler/estimates.md``).
    ``estimate_max_age_s``: measurements older than this stop counting (None: never), so one
    stall cannot lock a model out for good; models measured less often fall back to the profile.
    ``evict_by_popularity``: a load that needs room evicts, among the least recently used models it
    may evict (``loads.EVICTION_SAMPLE`` of them, or as many as the room takes), the ones with the
    fewest recent arrivals (remembered over ``popularity_memory_ms``) first; off: the least recently
    used first, as Clockwork. Under skewed popularity LRU evicts a popular model after one gap in
    its arrivals and loads it again soon after (``docs/scheduler/loads-and-evictions.md``, "Evictions").
    ``gather_max_ms``: a free lane with one model waiting, about to run its whole queue in a batch
    that could hold one more request, waits up to this long for that request, when the model's
    arrival rate expects at least one within the lane time the extra request would save (a padded place
    filled for nothing, or one batch instead of two); never past what the head's deadline allows
    (None: never wait, as Clockwork). The wait pays in expectation only from that rate up
    (``docs/scheduler/batching.md``, "Waiting for one more request").
    ``loads_by_need``: cold models (and models that need a replica to serve their queued requests)
    load in order of when their weights must be in place, their most urgent request's ready-by less
    its fastest infer; off: of the latest start of their load, which takes the load's own time off
    too. While every load fits both orders meet every deadline; past a saturated load lane the
    latest start puts the longest loads first, each serving no more requests than a short one
    (``docs/scheduler/loads-and-evictions.md``, "Cold loads in order of need").
    ``guard_tight``: keep devices responsive for models whose SLO a looser model's batch would break
    (``guard.py``; off: every device runs the least-slack batch whole, as Clockwork).
    ``guard_utilization``: the share of a responsive device the tight models' recent work may fill;
    it sets how many devices stay responsive.
    ``guard_room``: how many batch-1 inferences of a tight model a looser batch on a responsive
    device leaves room for before the tight model's deadline."""

    horizon_ms: float = 5.0
    window_slack_ms: float | None = None
    estimate_window: int = 10
    estimate_percentile: float = 99.0
    estimate_percentile_cpu: float = 50.0
    estimate_max_age_s: float | None = 60.0
    max_batch_size: int = 16
    replication_check_ms: float = 10.0
    replica_min_demand: float = 0.05
    replicas_by_wait: bool = False
    replica_min_waits_per_s: float = 2.0
    min_share: float = 0.2
    max_batch_slo_fraction: float = 0.5
    share_admission: bool = True
    lookahead: bool = True
    queue_demand: bool = True
    rate_memory_ms: float = 1000.0
    device_admission: bool = False
    deadline_margin_ms: float = 0.0
    demand_counts_rejected: bool = True
    whole_batches: bool = True
    lookahead_within_share: bool = True
    share_full_batch: bool = True
    split_padding: bool = True
    share_protects_only: bool = True
    share_by_cost: bool = False
    share_steady_after_ms: float = 60_000.0
    start_early: bool = True
    efficient_when_contended: bool = True
    spill_after: float | None = 0.5
    probe_after_ms: float | None = 1000.0
    monotone_estimates: bool = True
    admission_percentile_cpu: float | None = None
    evict_by_popularity: bool = True
    popularity_memory_ms: float = 10_000.0
    gather_max_ms: float | None = 10.0
    loads_by_need: bool = True
    guard_tight: bool = True
    guard_utilization: float = 0.5
    guard_room: int = 2

    def __post_init__(self) -> None:
        problems = []
        if self.horizon_ms < 0:
            problems.append(f"horizon_ms={self.horizon_ms} must not be negative")
        if self.window_slack_ms is not None and self.window_slack_ms < 0:
            problems.append(f"window_slack_ms={self.window_slack_ms} must not be negative")
        if not 0 < self.min_share <= 1 or self.rate_memory_ms <= 0:
            problems.append(f"min_share={self.min_share} must lie in (0, 1], rate_memory_ms={self.rate_memory_ms} > 0")
        if self.share_steady_after_ms < 0:
            problems.append(f"share_steady_after_ms={self.share_steady_after_ms} must not be negative")
        if self.replica_min_waits_per_s <= 0:
            problems.append(f"replica_min_waits_per_s={self.replica_min_waits_per_s} must be positive")
        if self.popularity_memory_ms <= 0:
            problems.append(f"popularity_memory_ms={self.popularity_memory_ms} must be positive")
        if self.deadline_margin_ms < 0:
            problems.append(f"deadline_margin_ms={self.deadline_margin_ms} must not be negative")
        if self.estimate_max_age_s is not None and self.estimate_max_age_s <= 0:
            problems.append(f"estimate_max_age_s={self.estimate_max_age_s} must be positive (or None)")
        if self.spill_after is not None and not 0 < self.spill_after < 1:
            problems.append(f"spill_after={self.spill_after} must lie in (0, 1) (or None)")
        if self.probe_after_ms is not None and self.probe_after_ms <= 0:
            problems.append(f"probe_after_ms={self.probe_after_ms} must be positive (or None)")
        if self.gather_max_ms is not None and self.gather_max_ms <= 0:
            problems.append(f"gather_max_ms={self.gather_max_ms} must be positive (or None)")
        if self.estimate_window < 1:
            problems.append(f"estimate_window={self.estimate_window} must be at least 1")
        for name in ("estimate_percentile", "estimate_percentile_cpu", "admission_percentile_cpu"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 100:
                problems.append(f"{name}={value} must lie in (0, 100]")
        if self.replication_check_ms < 0:
            problems.append(f"replication_check_ms={self.replication_check_ms} must not be negative")
        if not 0 < self.max_batch_slo_fraction <= 1:
            problems.append(f"max_batch_slo_fraction={self.max_batch_slo_fraction} must lie in (0, 1]")
        if not 0 < self.guard_utilization <= 1:
            problems.append(f"guard_utilization={self.guard_utilization} must lie in (0, 1]")
        if self.guard_room < 1:
            problems.append(f"guard_room={self.guard_room} must be at least 1")
        if self.max_batch_size < 1:
            problems.append(f"max_batch_size={self.max_batch_size} must be at least 1")
        if problems:
            raise ValueError("bad clockwork config: " + "; ".join(problems))

    def with_settings(self, settings: Mapping[str, object], where: str) -> ClockworkConfig:
        """This config with ``settings`` (field names; text or TOML values) applied, each checked
        with an error naming it and ``where`` (e.g. ``config file serve.toml [clockwork]``)."""
        values = dataclass_values(ClockworkConfig, settings, where, NOT_A_POLICY_SETTING)
        try:
            return replace(self, **values)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None

    @property
    def horizon_ns(self) -> int:
        return ms_to_ns(self.horizon_ms)

    @property
    def gather_max_ns(self) -> int | None:
        return None if self.gather_max_ms is None else ms_to_ns(self.gather_max_ms)

    @property
    def deadline_margin_ns(self) -> int:
        return ms_to_ns(self.deadline_margin_ms)

    @property
    def window_slack_ns(self) -> int:
        return ms_to_ns(self.horizon_ms if self.window_slack_ms is None else self.window_slack_ms)
