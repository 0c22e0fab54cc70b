"""Provider verification: identity's real producers against the consumer pacts.

Every pact in ``contracts/pacts/`` whose provider is ``identity-fanout`` is replayed. For
each interaction the state handler prepares a real identity database, the message handler
runs the real producing operation and returns the outbox row exactly as the relay turns it
into a Kafka record: value bytes, key and headers. UserAccessChanged has two producers, and
both are verified: ``set_role_permissions`` fanning out inline and the worker's batch of a
queued task (both write their records with the page statement, ``page.write_page``).
AgentMembershipChanged comes from ``join_agency``/``leave_agency``.

Tests further down break a producer on purpose (a field dropped or renamed on the record the
real code wrote) and show the verification fails and names the field. The last ones run the
release flow on a broker: the pacts published, identity verified against the broker's pacts
with the results published, then ``can-i-deploy``; in ``make test`` on the in-memory broker
of ``pin_testkit.pact_broker``, in ``make pact-broker`` on the one PACT_BROKER_BASE_URL names.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pact import Verifier
from pact.types import Message
from psycopg.rows import TupleRow
from relay_support import read_request

from identity_fanout.fanout.batch import run_batch
from identity_fanout.fanout.enqueue import set_role_permissions
from identity_fanout.fanout.queue import FanoutQueue
from identity_fanout.membership import join_agency, leave_agency
from identity_fanout.outbox.records import record_from_row
from identity_fanout.outbox.rules import SLOTS
from identity_fanout.schema import OUTBOX_TABLES
from pin_contracts import LeaveReason
from pin_runtime.sql import load_queries
from pin_testkit.pact_broker import LocalPactBroker, local_pact_broker
from pin_testkit.seeding import Assignment, add_assignments, add_permissions, add_role

pytestmark = pytest.mark.integration

CONTRACTS = Path(__file__).resolve().parents[3] / "contracts"
PACT_DIR = CONTRACTS / "pacts"
PROVIDER = "identity-fanout"
PACTS = sorted(PACT_DIR.glob(f"*-{PROVIDER}.json"))

Conn = psycopg.Connection[TupleRow]
READ_LANES = OUTBOX_TABLES.compose(
    load_queries("identity_fanout", "outbox/sql/relay.sql"), "read_lanes"
)
Mutation = Callable[[dict[str, Any]], None]


def outbox_record(conn: Conn, message_id: uuid.UUID | None = None) -> Message:
    """The outbox row as the relay publishes it (its own row -> record conversion)."""
    every_slot = read_request(tuple(range(SLOTS)), 0, 10_000, 1 << 40)
    rows = conn.execute(READ_LANES, every_slot.params()).fetchall()
    records = [record_from_row(row) for row in rows]
    if message_id is not None:
        records = [
            # Header values as read from the outbox are text (the producer encodes them).
            r
            for r in records
            if dict(r.headers).get("pin-message-id") in {str(message_id), str(message_id).encode()}
        ]
    assert records, "the producer wrote no outbox row"
    record = records[-1]
    metadata: dict[str, Any] = {"key": record.key.decode()}
    for name, value in record.headers:  # the relay sends bytes; Pact metadata is text
        metadata[name] = value.decode() if isinstance(value, bytes) else value
    return Message(contents=record.value, metadata=metadata, content_type="application/json")


@dataclass
class IdentityProvider:
    """The provider under verification: the real producers on a real identity database."""

    dsn: str
    """The owner's: provider states set up and tear down with it, records are read with it."""
    producer_dsn: str = ""
    """The membership producer's login (its runtime role); empty: `dsn`."""
    operator_dsn: str = ""
    """The login `roles set-permissions` runs as (the operator's role); empty: `dsn`."""
    worker_dsn: str = ""
    """Set: UserAccessChanged comes from the worker's batch of a queued task; empty: from
    the inline fan-out of set-role-permissions."""
    mutate: Mutation | None = None
    """Breaks the produced record on purpose (the failing-verification tests)."""
    context: dict[str, Any] = field(default_factory=dict)
    states: list[tuple[str, str]] = field(default_factory=list)

    # -- provider states ------------------------------------------------------------------

    def state(self, state: str, action: str, parameters: dict[str, Any] | None) -> None:
        self.states.append((state, action))
        if action == "teardown":
            self.context.clear()
            with psycopg.connect(self.dsn) as conn:
                conn.execute(
                    "TRUNCATE identity.outbox, identity.agent_memberships, "
                    "identity.role_assignments, identity.role_permissions, "
                    "identity.access_fanout_tasks, identity.role_definitions CASCADE"
                )
            return
        setups: dict[str, Callable[[Conn], None]] = {
            "an agent accepted an invitation to an agency": self._invited_agent,
            "an agent is Active in an agency and is excluded with a deferred EffectiveAt": (
                self._active_agent
            ),
            "an agent is Active in an agency and leaves it": self._active_agent,
            "a user holds two roles and one of them changes its permissions": (
                self._user_with_two_roles
            ),
            "a user's only assignment of a role lapsed and the role changes its permissions": (
                self._user_with_lapsed_assignment
            ),
        }
        with psycopg.connect(self.dsn) as conn:
            setups[state](conn)

    def _invited_agent(self, _conn: Conn) -> None:
        self.context |= {"agent": uuid.uuid4(), "agency": uuid.uuid4(), "invitation": uuid.uuid4()}

    def _active_agent(self, conn: Conn) -> None:
        self._invited_agent(conn)
        join_agency(
            conn,
            self.context["agent"],
            self.context["agency"],
            invitation_id=self.context["invitation"],
        )

    def _user_with_two_roles(self, conn: Conn) -> None:
        company, user = uuid.uuid4(), uuid.uuid4()
        changed = add_role(conn, "project-viewer", company_id=company, permissions=["p.read"])
        add_permissions(conn, ["p.export"])
        other = add_role(conn, "company-admin", company_id=company, permissions=["c.admin"])
        add_assignments(
            conn,
            [
                Assignment(role_id=changed, user_id=user, company_id=company),
                Assignment(role_id=other, user_id=user, company_id=company),
            ],
        )
        self.context |= {"role": changed, "user": user}

    def _user_with_lapsed_assignment(self, conn: Conn) -> None:
        company, user = uuid.uuid4(), uuid.uuid4()
        role = add_role(conn, "project-viewer", company_id=company, permissions=["p.read"])
        add_permissions(conn, ["p.export"])
        lapsed = datetime.now(UTC) - timedelta(days=1)  # Active, but past its ExpiresAt
        add_assignments(
            conn, [Assignment(role_id=role, user_id=user, company_id=company, expires_at=lapsed)]
        )
        self.context |= {"role": role, "user": user}

    # -- messages -------------------------------------------------------------------------

    def message(self, name: str, metadata: dict[str, Any] | None) -> Message:
        producers: dict[str, Callable[[Conn], uuid.UUID | None]] = {
            "an AgentMembershipChanged Active: an agent joined an agency": self._join,
            "an AgentMembershipChanged Left with Reason and EffectiveAt": self._deferred_exclusion,
            "an AgentMembershipChanged Left without Reason (a producer before ADR-0072)": (
                self._self_leave
            ),
            "a UserAccessChanged after a role's permissions changed: the user's full snapshot": (
                self._permissions_changed
            ),
            "a UserAccessChanged with an empty snapshot: the user holds no active assignment": (
                self._permissions_changed
            ),
        }
        produce = producers[name]
        login = self.operator_dsn if produce == self._permissions_changed else self.producer_dsn
        with psycopg.connect(login or self.dsn) as conn:
            message_id = produce(conn)
            conn.commit()
        with psycopg.connect(self.dsn) as conn:
            record = outbox_record(conn, message_id)
        if self.mutate is not None:
            value = json.loads(record["contents"])
            self.mutate(value)
            record = Message(
                contents=json.dumps(value).encode(),
                metadata=record["metadata"],
                content_type=record["content_type"],
            )
        return record

    def _join(self, conn: Conn) -> uuid.UUID:
        c = self.context
        return join_agency(conn, c["agent"], c["agency"], invitation_id=c["invitation"]).message_id

    def _deferred_exclusion(self, conn: Conn) -> uuid.UUID:
        c = self.context
        return leave_agency(
            conn,
            c["agent"],
            c["agency"],
            reason=LeaveReason.EXCLUDED_BY_AGENCY,
            effective_at=datetime.now(UTC) + timedelta(days=30),
        ).message_id

    def _self_leave(self, conn: Conn) -> uuid.UUID:
        c = self.context
        return leave_agency(conn, c["agent"], c["agency"], reason=LeaveReason.SELF_LEAVE).message_id

    def _permissions_changed(self, conn: Conn) -> None:
        # One user holds the role: the fan-out writes exactly one outbox row, the record.
        if not self.worker_dsn:
            change = set_role_permissions(
                conn, self.context["role"], ["p.read", "p.export"], inline_threshold=1000
            )
            assert (change.mode, change.users) == ("inline", 1)
            return
        change = set_role_permissions(
            conn, self.context["role"], ["p.read", "p.export"], inline_threshold=0
        )
        assert change.mode == "queued"
        conn.commit()
        with psycopg.connect(self.worker_dsn) as worker:
            queue = FanoutQueue(lease=timedelta(minutes=1), max_attempts=3)
            task = queue.claim(worker)
            assert task is not None
            batch = run_batch(worker, queue, task, batch_size=10, correlation_id="pact")
            assert (batch.users, batch.unit_completed) == (1, True)


