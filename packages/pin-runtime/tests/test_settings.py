from __future__ import annotations

import datetime
import enum
from typing import Annotated, Literal

import msgspec
import pytest

from pin_runtime.clients import ClientSettings, Port, ServiceSettings
from pin_runtime.errors import PinRuntimeError, SettingsError
from pin_runtime.postgres import PINNED_SETTINGS, SessionLimitError, SessionLimits
from pin_runtime.settings import (
    Secret,
    load_settings,
    parse_duration,
    redact,
    redact_dsn,
    secrets_forgotten_after,
    settings_for_log,
    settings_or_exit,
    unknown_variables,
)

P = "IDENTITY_FANOUT_"


class Mode(enum.Enum):
    FAST = "fast"
    SAFE = "safe"


class Example(msgspec.Struct, frozen=True):
    database_dsn: Secret
    polling_interval: datetime.timedelta = datetime.timedelta(seconds=5)
    batch_size: Annotated[int, msgspec.Meta(ge=1)] = 500
    ratio: float = 0.5
    enabled: bool = False
    log_level: Literal["DEBUG", "INFO", "WARNING"] = "INFO"
    mode: Mode = Mode.SAFE
    max_attempts: int | None = None
    topics: tuple[str, ...] = ()
    name: str = "fanout"


def env(**values: str) -> dict[str, str]:
    return {"IDENTITY_FANOUT_DATABASE_DSN": "postgresql://u:pw@h/db"} | {
        P + k.upper(): v for k, v in values.items()
    }


def test_defaults_when_only_required_set() -> None:
    s = load_settings(Example, P, env())
    assert s.batch_size == 500
    assert s.polling_interval == datetime.timedelta(seconds=5)
    assert s.database_dsn.reveal() == "postgresql://u:pw@h/db"
    assert s.max_attempts is None


