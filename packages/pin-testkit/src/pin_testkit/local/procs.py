"""Process, time and file helpers shared by the PostgreSQL and Kafka launchers."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pin_testkit.local.errors import LocalInfraError

POLL_INTERVAL = 0.1


@dataclass(frozen=True, slots=True)
class Deadline:
    """A point on the monotonic clock after which a wait gives up."""

    expires_at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def remaining(self) -> float:
        return max(0.0, self.expires_at - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.expires_at


def reap(pid: int) -> None:
    """Collect the exit status of ``pid`` if it is a child of this process that has ended."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` names a live (not zombie) process."""
    if pid <= 0:
        return False
    reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return True
    # The state letter follows the parenthesised command name, which may itself hold spaces.
    state = stat.rpartition(")")[2].split()
    return not state or state[0] not in {"Z", "X"}


def cmdline(pid: int) -> list[str]:
    """The argument vector of ``pid`` ([] when it cannot be read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def wait_gone(pid: int, deadline: Deadline) -> bool:
    """Poll until ``pid`` has exited; False when the deadline passed first."""
    while pid_alive(pid):
        if deadline.expired():
            return False
        time.sleep(POLL_INTERVAL)
    return True


def terminate(pid: int, grace: float) -> bool:
    """SIGTERM ``pid``, wait up to ``grace`` seconds, then SIGKILL and wait again.

    True when the process ended by itself within the grace period.
    """
    if not pid_alive(pid):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if wait_gone(pid, Deadline.after(grace)):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not wait_gone(pid, Deadline.after(10.0)):
        raise LocalInfraError(f"process {pid} survived SIGKILL")
    return False


def spawn_detached(args: list[str], output: Path) -> int:
    """Start ``args`` in a session of its own (it outlives this process), stdin from
    /dev/null, stdout and stderr to ``output`` (truncated); its pid."""
    console = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        return os.posix_spawn(
            args[0],
            args,
            dict(os.environ),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, console, 1),
                (os.POSIX_SPAWN_DUP2, console, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(console)


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def file_lock(path: Path, timeout: float) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` so that concurrent ``up``/``down`` calls serialise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = Deadline.after(timeout)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline.expired():
                    raise LocalInfraError(
                        f"another pin-local holds {path} for more than {timeout:.0f}s"
                    ) from None
                time.sleep(POLL_INTERVAL)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