def close_servers(verifier: Verifier) -> None:
    """Close the listening sockets of the verifier's local message and state servers.

    pact-python 4.2 shuts them down without ``server_close()``; the leaked sockets would
    surface as ResourceWarnings, which this suite treats as errors.
    """
    for helper in (verifier._message_producer, verifier._state_handler):
        server = getattr(helper, "_server", None)
        if server is not None:
            server.server_close()


def run(verifier: Verifier) -> Verifier:
    try:
        return verifier.verify()
    finally:
        close_servers(verifier)


def new_verifier(provider: IdentityProvider) -> Verifier:
    return (
        Verifier(PROVIDER)
        .message_handler(provider.message)
        .state_handler(provider.state, teardown=True)
        .set_coloured_output(enabled=False)
    )


def provider_verifier(provider: IdentityProvider, pacts: list[Path]) -> Verifier:
    verifier = new_verifier(provider)
    for pact in pacts:
        verifier.add_source(pact)
    return verifier


def verify(provider: IdentityProvider) -> Verifier:
    return run(provider_verifier(provider, PACTS))


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    # The verifier reports anonymous usage statistics unless told not to; tests stay offline.
    monkeypatch.setenv("PACT_DO_NOT_TRACK", "true")


@pytest.fixture(params=["inline", "worker batch"])
def provider(
    request: pytest.FixtureRequest,
    identity_dsn: str,
    producer_dsn: str,
    operator_dsn: str,
    worker_dsn: str,
) -> IdentityProvider:
    """The producers as they run in production: each logged in as its runtime role; the
    UserAccessChanged producer inline (set-role-permissions) or the worker's batch."""
    return IdentityProvider(
        dsn=identity_dsn,
        producer_dsn=producer_dsn,
        operator_dsn=operator_dsn,
        worker_dsn=worker_dsn if request.param == "worker batch" else "",
    )