def test_converts_every_supported_type() -> None:
    s = load_settings(
        Example,
        P,
        env(
            polling_interval="250ms",
            batch_size="42",
            ratio="1.5",
            enabled="true",
            log_level="DEBUG",
            mode="fast",
            max_attempts="7",
            topics="a, b",
            name="",
        ),
    )
    assert s.polling_interval == datetime.timedelta(milliseconds=250)
    assert (s.batch_size, s.ratio, s.enabled) == (42, 1.5, True)
    assert (s.log_level, s.mode, s.max_attempts) == ("DEBUG", Mode.FAST, 7)
    assert s.topics == ("a", "b")
    assert s.name == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5s", datetime.timedelta(seconds=5)),
        ("250ms", datetime.timedelta(milliseconds=250)),
        ("5m", datetime.timedelta(minutes=5)),
        ("1h", datetime.timedelta(hours=1)),
        ("1d", datetime.timedelta(days=1)),
        ("1m30s", datetime.timedelta(seconds=90)),
        ("1.5s", datetime.timedelta(seconds=1.5)),
        ("30", datetime.timedelta(seconds=30)),
        (" 2S ", datetime.timedelta(seconds=2)),
    ],
)
def test_parse_duration(text: str, expected: datetime.timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "s", "5x", "5 s 3", "-1s", "1s5", "ms"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_iso8601_duration_still_accepted() -> None:
    s = load_settings(Example, P, env(polling_interval="PT2M"))
    assert s.polling_interval == datetime.timedelta(minutes=2)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("batch_size", "abc", "expected an integer >= 1, got 'abc'"),
        ("batch_size", "0", "expected an integer >= 1, got '0'"),
        ("ratio", "x", "expected a number, got 'x'"),
        ("enabled", "maybe", "expected a boolean (true/false/1/0), got 'maybe'"),
        ("log_level", "TRACE", "expected one of 'DEBUG', 'INFO', 'WARNING', got 'TRACE'"),
        ("mode", "turbo", "expected one of 'fast', 'safe', got 'turbo'"),
        ("polling_interval", "soon", "got 'soon'"),
        ("polling_interval", "-5", "expected a duration like 250ms"),
        ("max_attempts", "many", "expected an integer (or empty), got 'many'"),
    ],
)
def test_bad_value_names_the_variable(field: str, value: str, reason: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(Example, P, env(**{field: value}))
    assert info.value.variable == P + field.upper()
    assert reason in info.value.reason
    assert isinstance(info.value, PinRuntimeError)


@pytest.mark.parametrize(
    "value", ["postgresql://u:hunter22@db/x", "host=db password=hunter22", "password hunter22"]
)
def test_a_refusal_never_quotes_a_value_that_holds_a_password(value: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(Example, P, env(enabled=value))
    assert info.value.variable == P + "ENABLED"
    assert "hunter22" not in info.value.reason
    assert "looks like it holds a password" in info.value.reason


class Checked(msgspec.Struct, frozen=True, kw_only=True):
    endpoint: str = ""

    def __post_init__(self) -> None:
        if "/" in self.endpoint:
            raise ValueError(f"ENDPOINT: expected host:port, got {self.endpoint!r}")


def test_a_structs_own_check_never_quotes_a_password_it_refused() -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(Checked, P, {P + "ENDPOINT": "postgresql://u:hunter22@[db:5432/x"})
    assert info.value.variable == P + "ENDPOINT"
    assert "hunter22" not in info.value.reason
    assert "expected host:port" in info.value.reason


class SecretLast(msgspec.Struct, frozen=True):
    batch_size: int
    database_dsn: Secret


def test_the_environments_secrets_are_known_before_any_value_is_judged() -> None:
    # BATCH_SIZE is judged before DATABASE_DSN is converted, and its refusal quotes the
    # DSN's password: `redact` must already know it.
    environ = {P + "BATCH_SIZE": "Sw0rdfish9", P + "DATABASE_DSN": "postgresql://u:Sw0rdfish9@db/x"}
    with secrets_forgotten_after():
        with pytest.raises(SettingsError) as info:
            load_settings(SecretLast, P, environ)
        assert info.value.variable == P + "BATCH_SIZE"
        assert redact(info.value.reason).endswith("got '***'")


def test_missing_required() -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(Example, P, {})
    assert info.value.variable == "IDENTITY_FANOUT_DATABASE_DSN"
    assert info.value.reason == "required but not set"


def test_empty_optional_reads_as_none() -> None:
    assert load_settings(Example, P, env(max_attempts="")).max_attempts is None


def test_post_init_checks_become_settings_errors() -> None:
    class Window(msgspec.Struct):
        low: int = 1
        high: int = 2

        def __post_init__(self) -> None:
            if self.low > self.high:
                raise ValueError("low must be <= high")

    with pytest.raises(SettingsError, match="low must be <= high") as info:
        load_settings(Window, "W_", {"W_LOW": "5"})
    assert info.value.variable == "W_*"


def test_post_init_check_naming_its_variable_is_reported_under_it() -> None:
    class Interval(msgspec.Struct):
        seconds: float = 1.0

        def __post_init__(self) -> None:
            if self.seconds <= 0:
                raise ValueError("I_SECONDS: must be positive")

    with pytest.raises(SettingsError) as info:
        load_settings(Interval, "I_", {"I_SECONDS": "-1"})
    assert (info.value.variable, info.value.reason) == ("I_SECONDS", "must be positive")


def test_json_for_structured_fields() -> None:
    class Limits(msgspec.Struct):
        per_topic: dict[str, int] = {}

    s = load_settings(Limits, "L_", {"L_PER_TOPIC": '{"a": "3"}'})
    assert s.per_topic == {"a": 3}


def test_prefix_is_validated() -> None:
    with pytest.raises(ValueError, match="prefix"):
        load_settings(Example, "identity", {})


def test_settings_or_exit_prints_one_line_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        settings_or_exit(Example, P, env(batch_size="abc"))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        "config error: IDENTITY_FANOUT_BATCH_SIZE: expected an integer >= 1, got 'abc'\n"
    )


def test_settings_or_exit_returns_settings() -> None:
    assert settings_or_exit(Example, P, env()).batch_size == 500


def test_unknown_variables() -> None:
    environ = env(batch_siz="10") | {"OTHER": "1"}
    assert unknown_variables(Example, P, environ) == ["IDENTITY_FANOUT_BATCH_SIZ"]


def test_secret_never_shows_itself() -> None:
    s = load_settings(Example, P, env())
    assert "pw" not in repr(s)
    assert str(s.database_dsn) == "***"
    assert Secret("a") == Secret("a")
    assert hash(Secret("a")) == hash(Secret("a"))
    assert Secret("a") != "a"


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://pin:s3cr3t@db:5432/pin", "postgresql://pin:***@db:5432/pin"),
        ("postgresql://pin@db/pin", "postgresql://pin@db/pin"),
        ("postgresql://pin:p@ss@db/pin", "postgresql://pin:***@db/pin"),
        (
            "postgresql://db/pin?user=a&password=x&sslmode=require",
            "postgresql://db/pin?user=a&password=***&sslmode=require",
        ),
        ("host=db user=pin password=s3cr3t dbname=pin", "host=db user=pin password=*** dbname=pin"),
        ("host=db password = 'a b\\' c' dbname=pin", "host=db password = *** dbname=pin"),
    ],
)
def test_redact_dsn(dsn: str, expected: str) -> None:
    assert redact_dsn(dsn) == expected
    assert redact_dsn(Secret(dsn)) == expected


