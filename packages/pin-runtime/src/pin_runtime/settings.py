"""Typed settings from environment variables, converted and validated by msgspec.

A service declares one `msgspec.Struct` with snake_case fields and their defaults; field
`batch_size` is read from `<PREFIX>BATCH_SIZE`. Every bad value raises `SettingsError`
naming the exact variable, so an operator knows which line of the manifest to fix.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, TypeVar

import msgspec
from msgspec import inspect as mi

from pin_runtime.errors import SettingsError

__all__ = [
    "CONFIG_ERROR_EXIT_CODE",
    "LONGEST_DURATION",
    "Secret",
    "load_settings",
    "parse_duration",
    "redact",
    "redact_dsn",
    "scrub",
    "secrets_forgotten_after",
    "settings_for_log",
    "settings_or_exit",
    "unknown_variables",
]

# EX_USAGE-like and what the spec asks for: "a bad value stops the process with exit code 2".
CONFIG_ERROR_EXIT_CODE: Final = 2

LONGEST_DURATION: Final = datetime.timedelta(milliseconds=2**31 - 1)
"""The longest duration any setting takes, about 24.8 days: 2^31-1 milliseconds is the most
PostgreSQL (statement_timeout and its kin) and librdkafka (every `*.ms` property) accept,
and every duration of these services ends up in one of them or in a wait beside one."""

S = TypeVar("S", bound=msgspec.Struct)

_PREFIX = re.compile(r"[A-Z][A-Z0-9_]*_")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_BARE_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_COLLECTIONS = (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)
_JSON_SHAPED = (mi.DictType, mi.StructType, mi.DataclassType, mi.TypedDictType, mi.TupleType)


_SHOWN_AS: Final = "***"
_SHORTEST_REDACTED: Final = 4
"""Shorter values are not scrubbed from text: replacing "ab" everywhere would garble logs
and hide nothing worth hiding (no real password or key is that short)."""
_known_secrets: set[str] = set()


def _register_secret(value: str) -> None:
    """Remember `value`, and a DSN's password, so `redact` can scrub them from any text."""
    for candidate in (value, *_dsn_passwords(value)):
        if len(candidate) >= _SHORTEST_REDACTED:
            # As written, and as it reads inside a JSON string (a quote or backslash escaped).
            _known_secrets.add(candidate)
            _known_secrets.add(msgspec.json.encode(candidate).decode()[1:-1])


def _dsn_passwords(text: str) -> list[str]:
    # A libpq URL's user:password@ and ?password=, or a key=value DSN's password=...: the
    # forms in which a driver's error message may echo a password back.
    # user:password@ wherever it stands: a malformed DSN is not always a well-formed URL.
    found = re.findall(r"[^\s:/@?#]*:([^\s/?#@]+)@", text)
    found += re.findall(r"[?&]password=([^&#]*)", text, flags=re.IGNORECASE)
    found += [
        value.strip("'")
        for value in re.findall(r"\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", text, re.I)
    ]
    return found


@contextlib.contextmanager
def secrets_forgotten_after() -> Iterator[None]:
    """Forget, on leaving, every secret registered inside.

    A service loads one configuration and keeps its secrets for life. A process that loads
    many in turn (a property test of the settings draws thousands) would otherwise scrub
    every drawn four-letter "password" from all later text, names of variables included.
    """
    kept = set(_known_secrets)
    try:
        yield
    finally:
        _known_secrets.intersection_update(kept)


