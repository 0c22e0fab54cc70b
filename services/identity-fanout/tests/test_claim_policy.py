"""The retry policy of a failed batch: pure."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from identity_fanout.claim import retry_delay

POLL = timedelta(seconds=5)
LEASE = timedelta(minutes=5)


def test_delay_doubles_from_the_polling_interval() -> None:
    delays = [retry_delay(n, polling_interval=POLL, lease=LEASE) for n in range(1, 8)]
    assert delays == [timedelta(seconds=s) for s in (5, 10, 20, 40, 80, 160, 300)]


@given(st.integers(min_value=-5, max_value=10_000))
def test_delay_is_never_longer_than_the_lease(attempt: int) -> None:
    delay = retry_delay(attempt, polling_interval=POLL, lease=LEASE)
    assert POLL <= delay <= LEASE