def test_the_pacts_are_there() -> None:
    names = {p.name for p in PACTS}
    assert {
        "rewards-membership-identity-fanout.json",
        "pin-access-cache-identity-fanout.json",
    } <= names


def test_real_producers_satisfy_every_consumer_pact(provider: IdentityProvider) -> None:
    verifier = verify(provider)
    results = verifier.results
    assert results["errors"] == []
    described = {r["description"] for r in results["interactionResults"]}
    expected = {
        i["description"] for pact in PACTS for i in json.loads(pact.read_text())["interactions"]
    }
    assert described == expected
    assert all(r["result"] == "OK" for r in results["interactionResults"]), results
    # Every interaction ran its provider state, set up and torn down.
    assert {action for _, action in provider.states} == {"setup", "teardown"}


def _drop_agent_user_id(value: dict[str, Any]) -> None:
    value["Payload"].pop("AgentUserId", None)


def _rename_status(value: dict[str, Any]) -> None:
    payload = value["Payload"]
    if "Status" in payload:
        payload["MembershipStatus"] = payload.pop("Status")


def _rename_role_code(value: dict[str, Any]) -> None:
    for assignment in value["Payload"].get("ActiveAssignments", []):
        assignment["Code"] = assignment.pop("RoleCode")


@pytest.mark.parametrize(
    ("mutation", "field_name"),
    [
        (_drop_agent_user_id, "AgentUserId"),
        (_rename_status, "Status"),
        (_rename_role_code, "RoleCode"),
    ],
)
def test_a_dropped_or_renamed_field_fails_verification(
    identity_dsn: str, mutation: Mutation, field_name: str
) -> None:
    verifier = provider_verifier(IdentityProvider(dsn=identity_dsn, mutate=mutation), PACTS)
    with pytest.raises(RuntimeError, match="Failed to execute verifier"):
        run(verifier)
    failed = [r for r in verifier.results["interactionResults"] if r["result"] != "OK"]
    assert failed
    mismatches = [m for e in verifier.results["errors"] for m in e["mismatch"]["mismatches"]]
    assert mismatches
    assert all(field_name in m["mismatch"] for m in mismatches), mismatches


