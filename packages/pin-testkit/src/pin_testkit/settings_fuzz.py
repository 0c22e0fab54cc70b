"""Arbitrary environments for a service's settings, and what each may lead to.

A setting's value comes from a manifest someone typed: anything at all. `environments`
draws a valid base environment with a few variables replaced by hostile strings (any text,
numbers and durations far past every limit, negative ones, malformed DSNs); `outcome`
loads it as the service's command line does and returns the settings, or checks that the
refusal is the one the services promise: a `SettingsError` naming one of the variables that
was set, whose `config error:` line is a single line with no secret in it. What the caller
then proves of the accepted settings (PostgreSQL and librdkafka take them) is its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, TypeVar

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pin_runtime.errors import SettingsError
from pin_runtime.settings import load_settings, redact, secrets_forgotten_after

__all__ = ["SECRET", "check_every_setting", "environments", "outcome", "refusal_line"]

S = TypeVar("S", bound=msgspec.Struct)

SECRET: Final = "s3cret-Pa55word"  # noqa: S105 - what no refusal may print
"""The password every drawn DSN and Kafka credential carries."""

_HUGE: Final = ("99999999999999999999", "1e400", "9" * 400, "-1", "-0.5", "nan", "inf")
_DURATIONS: Final = (
    "99999999999d",
    "30d",
    "25d",
    "24d20h31m23.648s",
    "24d20h31m23.647s",
    "3.5h",
    "0",
    "0s",
    "-5s",
    "1ms",
    "PT5S",
    "P1000000000D",
    "5s5s",
)
_DSNS: Final = (
    "port=notaport",
    "sslmodee=require",
    "postgresql://u:" + SECRET + "@[127.0.0.1:5432/db",
    "host='127.0.0.1 password=" + SECRET,
    "password " + SECRET,
    "postgresql://u:" + SECRET + "@127.0.0.1:99999/db",
    "postgresql://u:" + SECRET + "@127.0.0.1/db?sslmode=sometimes",
    "host=127.0.0.1,127.0.0.2 port=1,2,3",
    "hostaddr=not-an-ip",
    "connect_timeout=soon",
    "postgresql://u:%zz" + SECRET + "@127.0.0.1/db",
)


def _hostile() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=40),
        st.sampled_from(_HUGE + _DURATIONS + _DSNS),
        st.integers().map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.tuples(st.integers(min_value=0, max_value=10**15), st.sampled_from("smhd")).map(
            lambda pair: f"{pair[0]}{pair[1]}"
        ),
    )


def environments(
    cls: type[msgspec.Struct], prefix: str, base: Mapping[str, str]
) -> st.SearchStrategy[tuple[dict[str, str], set[str]]]:
    """`base` (a valid environment) with one to three of `cls`'s variables set to hostile
    strings, and the names of those. A drawn value never holds a NUL: no environment can."""
    variables = sorted(prefix + field.name.upper() for field in msgspec.structs.fields(cls))
    hostile = _hostile().filter(lambda text: "\x00" not in text)
    return st.dictionaries(st.sampled_from(variables), hostile, min_size=1, max_size=3).map(
        lambda drawn: ({**base, **drawn}, set(drawn))
    )


def refusal_line(error: SettingsError) -> str:
    """The line a command prints for `error` (`settings_or_exit`, `run_command`)."""
    return redact(f"config error: {error.variable}: {error.reason}").replace("\n", " ")


def outcome(cls: type[S], prefix: str, env: Mapping[str, str], *, changed: set[str]) -> S | None:
    """The settings, or None after checking the refusal: it names a variable of `changed`
    (a check across two settings names one and mentions the other), and its line is one
    line without `SECRET`."""
    try:
        return load_settings(cls, prefix, env)
    except SettingsError as error:
        refused = error
    line = refusal_line(refused)
    if not (refused.variable in changed or any(v in line for v in changed)):
        raise AssertionError(f"named {refused.variable}, but {sorted(changed)} changed: {line}")
    if SECRET in line:
        raise AssertionError(f"a secret in the refusal: {line}")
    if "\n" in line or not line.startswith(f"config error: {refused.variable}: "):
        raise AssertionError(f"not one config error line: {line!r}")
    return None


def check_every_setting(
    cls: type[S],
    prefix: str,
    base: Mapping[str, str],
    then: Callable[[S], None] | None = None,
    *,
    examples: int = 300,
) -> None:
    """`examples` environments of `environments(cls, prefix, base)`, each refused as
    `outcome` demands or taken; `then(settings)` proves what consumes a taken one accepts
    it (a real session, real clients)."""

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(drawn=environments(cls, prefix, base))
    def example(drawn: tuple[dict[str, str], set[str]]) -> None:
        env, changed = drawn
        # Each drawn environment is a process of its own: its secrets leave with it.
        with secrets_forgotten_after():
            taken = outcome(cls, prefix, env, changed=changed)
            if taken is not None and then is not None:
                then(taken)

    example()