def test_settings_for_log_masks_secrets_and_dsns() -> None:
    class WithDsn(msgspec.Struct):
        token: Secret = Secret("t0k3n")
        dsn: str = "postgresql://u:pw@h/db"
        interval: datetime.timedelta = datetime.timedelta(seconds=5)

    assert settings_for_log(WithDsn()) == {
        "token": "***",
        "dsn": "postgresql://u:***@h/db",
        "interval": "PT5S",
    }


def test_client_settings_give_every_session_its_limits() -> None:

    settings = load_settings(
        ClientSettings,
        "SVC_",
        {"SVC_DB_LOCK_TIMEOUT": "2s", "SVC_DB_STATEMENT_TIMEOUT": "0s"},
    )
    limits = settings.database_session()
    assert (limits.lock_timeout, limits.statement_timeout) == (2.0, 0.0)
    assert "-c lock_timeout=2000" in limits.options()
    assert "-c idle_in_transaction_session_timeout=60000" in limits.options()


def test_client_settings_name_the_variable_of_a_bad_limit() -> None:

    with pytest.raises(SettingsError) as raised:
        load_settings(ClientSettings, "SVC_", {"SVC_DB_KEEPALIVES_IDLE": "0s"})
    assert raised.value.variable == "SVC_DB_KEEPALIVES_IDLE"


def test_a_session_limit_out_of_range_is_refused_with_its_variable() -> None:

    with pytest.raises(SettingsError) as raised:
        load_settings(ClientSettings, "SVC_", {"SVC_DB_KEEPALIVES_INTERVAL": "500ms"})
    assert (raised.value.variable, raised.value.reason) == (
        "SVC_DB_KEEPALIVES_INTERVAL",
        "must be from 1s to 32767s (the kernel's limit)",
    )
    with pytest.raises(SessionLimitError) as direct:
        SessionLimits(keepalives_count=0)
    assert (direct.value.limit, str(direct.value)) == (
        "keepalives_count",
        "keepalives_count: must be from 1 to 127 (the kernel's limit)",
    )


class ServiceExample(ServiceSettings, frozen=True, kw_only=True):
    metrics_port: Port = 9100


def test_service_settings_name_the_role_prefix_variable_of_the_service() -> None:
    env = {f"{P}DB_ROLE_PREFIX": "Prod-"}
    with pytest.raises(SettingsError) as caught:
        load_settings(ServiceExample, P, env)
    assert caught.value.variable == f"{P}DB_ROLE_PREFIX"
    settings = load_settings(ServiceExample, P, {f"{P}DB_ROLE_PREFIX": "staging_"})
    assert (settings.db_role_prefix, settings.metrics_port, settings.log_level) == (
        "staging_",
        9100,
        "INFO",
    )


