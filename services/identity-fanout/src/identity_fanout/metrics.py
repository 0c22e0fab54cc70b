"""Prometheus metrics of the fan-out worker. The first six names are the spec's, exactly."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from pin_runtime.metrics import MetricDeclarations

# Task durations span milliseconds (an empty role) to minutes (a 50k-user role).
_DURATION_MS_BUCKETS = (
    10,
    50,
    100,
    250,
    500,
    1000,
    2500,
    5000,
    10_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
)
# The SLO is "fan-out of a role of <= 50k users done within 5 minutes of enqueue (p99)".
_LAG_SECONDS_BUCKETS = (1, 5, 10, 30, 60, 120, 180, 240, 300, 600, 1800, 3600)
_SIZE_BUCKETS = (0, 1, 10, 100, 1000, 5000, 10_000, 50_000, 100_000, 500_000, 1_000_000)


class FanoutMetrics:
    """Every metric of the worker, on one registry (never the process-global default)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        m = MetricDeclarations(registry)
        self.task_duration_ms = m.histogram(
            "identity_access_fanout_task_duration_ms",
            "Time of one task run, from claim to completion (ms); a sharded task: from its "
            "first claim to the completion of its last shard.",
            _DURATION_MS_BUCKETS,
        )
        self.users = m.counter(
            "identity_access_fanout_users",
            "Users fanned out: one UserAccessChanged event each, committed to the outbox.",
        )
        self.queue_backlog = m.gauge(
            "identity_access_fanout_queue_backlog",
            "Tasks waiting for a worker: Pending, or InProgress with an expired lease.",
        )
        self.errors = m.counter(
            "identity_access_fanout_errors",
            "Failures of the worker: failed batches, failed polls, lost leases, poison tasks.",
            "kind",
        )
        self.task_lag_seconds = m.histogram(
            "identity_access_fanout_task_lag_seconds",
            "Time from enqueue (CreatedAt) to completion of a task (s); the SLO's measure.",
            _LAG_SECONDS_BUCKETS,
        )
        self.size = m.histogram(
            "identity_access_fanout_size",
            "Users per completed task (compare with set-role-permissions).",
            _SIZE_BUCKETS,
        )
        self.tasks = m.counter(
            "identity_access_fanout_tasks",
            "Task runs ended, by outcome: completed, failed (poison), lease_lost, released.",
            "outcome",
        )
        self.shards = m.counter(
            "identity_access_fanout_shards",
            "Shard runs of large tasks ended, by outcome: completed, failed (poison), "
            "lease_lost, released. The whole task counts once in identity_access_fanout_tasks.",
            "outcome",
        )
        self.batches = m.counter(
            "identity_access_fanout_batches",
            "Batches committed (events + checkpoint in one transaction).",
        )
        self.failed_tasks = m.gauge(
            "identity_access_fanout_failed_tasks",
            "Tasks in status Failed (poison) now; each needs the replay runbook.",
        )
        self.leased_tasks = m.gauge(
            "identity_access_fanout_leased_tasks", "Tasks InProgress under a live lease now."
        )
        self.oldest_task_age_seconds = m.gauge(
            "identity_access_fanout_oldest_task_age_seconds",
            "Age of the oldest Pending or InProgress task (s).",
        )
        self.last_success = m.gauge(
            "identity_access_fanout_last_success_timestamp_seconds",
            "Unix time of the last poll cycle that ended without error.",
        )
        for kind in ("batch", "poll", "lease_lost", "poison"):
            self.errors.labels(kind=kind)
        for outcome in ("completed", "failed", "lease_lost", "released"):
            self.tasks.labels(outcome=outcome)
            self.shards.labels(outcome=outcome)
