"""Racing threads against the real database: the one way tests start concurrent callers.

A race only tests something when the callers reach the contended statement together, so
each thread sets itself up (opens its connection) and then waits at a shared barrier. The
results come back to the test, and an exception a thread raised is raised in the test
instead of being printed and lost with the thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

__all__ = ["run_together"]

T = TypeVar("T")


def run_together(
    task: Callable[[threading.Barrier], T], count: int, *, timeout: float = 60.0
) -> list[T]:
    """``task(start)`` in ``count`` threads at once; each calls ``start.wait()`` once it is
    set up, so that all of them race from the same moment. Their results, in start order.

    The first exception a thread raised is raised here; a thread still running after
    ``timeout`` seconds fails the call (a barrier nobody reaches breaks after ``timeout``).
    """
    start = threading.Barrier(count, timeout=timeout)
    pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="together")
    futures = [pool.submit(task, start) for _ in range(count)]
    _, running = wait(futures, timeout=timeout)
    # A stuck thread must fail the test now, not hang it in the pool's shutdown.
    pool.shutdown(wait=not running)
    if running:
        start.abort()  # a thread still at the barrier leaves it with BrokenBarrierError
        raise TimeoutError(f"{len(running)} of {count} threads still running after {timeout}s")
    return [future.result() for future in futures]