def test_failure_report_names_the_missing_field(identity_dsn: str) -> None:
    provider = IdentityProvider(dsn=identity_dsn, mutate=_rename_status)
    verifier = provider_verifier(provider, [PACT_DIR / f"rewards-membership-{PROVIDER}.json"])
    with pytest.raises(RuntimeError):
        run(verifier)
    mismatches = [
        m for error in verifier.results["errors"] for m in error["mismatch"]["mismatches"]
    ]
    assert len(verifier.results["errors"]) == 3  # every membership interaction reads Status
    assert all(m["type"] == "BodyMismatch" for m in mismatches)
    assert all("missing the following keys: Status" in m["mismatch"] for m in mismatches)
    assert "has a matching body (FAILED)" in verifier.output(strip_ansi=True)


# -- the release flow on a broker ---------------------------------------------------------


@dataclass(frozen=True)
class Broker:
    """Where verification results go, as the PACT_BROKER_* variables name it."""

    url: str
    version: str
    """The provider version the results are published for (pact-broker-env.sh's)."""
    branch: str
    token: str | None = None
    username: str | None = None
    password: str | None = None


PRODUCERS = ("inline", "worker batch")


def broker_verifier(provider: IdentityProvider, broker: Broker) -> Verifier:
    verifier = new_verifier(provider)
    # The verifier takes a token or a username and password, never both (as the broker does).
    selected = (
        verifier.broker_source(broker.url, token=broker.token, selector=True, use_env=False)
        if broker.token
        else verifier.broker_source(
            broker.url,
            username=broker.username,
            password=broker.password,
            selector=True,
            use_env=False,
        )
    )
    # The consumers' main branch, what is deployed or released, and the same branch as ours.
    built = (
        selected.consumer_version(main_branch=True)
        .consumer_version(deployed_or_released=True)
        .consumer_version(matching_branch=True)
        .provider_branch(broker.branch)
        .build()
    )
    return built.set_publish_options(version=broker.version, branch=broker.branch)


def verify_on_broker(
    make: Callable[[str], IdentityProvider], broker: Broker
) -> dict[str, Verifier]:
    """Verify both UserAccessChanged producers against the broker's pacts, publishing results.

    The broker keeps the latest result of a provider version, so the inline producer's
    result goes first and the worker batch's only if the inline one passed: a failure of
    either is then the result the broker answers can-i-deploy with, never hidden by a later
    success of the other.
    """
    verified: dict[str, Verifier] = {}
    for producer in PRODUCERS:
        verifier = broker_verifier(make(producer), broker)
        verified[producer] = verifier
        try:
            run(verifier)
        except RuntimeError:
            break
    return verified


def env_broker() -> Broker:
    return Broker(
        url=os.environ["PACT_BROKER_BASE_URL"],
        version=os.environ["PACT_VERSION"],
        branch=os.environ["PACT_BRANCH"],
        token=os.environ.get("PACT_BROKER_TOKEN") or None,
        username=os.environ.get("PACT_BROKER_USERNAME") or None,
        password=os.environ.get("PACT_BROKER_PASSWORD") or None,
    )


def broker_script(
    script: str, local: LocalPactBroker, *args: str
) -> subprocess.CompletedProcess[str]:
    env = os.environ | {
        "PACT_BROKER_BASE_URL": local.url,
        "PACT_BROKER_TOKEN": local.token or "",
        "PACT_VERSION": "1.0.0-test",
        "PACT_BRANCH": "main",
    }
    env.pop("PACT_BROKER_USERNAME", None)
    return subprocess.run(
        [str(CONTRACTS / script), *args], env=env, capture_output=True, text=True, check=False
    )


@pytest.fixture
def local_broker() -> Iterator[LocalPactBroker]:
    """An in-memory broker (bearer auth on) holding this repository's pacts at 1.0.0-test,
    published by the real pact-publish.sh."""
    with local_pact_broker(token="release-token") as broker:
        published = broker_script("pact-publish.sh", broker)
        assert published.returncode == 0, published.stderr
        yield broker


@pytest.fixture
def make_provider(
    identity_dsn: str, producer_dsn: str, operator_dsn: str, worker_dsn: str
) -> Callable[..., IdentityProvider]:
    def make(producer: str, mutate: Mutation | None = None) -> IdentityProvider:
        return IdentityProvider(
            dsn=identity_dsn,
            producer_dsn=producer_dsn,
            operator_dsn=operator_dsn,
            worker_dsn=worker_dsn if producer == "worker batch" else "",
            mutate=mutate,
        )

    return make


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> Broker:
    """``make pact-broker`` (PIN_PACT_BROKER_RELEASE=true): the broker PACT_BROKER_BASE_URL
    names; otherwise the in-memory one, the pacts published to it."""
    if os.environ.get("PIN_PACT_BROKER_RELEASE") == "true":
        return env_broker()
    local: LocalPactBroker = request.getfixturevalue("local_broker")
    return Broker(url=local.url, version="1.0.0-test", branch="main", token=local.token)


