"""A password kept in a file (a mounted Kubernetes Secret), read each time it is used.

A password in an environment variable is fixed for the life of the process: rotating it means
restarting the pods. A file in a Secret volume is rewritten by the kubelet when the Secret
changes, so a process that reads it at each login takes a rotated password without a restart.
The file holds the password alone; one trailing line break (what `echo` and most editors add)
is not part of it. Any file mode is accepted: under a pod's `fsGroup` a Secret volume's files
are group-readable, which libpq's own passfile refuses.
"""

from __future__ import annotations

from pathlib import Path

from pin_runtime.settings import Secret

__all__ = ["SecretFileError", "read_secret_file", "unreadable_secret_file"]


class SecretFileError(OSError):
    """The file cannot be read, or holds no password. Never quotes the file's content."""


def read_secret_file(path: str) -> str:
    """The password `path` holds now. Raises `SecretFileError`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SecretFileError(f"cannot read {path!r}: {reason}") from None
    password = text.removesuffix("\n").removesuffix("\r")
    if not password:
        raise SecretFileError(f"{path!r} is empty")
    Secret(password)  # known to `redact` from now on, as a variable's secret is
    return password


def unreadable_secret_file(path: str) -> str | None:
    """Why `path` gives no password (one line), or None when it does: the check at a
    command's start, which exits 2 naming the variable that points at it."""
    try:
        read_secret_file(path)
    except SecretFileError as exc:
        return str(exc)
    return None
