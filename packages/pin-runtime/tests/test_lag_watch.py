"""The pure part of the lag watcher: a partition's lag, what the series show between passes,
and the settings (a bad value names its variable)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from pin_runtime.errors import SettingsError
from pin_runtime.lag_watch.app import longest_pass
from pin_runtime.lag_watch.lag import LagBook, Position, Reading, oldest_offset, records_lag
from pin_runtime.lag_watch.metrics import ERROR_KINDS, LagWatchMetrics
from pin_runtime.lag_watch.settings import LagWatchSettings, TopicName
from pin_runtime.lag_watch.watcher import WatchPlan
from pin_runtime.settings import load_settings

P0 = Position("crm-access", "pin.identity.access.v1", 0)
P1 = Position("crm-access", "pin.identity.access.v1", 1)
GATEWAY = Position("gateway-access", "pin.identity.access.v1", 0)


@pytest.mark.parametrize(
    ("low", "high", "committed", "records", "start"),
    [
        (0, 10, 4, 6, 4),
        (0, 10, 10, 0, 10),  # caught up
        (0, 0, None, 0, 0),  # an empty partition never committed
        (3, 10, None, 7, 3),  # never committed: from the first record still there
        (3, 10, -1001, 7, 3),  # the broker's "no offset"
        (5, 10, 2, 8, 2),  # committed before records were deleted: still counted from it
        (0, 10, 12, 0, 12),  # committed past the end (the topic was recreated): no lag
    ],
)
def test_records_lag_and_where_the_oldest_record_is(
    low: int, high: int, committed: int | None, records: int, start: int
) -> None:
    assert records_lag(low=low, high=high, committed=committed) == records
    assert oldest_offset(low=low, committed=committed) == start


def test_seconds_lag_is_the_age_of_the_oldest_unconsumed_record_and_zero_when_caught_up() -> None:
    book = LagBook(stale_after=600)
    book.update(P0, Reading(records=6, start=4, oldest=1000.0), at=0.0)
    book.update(P1, Reading(records=0, start=9, oldest=None), at=0.0)
    shown = {s.position: (s.records, s.seconds) for s in book.series(now=1300.0, at=1.0)}
    assert shown == {P0: (6, 300.0), P1: (0, 0.0)}


def test_a_record_stamped_in_the_future_is_not_a_negative_lag() -> None:
    book = LagBook(stale_after=600)
    book.update(P0, Reading(records=1, start=0, oldest=2000.0), at=0.0)
    assert [s.seconds for s in book.series(now=1990.0, at=0.0)] == [0.0]


def test_a_position_not_read_again_ages_then_is_dropped() -> None:
    book = LagBook(stale_after=600)
    book.update(P0, Reading(records=6, start=4, oldest=1000.0), at=0.0)
    book.update(P1, Reading(records=0, start=9, oldest=None), at=0.0)
    # Passes fail (a broker outage): the group behind stays behind, its age keeps growing;
    # the group caught up stays at 0.
    later = {s.position: (s.records, s.seconds) for s in book.series(now=1900.0, at=600.0)}
    assert later == {P0: (6, 900.0), P1: (0, 0.0)}
    assert list(book.series(now=1901.0, at=600.5)) == []
    assert len(book) == 0


def test_catching_up_resolves_at_the_next_reading_without_new_records() -> None:
    book = LagBook(stale_after=600)
    book.update(P0, Reading(records=6, start=4, oldest=1000.0), at=0.0)
    book.update(P0, Reading(records=0, start=10, oldest=None), at=15.0)
    assert [(s.records, s.seconds) for s in book.series(now=5000.0, at=15.0)] == [(0, 0.0)]


def test_a_known_record_is_not_read_again_while_the_group_stays_on_it() -> None:
    book = LagBook(stale_after=600)
    book.update(P0, Reading(records=6, start=4, oldest=1000.0), at=0.0)
    assert book.known_oldest(P0, 4) == 1000.0
    assert book.known_oldest(P0, 5) is None  # the group moved: another record
    assert book.known_oldest(P1, 4) is None


def test_groups_no_longer_watched_leave_at_once() -> None:
    book = LagBook(stale_after=600)
    for position in (P0, P1, GATEWAY):
        book.update(position, Reading(records=1, start=0, oldest=1.0), at=0.0)
    assert book.retire({("gateway-access", "pin.identity.access.v1")}) == [P0, P1]
    assert [s.position for s in book.series(now=2.0, at=0.0)] == [GATEWAY]


def test_a_lag_without_its_oldest_record_is_refused() -> None:
    with pytest.raises(ValueError, match="needs its oldest"):
        LagBook(stale_after=1).update(P0, Reading(records=1, start=0, oldest=None), at=0.0)


class Watched(LagWatchSettings, frozen=True, kw_only=True):
    lag_watch_topics: tuple[TopicName, ...] = ("pin.identity.access.v1",)
    lag_watch_discover: bool = True


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("T_LAG_WATCH_INTERVAL", "soon", "expected a duration like 250ms"),
        ("T_LAG_WATCH_INTERVAL", "500ms", "must be at least 1s"),
        ("T_LAG_WATCH_TOPICS", "", "at least one topic"),
        ("T_LAG_WATCH_TOPICS", "a topic", "expected a comma-separated list"),
        ("T_LAG_WATCH_DISCOVER", "false", "no group to watch"),
        ("T_LAG_WATCH_REQUEST_TIMEOUT", "1m", "at most T_LAG_WATCH_INTERVAL"),
        ("T_LAG_WATCH_STALE_AFTER", "20s", "at least twice T_LAG_WATCH_INTERVAL"),
        ("T_LAG_WATCH_MAX_GROUPS", "0", "expected an integer >= 1"),
        ("T_LAG_WATCH_GROUPS", "a,,b", "expected a comma-separated list"),
    ],
)
def test_a_bad_setting_names_its_variable(variable: str, value: str, reason: str) -> None:
    with pytest.raises(SettingsError) as failure:
        load_settings(Watched, "T_", {variable: value})
    assert failure.value.variable == variable.replace("_DISCOVER", "_GROUPS")
    assert reason in failure.value.reason


def test_the_plan_never_watches_the_watchers_own_reader() -> None:
    settings = load_settings(
        Watched, "T_", {"T_LAG_WATCH_GROUPS": "a,b,a", "T_LAG_WATCH_EXCLUDE_GROUPS": "old"}
    )
    plan = WatchPlan.of(settings, reader_group="svc-lag-watcher")
    assert plan.groups == ("a", "b")
    assert plan.exclude == {"old", "svc-lag-watcher"}
    assert (plan.interval, plan.stale_after, plan.max_groups) == (15.0, 600.0, 200)
    # The heartbeat allows the slowest pass the settings permit: every request timing out.
    assert longest_pass(settings) == 15 + 11 * (1 + 3 + 2 * 7)


def test_every_error_kind_is_exported_from_the_start() -> None:
    registry = CollectorRegistry()
    LagWatchMetrics(registry)
    for kind in ERROR_KINDS:
        assert registry.get_sample_value("pin_lag_watcher_errors_total", {"kind": kind}) == 0