def redact(text: str) -> str:
    """`text` with every secret this process was configured with replaced by ***.

    The last line of defence for text that may quote a secret by accident: a driver's error
    about a malformed DSN repeats the DSN, password included. Log lines, span attributes
    and the CLIs' error lines pass through here. A secret is replaced where it stands as a
    whole token (`scrub`), not inside a longer word or path that happens to contain it.
    """
    if not _known_secrets or not text:
        return text
    return scrub(text, sorted(_known_secrets, key=len, reverse=True))


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` with each of `secrets` (in that order) replaced by *** where it stands as a whole
    token (`_whole_token`): a password `pin-runtime` goes from `postgresql://u:pin-runtime@h`,
    `password=pin-runtime` and `'pin-runtime'`, never from `packages/pin-runtime/src`."""
    for secret in secrets:
        if secret and secret in text:  # the common case (no secret in the line) stays cheap
            text = _whole_token(secret).sub(_SHOWN_AS, text)
    return text


_JOINS: Final = r"[\w/-]"
"""What continues a token: a secret next to a letter, digit, `_`, `/` or `-` is part of a
longer word, a path or a name (`BATCH_SIZE`, `packages/pin-runtime/src`,
`pin-runtime-lag-watcher`), not the secret. A `.` joins between two of those
(`identity.outbox`, `pin-runtime.log`) and ends a token otherwise (the end of a sentence).
Every delimiter a DSN, a URL or a message puts around a password (`:` `@` `=` `&` `?` `#`,
quotes, spaces, brackets, commas) ends one, so such a password is always scrubbed."""


@functools.lru_cache(maxsize=256)
def _whole_token(secret: str) -> re.Pattern[str]:
    # A side of the secret that is itself no token character (a secret starting with a
    # quote) needs no boundary there: it cannot be the tail of a longer word.
    joins_first = re.match(_JOINS, secret[0]) is not None
    joins_last = re.match(_JOINS, secret[-1]) is not None
    # In a JSON line a line break or tab before the secret reads `\n`, `\t`: an escape
    # ends the token before it as the character it stands for would.
    escaped = r"(?<=\\[ntrbf])|(?<=\\u[0-9a-fA-F]{4})"
    before = f"(?:(?<!{_JOINS})|{escaped})(?<!{_JOINS}\\.)" if joins_first else ""
    after = f"(?!{_JOINS})(?!\\.{_JOINS})" if joins_last else ""
    return re.compile(before + re.escape(secret) + after)


class Secret:
    """A string that never shows itself in `repr`, `str` or logs; `reveal()` to use it.

    Every Secret's value (and a DSN's password) is also scrubbed by `redact` from whatever
    the process logs or traces.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value
        _register_secret(value)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def parse_duration(text: str) -> datetime.timedelta:
    """Parse `250ms`, `5s`, `5m`, `1h`, `1d`, compounds like `1m30s`, or bare seconds."""
    value = text.strip().lower()
    if _BARE_NUMBER.fullmatch(value):
        return datetime.timedelta(seconds=float(value))
    parts = _DURATION_PART.findall(value)
    if not parts or "".join(number + unit for number, unit in parts) != value:
        raise ValueError(f"not a duration: {text!r}")
    return datetime.timedelta(
        seconds=sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    )


def load_settings(cls: type[S], prefix: str, environ: Mapping[str, str] | None = None) -> S:
    """Build `cls` from `environ` (default `os.environ`); raise `SettingsError` on bad values."""
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"prefix must be UPPER_SNAKE and end with '_', got {prefix!r}")
    env = os.environ if environ is None else environ
    # Every secret of the environment is known before any value is judged: a refusal of a
    # variable decoded earlier may still quote one (a DSN pasted into the wrong variable).
    for field in msgspec.structs.fields(cls):
        raw = env.get(prefix + field.name.upper())
        if raw and _is_secret(mi.type_info(field.type)):
            _register_secret(raw)
    values: dict[str, Any] = {}
    for field in msgspec.structs.fields(cls):
        variable = prefix + field.name.upper()
        raw = env.get(variable)
        if raw is None:
            if field.required:
                raise SettingsError(variable, "required but not set")
            continue
        values[field.name] = _convert(variable, raw, field.type)
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:  # raised by the struct's own __post_init__ checks
        # A check that names its variable ("PREFIX_NAME: reason") is reported under it.
        # A shared base class does not know the prefix: it names the field ("NAME: reason").
        variable, sep, reason = str(exc).partition(": ")
        known = _variables(cls, prefix)
        if sep and variable not in known and prefix + variable in known:
            variable = prefix + variable
        if sep and variable in known:
            raise SettingsError(variable, _qualified(reason, cls, prefix)) from exc
        raise SettingsError(f"{prefix}*", _qualified(str(exc), cls, prefix)) from exc


