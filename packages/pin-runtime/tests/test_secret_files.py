"""Passwords read from files (`<PREFIX>DATABASE_PASSWORD_FILE`, `<PREFIX>KAFKA_SASL_PASSWORD_FILE`):
the file's form, the settings' checks, and how a Kafka client's config carries its file."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from pin_runtime.clients import ServiceSettings
from pin_runtime.errors import SettingsError
from pin_runtime.kafka import (
    KafkaClientSettings,
    LoginRenewal,
    create_producer,
    renewed_sasl_password,
)
from pin_runtime.kafka_security import kafka_or_exit
from pin_runtime.kafka_settings import SASL_PASSWORD_FILE, librdkafka_config
from pin_runtime.secret_files import SecretFileError, read_secret_file, unreadable_secret_file
from pin_runtime.settings import load_settings, redact, secrets_forgotten_after


class _Svc(KafkaClientSettings, frozen=True, kw_only=True):
    pass


class _Service(ServiceSettings, frozen=True, kw_only=True):
    pass


def scram(password_file: Path) -> dict[str, str]:
    return {
        "SVC_KAFKA_BOOTSTRAP": "127.0.0.1:9",
        "SVC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "SVC_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "SVC_KAFKA_SASL_USERNAME": "svc",
        "SVC_KAFKA_SASL_PASSWORD_FILE": str(password_file),
    }


def test_a_secret_file_is_its_text_without_one_trailing_line_break_whatever_its_mode(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret with spaces \n")
    secret.chmod(0o640)
    assert read_secret_file(str(secret)) == "s3cret with spaces "
    secret.write_text("crlf\r\n")
    assert read_secret_file(str(secret)) == "crlf"
    secret.write_text("two\n\n")
    assert read_secret_file(str(secret)) == "two\n"


def test_a_secret_file_that_gives_no_password_says_why_without_its_content(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "gone"
    assert unreadable_secret_file(str(missing)) == (
        f"cannot read {str(missing)!r}: No such file or directory"
    )
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert unreadable_secret_file(str(empty)) == f"{str(empty)!r} is empty"
    with pytest.raises(SecretFileError):
        read_secret_file(str(tmp_path))  # a directory
    assert unreadable_secret_file(str(tmp_path)) is not None


def test_a_sasl_password_file_reaches_the_client_as_its_password_and_its_file(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "kafka"
    secret.write_text("first\n")
    settings = load_settings(_Svc, "SVC_", scram(secret))
    config = settings.kafka_security()
    assert config["sasl.password"] == "first"
    assert config[SASL_PASSWORD_FILE] == str(secret)
    # librdkafka refuses a property it does not know: pin_runtime's clients take it out.
    assert SASL_PASSWORD_FILE not in librdkafka_config(config)
    create_producer("127.0.0.1:9", client_id="t", extra=config).flush(0)

    # The same password in the file: nothing to rebuild. Another one: the config with it.
    assert renewed_sasl_password(config) is None
    secret.write_text("second\n")
    renewed = renewed_sasl_password(config)
    assert renewed is not None
    assert renewed["sasl.password"] == "second"
    assert renewed[SASL_PASSWORD_FILE] == str(secret)
    assert renewed_sasl_password(renewed) is None
    secret.unlink()
    with pytest.raises(SecretFileError):
        renewed_sasl_password(config)  # the old password goes on being tried
    # A config with its password inline has no file to read again.
    assert renewed_sasl_password({"sasl.password": "x"}) is None


@pytest.mark.parametrize(
    ("extra", "variable", "reason"),
    [
        (
            {"SVC_KAFKA_SASL_PASSWORD": "inline"},
            "SVC_KAFKA_SASL_PASSWORD_FILE",
            "set with SVC_KAFKA_SASL_PASSWORD; set one of them",
        ),
        (
            {"SVC_KAFKA_SASL_PASSWORD_FILE": ""},
            "SVC_KAFKA_SASL_PASSWORD",
            "required with SASL_SSL (or SVC_KAFKA_SASL_PASSWORD_FILE)",
        ),
    ],
)
def test_one_sasl_password_source_is_required(
    extra: dict[str, str], variable: str, reason: str, tmp_path: Path
) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(_Svc, "SVC_", {**scram(tmp_path / "kafka"), **extra})
    assert (caught.value.variable, caught.value.reason) == (variable, reason)
    assert "inline" not in caught.value.reason


def test_a_command_exits_2_naming_a_sasl_password_file_that_gives_no_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Loading the settings reads no file: they are rendered and checked where it is absent.
    settings = load_settings(_Svc, "SVC_", scram(tmp_path / "kafka"))
    with pytest.raises(SystemExit) as exited:
        kafka_or_exit(settings, "SVC_", command="consume", timeout=1)
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"config error: SVC_KAFKA_SASL_PASSWORD_FILE: cannot read {str(tmp_path / 'kafka')!r}:"
        " No such file or directory\n"
    )


def test_a_database_password_file_beside_a_dsn_with_a_password_is_refused() -> None:
    for dsn in ("host=db user=svc password=inline", "postgresql://svc:inline@db/pin"):
        with pytest.raises(SettingsError) as caught:
            load_settings(
                _Service,
                "SVC_",
                {"SVC_DATABASE_DSN": dsn, "SVC_DATABASE_PASSWORD_FILE": "/secrets/db"},
            )
        assert caught.value.variable == "SVC_DATABASE_PASSWORD_FILE"
        assert "carries a password too" in caught.value.reason
        assert "inline" not in caught.value.reason
    settings = load_settings(
        _Service,
        "SVC_",
        {"SVC_DATABASE_DSN": "host=db user=svc", "SVC_DATABASE_PASSWORD_FILE": "/secrets/db"},
    )
    assert settings.database_password_file == "/secrets/db"


def test_a_login_renewal_reads_the_file_only_after_a_refused_login_and_once_a_second(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "kafka"
    secret.write_text("first\n")
    config = load_settings(_Svc, "SVC_", scram(secret)).kafka_security()
    now = [100.0]
    renewal = LoginRenewal(config, interval=1.0, clock=lambda: now[0])
    secret.write_text("second\n")
    assert not renewal.due()  # no refusal yet: the file is not looked at
    renewal.refused(KafkaError(KafkaError._TRANSPORT))  # an outage is no refusal
    assert not renewal.due()
    renewal.refused(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED))
    renewed = renewal.renewed()
    assert renewed is not None
    assert renewed["sasl.password"] == "second"
    assert renewal.renewed() is None  # read again only a second later
    now[0] += 1.0
    assert renewal.due()
    # Clients built from the renewed config: nothing more to renew until the next rotation.
    again = LoginRenewal(renewed, interval=1.0, clock=lambda: now[0])
    again.refused(KafkaError(KafkaError._AUTHENTICATION))
    assert not again.due()


def test_a_password_read_from_a_file_is_redacted_from_what_the_process_says(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "password"
    secret.write_text("file-Secret-7\n")
    with secrets_forgotten_after():
        read_secret_file(str(secret))
        assert redact("login with file-Secret-7 refused") == "login with *** refused"
