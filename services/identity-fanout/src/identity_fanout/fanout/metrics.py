"""Prometheus metrics of the fan-out worker. The first six names are the spec's, exactly.

Each metric is declared once, as an attribute of `FanoutMetrics` (name, help, labels,
buckets and why those buckets). A counter's name is exported with `_total` appended.
"""

from __future__ import annotations

from pin_runtime.metrics import MetricSet, counter, gauge, histogram


class FanoutMetrics(MetricSet):
    """Every metric of the worker, on one registry (never the process-global default)."""

    task_duration_ms = histogram(
        "identity_access_fanout_task_duration_ms",
        "Time of a task from its first claim (StartedAt) to its completion (ms), for a task "
        "walked whole and a sharded task (to its last shard's completion) alike.",
        # Task durations span milliseconds (an empty role) to minutes (a 50k-user role).
        buckets=(
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
        ),
    )
    users = counter(
        "identity_access_fanout_users",
        "Users fanned out: one UserAccessChanged event each, committed to the outbox.",
    )
    queue_backlog = gauge(
        "identity_access_fanout_queue_backlog",
        "Tasks waiting for a worker: Pending, or InProgress with an expired lease.",
    )
    errors = counter(
        "identity_access_fanout_errors",
        "Failures of the worker by kind: batch (a unit's own failure, counted towards poison), "
        "outage (a failure that is not the unit's: the database, the schema or a timeout "
        "hitting every unit; never counted), poll, lease_lost, poison.",
        labels=("kind",),
    )
    task_lag_seconds = histogram(
        "identity_access_fanout_task_lag_seconds",
        "Time from enqueue (CreatedAt) to completion of a task (s); the SLO's measure.",
        # The SLO is "fan-out of a role of <= 50k users done within 5 minutes of enqueue
        # (p99)".
        buckets=(1, 5, 10, 30, 60, 120, 180, 240, 300, 600, 1800, 3600),
    )
    size = histogram(
        "identity_access_fanout_size",
        "Users per completed task (compare with set-role-permissions).",
        buckets=(0, 1, 10, 100, 1000, 5000, 10_000, 50_000, 100_000, 500_000, 1_000_000),
    )
    tasks = counter(
        "identity_access_fanout_tasks",
        "Task runs ended, by outcome: completed, failed (poison), lease_lost, released, "
        "superseded (a newer version of the role took over the remaining users).",
        labels=("outcome",),
    )
    shards = counter(
        "identity_access_fanout_shards",
        "Shard runs of large tasks ended, by outcome: completed, failed (poison), "
        "lease_lost, released. The whole task counts once in identity_access_fanout_tasks.",
        labels=("outcome",),
    )
    batches = counter(
        "identity_access_fanout_batches",
        "Batches committed (events + checkpoint in one transaction).",
    )
    failed_tasks = gauge(
        "identity_access_fanout_failed_tasks",
        "Tasks in status Failed (poison) now; each needs the replay runbook.",
    )
    leased_tasks = gauge(
        "identity_access_fanout_leased_tasks",
        "Tasks InProgress under a live lease now.",
    )
    oldest_task_age_seconds = gauge(
        "identity_access_fanout_oldest_task_age_seconds",
        "Age of the oldest Pending or InProgress task (s).",
    )
    oldest_waiting_seconds = gauge(
        "identity_access_fanout_oldest_waiting_seconds",
        "How long the task that waits longest for a worker has waited (s): claimable and "
        "served by no worker (a sharded task: none of its shards leased). 0 when every "
        "waiting task is being walked. With fair claims a task waits at most one shard of "
        "another.",
    )
    last_success = gauge(
        "identity_access_fanout_last_success_timestamp_seconds",
        "Unix time of the last successful run: a committed batch or split, a poll that found "
        "nothing to do, or a wait for the relays. A cycle whose batches all failed is none.",
    )
    outbox_backlog = gauge(
        "identity_access_fanout_outbox_backlog",
        "Outbox rows waiting for the relays, as the worker sees them before each batch (the "
        "id span from the oldest to the newest row: an upper bound). The worker holds its "
        "batches while it is at IDENTITY_FANOUT_MAX_OUTBOX_BACKLOG; reported even when no "
        "relay runs.",
    )
    outbox_oldest_age_seconds = gauge(
        "identity_access_fanout_outbox_oldest_age_seconds",
        "Age of the oldest outbox row, as the worker sees it; 0 when the outbox is empty.",
    )
    throttled = gauge(
        "identity_access_fanout_throttled",
        "1 while this worker holds its next batch because the outbox is full, else 0.",
    )
    throttled_seconds = counter(
        "identity_access_fanout_throttled_seconds",
        "Time the worker held its next batch because the outbox was full (s).",
    )
    database_auth_failures = counter(
        "identity_access_fanout_database_auth_failures",
        "Connects of this worker whose login PostgreSQL refused (SQLSTATE 28P01 "
        "invalid_password, 28000 invalid_authorization_specification): a rotated password "
        "or a wrong secret; the pool and the LISTEN session retry with backoff.",
    )

    def __post_init__(self) -> None:
        # Every label value exported from the start (at 0), so rates and alerts see a series
        # before its first event.
        for kind in ("batch", "outage", "poll", "lease_lost", "poison"):
            self.errors.labels(kind=kind)
        for outcome in ("completed", "failed", "lease_lost", "released", "superseded"):
            self.tasks.labels(outcome=outcome)
            self.shards.labels(outcome=outcome)