def _qualified(reason: str, cls: type[msgspec.Struct], prefix: str) -> str:
    """`reason` with each other setting it mentions by field (`RETRY_INITIAL`) spelled as
    the operator's variable (`<PREFIX>RETRY_INITIAL`): the line names both variables.

    A struct's own check may quote the value it refused; a password in it (a DSN pasted
    into the wrong variable) is masked: the value was not declared secret, so `redact`
    does not know it."""
    for password in _dsn_passwords(reason):
        if password:
            reason = reason.replace(password, "***")
    names = sorted((f.name.upper() for f in msgspec.structs.fields(cls)), key=len, reverse=True)
    pattern = re.compile(r"(?<![A-Z0-9_])(" + "|".join(map(re.escape, names)) + r")(?![A-Z0-9_])")
    return pattern.sub(lambda match: prefix + match.group(1), reason)


def settings_or_exit(cls: type[S], prefix: str, environ: Mapping[str, str] | None = None) -> S:
    """`load_settings` for CLIs: one `config error: VAR: reason` line on stderr, exit code 2."""
    try:
        return load_settings(cls, prefix, environ)
    except SettingsError as exc:
        line = redact(f"config error: {exc.variable}: {exc.reason}").replace("\n", " ")
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        raise SystemExit(CONFIG_ERROR_EXIT_CODE) from None


def _variables(cls: type[msgspec.Struct], prefix: str) -> set[str]:
    return {prefix + field.name.upper() for field in msgspec.structs.fields(cls)}


def unknown_variables(
    cls: type[msgspec.Struct], prefix: str, environ: Mapping[str, str] | None = None
) -> list[str]:
    """Variables carrying `prefix` that no field reads (likely typos), for a startup warning.

    Not an error: Kubernetes service links inject `<SERVICE>_SERVICE_HOST`-style variables
    that share the prefix of a service named like the application.
    """
    env = os.environ if environ is None else environ
    known = _variables(cls, prefix)
    return sorted(name for name in env if name.startswith(prefix) and name not in known)


def redact_dsn(dsn: str | Secret) -> str:
    """Hide the password of a libpq URL or key=value DSN so the rest can be logged."""
    text = dsn.reveal() if isinstance(dsn, Secret) else dsn
    if "://" in text:
        text = re.sub(r"(://[^:/@?#]*:)[^/?#]*(@)", r"\1***\2", text)
        return re.sub(r"([?&]password=)[^&#]*", r"\1***", text, flags=re.IGNORECASE)
    return re.sub(
        r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", text, flags=re.IGNORECASE
    )


def settings_for_log(settings: msgspec.Struct) -> dict[str, Any]:
    """The settings as plain data with secrets masked and DSN passwords redacted."""

    def hide(value: object) -> object:
        if isinstance(value, Secret):
            return "***"
        raise TypeError(f"cannot log a {type(value).__name__}")

    plain: dict[str, Any] = msgspec.to_builtins(settings, enc_hook=hide)
    return {k: redact_dsn(v) if isinstance(v, str) else v for k, v in plain.items()}


def _convert(variable: str, raw: str, annotation: Any) -> Any:
    info = mi.type_info(annotation)
    try:
        return _to_value(raw, annotation, info)
    # OverflowError: a duration or number beyond what Python's own types hold.
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError, OverflowError) as exc:
        raise SettingsError(variable, f"expected {_describe(info)}, got {_shown(raw)}") from exc


def _shown(raw: str) -> str:
    """The refused value as the refusal quotes it, unless it looks like it holds a password
    (a DSN or credential pasted into the wrong variable is no less secret there)."""
    if "password" in raw.lower() or _dsn_passwords(raw):
        return "a value that looks like it holds a password (not shown)"
    return repr(raw)


