"""When the relay pauses for a refusal of the cluster and when it resumes (pure)."""

from __future__ import annotations

from confluent_kafka import KafkaError

from identity_fanout.outbox.rules import Pause, next_pause, refusal_of
from pin_runtime.delivery import DeliveryFailure, classify

DENIED = classify(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
NO_TOPIC = classify(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
NO_TOPIC_CACHED = classify(KafkaError(KafkaError._UNKNOWN_TOPIC))
NOT_AUTHENTICATED = classify(KafkaError(KafkaError._AUTHENTICATION))
TIMED_OUT = classify(KafkaError(KafkaError._MSG_TIMED_OUT))
TOO_LARGE = classify(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
ACCESS = "pin.identity.access.v1"
MEMBERSHIP = "pin.identity.agent-membership-changed.v1"


def pause(failure: DeliveryFailure, topic: str = ACCESS, since: float = 1.0) -> Pause:
    return Pause(failure, topic, outbox_id=7, since=since)


def test_the_rows_own_refusal_of_the_cluster_decides() -> None:
    assert refusal_of(DENIED, None) == DENIED
    assert refusal_of(NO_TOPIC, NOT_AUTHENTICATED) == NO_TOPIC


def test_a_timeout_while_the_client_is_refused_its_credentials_is_that_refusal() -> None:
    assert refusal_of(TIMED_OUT, NOT_AUTHENTICATED) == NOT_AUTHENTICATED
    assert refusal_of(None, NOT_AUTHENTICATED) == NOT_AUTHENTICATED


def test_an_outage_or_a_record_refusal_is_no_pause() -> None:
    assert refusal_of(TIMED_OUT, None) is None
    assert refusal_of(None, None) is None
    assert refusal_of(TOO_LARGE, NOT_AUTHENTICATED) is None  # the record's own refusal


def test_a_refused_round_pauses_and_the_same_refusal_keeps_its_start() -> None:
    first = next_pause(None, pause(DENIED, since=1.0), acknowledged=set(), idle=False)
    assert first == pause(DENIED, since=1.0)
    again = next_pause(first, pause(DENIED, since=9.0), acknowledged=set(), idle=False)
    assert again is first
    changed = next_pause(first, pause(NO_TOPIC, since=9.0), acknowledged=set(), idle=False)
    assert changed == pause(NO_TOPIC, since=9.0)  # a new refusal: said again
    # The client's own code for the same missing topic (from cached metadata) is no new one.
    cached = next_pause(changed, pause(NO_TOPIC_CACHED, since=12.0), acknowledged=set(), idle=False)
    assert cached is changed


def test_a_topics_refusal_ends_only_with_an_ack_of_that_topic() -> None:
    paused = pause(DENIED)
    assert next_pause(paused, None, acknowledged={MEMBERSHIP}, idle=False) is paused
    assert next_pause(paused, None, acknowledged=set(), idle=False) is paused  # acks pending
    assert next_pause(paused, None, acknowledged={ACCESS, MEMBERSHIP}, idle=False) is None


def test_a_refusal_of_the_client_ends_with_any_ack() -> None:
    paused = pause(NOT_AUTHENTICATED)
    assert next_pause(paused, None, acknowledged={MEMBERSHIP}, idle=False) is None


def test_nothing_left_to_publish_ends_a_pause() -> None:
    assert next_pause(pause(DENIED), None, acknowledged=set(), idle=True) is None


def test_a_refusal_in_the_same_round_as_acks_keeps_the_pause() -> None:
    paused = pause(DENIED)
    assert next_pause(paused, pause(DENIED, since=5.0), acknowledged={ACCESS}, idle=False) is (
        paused
    )


def test_an_unpaused_relay_stays_unpaused_without_a_refusal() -> None:
    assert next_pause(None, None, acknowledged={ACCESS}, idle=False) is None
    assert next_pause(None, None, acknowledged=set(), idle=True) is None
