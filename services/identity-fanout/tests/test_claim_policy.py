"""The retry policy of a failed batch, and whose fault a failure is: pure."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from identity_fanout.fanout.queue import retry_delay
from identity_fanout.fanout.walk import Failure, classify_failure, counts_against_unit

POLL = timedelta(seconds=5)
LEASE = timedelta(minutes=5)


def test_delay_doubles_from_the_polling_interval() -> None:
    delays = [retry_delay(n, polling_interval=POLL, lease=LEASE) for n in range(1, 8)]
    assert delays == [timedelta(seconds=s) for s in (5, 10, 20, 40, 80, 160, 300)]


@given(st.integers(min_value=-5, max_value=10_000))
def test_delay_is_never_longer_than_the_lease(attempt: int) -> None:
    delay = retry_delay(attempt, polling_interval=POLL, lease=LEASE)
    assert POLL <= delay <= LEASE


# -- whose fault a failed batch is ----------------------------------------------------------


def _pg_error(sqlstate: str) -> psycopg.Error:
    return psycopg.errors.lookup(sqlstate)("boom")


@pytest.mark.parametrize(
    ("sqlstate", "failure"),
    [
        ("57014", Failure.CONTENTION),  # statement timeout
        ("55P03", Failure.CONTENTION),  # lock timeout
        ("40P01", Failure.CONTENTION),
        ("40001", Failure.CONTENTION),
        ("42501", Failure.OUTAGE),  # a privilege lost
        ("42P01", Failure.OUTAGE),  # a table missing
        ("3F000", Failure.OUTAGE),
        ("08006", Failure.OUTAGE),  # connection lost
        ("57P01", Failure.OUTAGE),  # admin shutdown
        ("53300", Failure.OUTAGE),  # too many connections
        ("22007", Failure.UNIT),  # a bad value in the unit's data
        ("P0001", Failure.UNIT),  # raised by a trigger on the unit's rows
        ("23505", Failure.UNIT),
    ],
)
def test_failures_are_classified_by_sqlstate(sqlstate: str, failure: Failure) -> None:
    assert classify_failure(_pg_error(sqlstate)) is failure


def test_a_wrapped_database_error_is_classified_by_its_cause() -> None:
    wrapped = RuntimeError("batch failed")
    wrapped.__cause__ = _pg_error("55P03")
    assert classify_failure(wrapped) is Failure.CONTENTION
    assert classify_failure(ValueError("a bug")) is Failure.UNIT
    assert classify_failure(psycopg.OperationalError("connection refused")) is Failure.OUTAGE


@given(st.sampled_from(Failure), st.booleans())
def test_only_the_units_own_failures_count_towards_poison(failure: Failure, others: bool) -> None:
    counted = counts_against_unit(failure, others_succeed=others)
    if failure is Failure.UNIT:
        assert counted
    elif failure is Failure.OUTAGE:
        assert not counted  # however long, an outage never poisons
    else:
        assert counted == others