def _to_value(raw: str, annotation: Any, info: mi.Type) -> Any:
    if raw == "" and _is_optional(info):
        return None  # an empty optional variable reads as "not set"
    kind = _non_none(info)
    value: Any = raw
    if isinstance(kind, mi.TimeDeltaType):
        return _to_duration(raw, annotation)
    if isinstance(kind, _COLLECTIONS):
        value = [item.strip() for item in raw.split(",")] if raw.strip() else []
    elif isinstance(kind, _JSON_SHAPED):
        return msgspec.json.decode(raw, type=annotation, strict=False, dec_hook=_dec_hook)
    return msgspec.convert(value, annotation, strict=False, dec_hook=_dec_hook)


def _to_duration(raw: str, annotation: Any) -> Any:
    value: datetime.timedelta | str
    try:
        value = parse_duration(raw)
    except ValueError:
        value = raw  # maybe ISO 8601 (`PT5S`) or signed seconds; msgspec decides
    delta = msgspec.convert(value, annotation, strict=False)
    if isinstance(delta, datetime.timedelta) and not (
        datetime.timedelta(0) <= delta <= LONGEST_DURATION
    ):
        raise ValueError("a duration out of range")
    return delta


def _dec_hook(target: type, value: object) -> object:
    if target is Secret and isinstance(value, str):
        return Secret(value)
    # msgspec's dec_hook contract: NotImplementedError means "not a type this hook knows",
    # which msgspec turns into an ordinary validation error naming the expected type.
    raise NotImplementedError(f"unsupported settings type {target!r}")


def _is_secret(info: mi.Type) -> bool:
    kind = _non_none(info)
    return isinstance(kind, mi.CustomType) and kind.cls is Secret


def _is_optional(info: mi.Type) -> bool:
    return isinstance(info, mi.UnionType) and any(isinstance(t, mi.NoneType) for t in info.types)


def _non_none(info: mi.Type) -> mi.Type:
    if isinstance(info, mi.UnionType):
        rest = [t for t in info.types if not isinstance(t, mi.NoneType)]
        if len(rest) == 1:
            return rest[0]
    return info


def _describe(info: mi.Type) -> str:  # noqa: PLR0911 - one branch per msgspec type kind
    if isinstance(info, mi.UnionType):
        parts = [_describe(t) for t in info.types if not isinstance(t, mi.NoneType)]
        suffix = " (or empty)" if _is_optional(info) else ""
        return " or ".join(parts) + suffix
    if isinstance(info, mi.BoolType):
        return "a boolean (true/false/1/0)"
    if isinstance(info, mi.IntType):
        return "an integer" + _bounds(info.ge, info.gt, info.le, info.lt, info.multiple_of)
    if isinstance(info, mi.FloatType):
        return "a number" + _bounds(info.ge, info.gt, info.le, info.lt, info.multiple_of)
    if isinstance(info, mi.StrType):
        return "a string" + _str_bounds(info)
    if isinstance(info, mi.TimeDeltaType):
        return (
            "a duration like 250ms, 5s, 5m, 1h or a number of seconds, from 0 to 24d20h31m23.647s"
        )
    if isinstance(info, mi.LiteralType):
        return "one of " + ", ".join(repr(v) for v in info.values)
    if isinstance(info, mi.EnumType):
        return "one of " + ", ".join(repr(m.value) for m in info.cls)
    if isinstance(info, _COLLECTIONS):
        return f"a comma-separated list of {_describe(info.item_type)}"
    if isinstance(info, mi.CustomType) and info.cls is Secret:
        return "a string"
    if isinstance(info, _JSON_SHAPED):
        return "a JSON value of the declared shape"
    return type(info).__name__


def _bounds(
    ge: float | None, gt: float | None, le: float | None, lt: float | None, step: float | None
) -> str:
    words = [
        f"{op} {bound}"
        for op, bound in ((">=", ge), (">", gt), ("<=", le), ("<", lt))
        if bound is not None
    ]
    if step is not None:
        words.append(f"multiple of {step}")
    return (" " + " and ".join(words)) if words else ""


def _str_bounds(info: mi.StrType) -> str:
    words = []
    if info.min_length is not None:
        words.append(f"at least {info.min_length} characters")
    if info.max_length is not None:
        words.append(f"at most {info.max_length} characters")
    if info.pattern is not None:
        words.append(f"matching {info.pattern!r}")
    return f" ({', '.join(words)})" if words else ""