def test_release_on_the_broker(
    make_provider: Callable[..., IdentityProvider], broker: Broker
) -> None:
    verified = verify_on_broker(make_provider, broker)
    assert set(verified) == set(PRODUCERS)
    for verifier in verified.values():
        results = verifier.results
        assert results["errors"] == [], verifier.output(strip_ansi=True)
        assert {r["result"] for r in results["interactionResults"]} == {"OK"}


def test_the_broker_records_the_results_and_can_i_deploy_says_yes(
    make_provider: Callable[..., IdentityProvider], local_broker: LocalPactBroker
) -> None:
    broker = Broker(
        url=local_broker.url, version="1.0.0-test", branch="main", token="release-token"
    )
    verify_on_broker(make_provider, broker)
    state = local_broker.state
    consumers = {json.loads(p.read_text())["consumer"]["name"] for p in PACTS}
    assert {p.consumer for p in state.pacts} == consumers
    # pact-publish.sh names the consumers' version and branch (what the selectors match on).
    assert {(p.consumer_version, p.branch) for p in state.pacts} == {("1.0.0-test", "main")}
    # One result per pact and producer, each a success of this provider version.
    assert sorted((r.consumer, r.success) for r in state.results) == sorted(
        (c, True) for c in consumers for _ in PRODUCERS
    )
    assert {r.provider_version for r in state.results} == {"1.0.0-test"}
    assert all(r.body["verifiedBy"]["implementation"] for r in state.results)
    assert (PROVIDER, "main", "1.0.0-test") in state.branch_versions
    answer = broker_script("pact-can-i-deploy.sh", local_broker)
    assert answer.returncode == 0, answer.stderr
    for name in consumers | {PROVIDER}:
        assert f"{name} 1.0.0-test -> production: yes" in answer.stdout


def test_a_failed_verification_is_published_and_can_i_deploy_says_no(
    make_provider: Callable[..., IdentityProvider], local_broker: LocalPactBroker
) -> None:
    broker = Broker(
        url=local_broker.url, version="1.0.0-test", branch="main", token="release-token"
    )
    verified = verify_on_broker(lambda producer: make_provider(producer, _rename_status), broker)
    # The inline producer failed, so the worker batch did not run to publish over it.
    assert list(verified) == ["inline"]
    membership = [r for r in local_broker.state.results if r.consumer == "rewards-membership"]
    assert [r.success for r in membership] == [False]
    assert membership[0].body["testResults"], "the failure is published with its mismatches"
    answer = broker_script("pact-can-i-deploy.sh", local_broker, PROVIDER, "rewards-membership")
    assert answer.returncode == 1
    assert f"{PROVIDER} 1.0.0-test -> production: NO" in answer.stderr
    assert "rewards-membership 1.0.0-test -> identity-fanout 1.0.0-test: verification failed" in (
        answer.stderr
    )


def test_can_i_deploy_says_no_before_the_provider_verified(local_broker: LocalPactBroker) -> None:
    answer = broker_script("pact-can-i-deploy.sh", local_broker, "rewards-membership")
    assert answer.returncode == 1
    assert "missing verification" in answer.stderr


def test_can_i_deploy_stops_when_the_broker_refuses_or_a_setting_is_wrong(
    local_broker: LocalPactBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = broker_script(
        "pact-can-i-deploy.sh", replace(local_broker, token="wrong"), "rewards-membership"
    )
    assert refused.returncode == 2
    assert "the broker did not answer for rewards-membership" in refused.stderr
    monkeypatch.setenv("PACT_CAN_I_DEPLOY_WAIT_S", "soon")
    bad = broker_script("pact-can-i-deploy.sh", local_broker)
    assert bad.returncode == 2
    assert "PACT_CAN_I_DEPLOY_WAIT_S must be whole seconds, got 'soon'" in bad.stderr


def test_the_broker_scripts_do_nothing_without_a_broker() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PACT_BROKER")}
    for script in ("pact-publish.sh", "pact-can-i-deploy.sh"):
        done = subprocess.run(
            [str(CONTRACTS / script)], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0
        assert "PACT_BROKER_BASE_URL is not set" in done.stderr