@pytest.mark.parametrize(
    "value",
    ["99999999999d", "99999999999999999999", "24d20h31m23.648s", "25d", "P1000000000D"],
)
def test_a_duration_past_what_postgresql_and_librdkafka_take_is_refused(value: str) -> None:
    # Python's own timedelta overflowed on the first two (a traceback, exit 1); the rest
    # were accepted and failed later, in the server or in the client.
    with pytest.raises(SettingsError) as raised:
        load_settings(Example, P, env(polling_interval=value))
    assert raised.value.variable == f"{P}POLLING_INTERVAL"
    assert "from 0 to 24d20h31m23.647s" in raised.value.reason
    longest = load_settings(Example, P, env(polling_interval="24d20h31m23.647s"))
    assert longest.polling_interval == datetime.timedelta(milliseconds=2**31 - 1)


@pytest.mark.parametrize("variable", ["DB_STATEMENT_TIMEOUT", "DB_IDLE_IN_TRANSACTION_TIMEOUT"])
def test_a_session_timeout_the_server_refuses_is_a_config_error(variable: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(ClientSettings, "SVC_", {f"SVC_{variable}": "30d"})
    assert raised.value.variable == f"SVC_{variable}"


@pytest.mark.parametrize(
    ("dsn", "reason"),
    [
        ("host=127.0.0.1 port=notaport", "port must be a number from 1 to 65535"),
        ("host=127.0.0.1 sslmodee=require", "unknown connection option 'sslmodee'"),
        ("postgresql://u:hunter2222@[127.0.0.1:5432/db", "not a valid postgresql:// URL"),
        ("host='127.0.0.1 password=hunter2222", "a quoted value is not closed"),
        ("dbname=x password hunter2222", "a word without '='"),
        ("postgresql://u:pw@h/db?sslmode=always", "sslmode must be one of"),
        ("host=a,b port=1,2,3", "3 ports for 2 hosts"),
        ("host=h connect_timeout=soon", "connect_timeout must be a whole number"),
    ],
)
def test_a_malformed_dsn_is_refused_at_start_without_quoting_it(dsn: str, reason: str) -> None:
    # Each was taken, and every connect then failed as if the database were down.
    with pytest.raises(SettingsError) as raised:
        load_settings(ServiceExample, P, {f"{P}DATABASE_DSN": dsn})
    assert raised.value.variable == f"{P}DATABASE_DSN"
    assert reason in raised.value.reason
    assert "hunter2222" not in raised.value.reason


@pytest.mark.parametrize(
    "dsn",
    [
        "dbname=pin_identity",
        "host=/var/run/postgresql dbname=x",
        "postgresql://u:pw@db1:5432,db2:5433/x?target_session_attrs=read-write",
        "host=a,b port=5432 sslmode=verify-full connect_timeout=5",
    ],
)
def test_a_well_formed_dsn_is_taken(dsn: str) -> None:
    settings = load_settings(ServiceExample, P, {f"{P}DATABASE_DSN": dsn})
    assert settings.database_dsn is not None
    assert settings.database_dsn.reveal() == dsn


@pytest.mark.parametrize(
    "bootstrap", ["kafka:9092,", "a b:9092", "kafka:0", "kafka:99999", "kafka:", "::::"]
)
def test_a_malformed_bootstrap_list_is_refused(bootstrap: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(ClientSettings, "SVC_", {"SVC_KAFKA_BOOTSTRAP": bootstrap + ",x y"})
    assert raised.value.variable == "SVC_KAFKA_BOOTSTRAP"


def test_pinned_session_settings_are_in_every_sessions_options() -> None:
    options = SessionLimits().options()
    for name, value in PINNED_SETTINGS.items():
        assert f"-c {name}={value}" in options
