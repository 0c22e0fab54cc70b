"""What a service container is given: the service's variables, never the host's own."""

from __future__ import annotations

from pin_testkit.service_container import container_environment


def test_only_the_services_variables_reach_the_container() -> None:
    env = {
        "PATH": "/work/.venv/bin:/usr/bin",  # would hide the image's /app/bin
        "HOME": "/root",
        "VIRTUAL_ENV": "/work/.venv",
        "IDENTITY_FANOUT_DATABASE_DSN": "postgresql://w:p@127.0.0.1:25432/pin_identity",
        "REWARDS_MEMBERSHIP_GROUP_ID": "g",
        "OTEL_TRACES_EXPORTER": "console",
        "COLUMNS": "240",
    }
    assert container_environment(env) == {
        "IDENTITY_FANOUT_DATABASE_DSN": "postgresql://w:p@127.0.0.1:25432/pin_identity",
        "REWARDS_MEMBERSHIP_GROUP_ID": "g",
        "OTEL_TRACES_EXPORTER": "console",
        "COLUMNS": "240",
    }
