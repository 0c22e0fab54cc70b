"""Hypothesis settings of the whole-path fuzz targets: a few hundred examples in `make test`,
ten thousand and more in `make fuzz` (`PIN_FUZZ_EXAMPLES`).

The targets run each example through real PostgreSQL and Kafka, so an example takes
milliseconds, not microseconds: no per-example deadline, and the health checks about slow
data generation are off. A failure prints Hypothesis's reproduction blob and the shrunk
example as usual.
"""

from __future__ import annotations

import os
from typing import Final

from hypothesis import HealthCheck, settings

from pin_testkit.local.errors import LocalInfraError

__all__ = ["DEFAULT_EXAMPLES", "EXAMPLES_ENV", "fuzz_examples", "fuzz_settings", "fuzz_timeout"]

EXAMPLES_ENV: Final = "PIN_FUZZ_EXAMPLES"
DEFAULT_EXAMPLES: Final = 300
SECONDS_PER_EXAMPLE: Final = 0.5
"""A generous bound on one example through real servers (they take tens of milliseconds on
a busy 2-core machine): the whole-target timeout only catches a hang; a stall within an
example is each target's own deadline."""


def fuzz_examples() -> int:
    """Examples per target: `$PIN_FUZZ_EXAMPLES`, else `DEFAULT_EXAMPLES`."""
    raw = os.environ.get(EXAMPLES_ENV, "").strip()
    if not raw:
        return DEFAULT_EXAMPLES
    if not raw.isdigit() or int(raw) < 1:
        raise LocalInfraError(f"{EXAMPLES_ENV} must be a positive whole number, got {raw!r}")
    return int(raw)


def fuzz_timeout(*, setup: float = 300.0) -> float:
    """Seconds for a whole target (`pytest.mark.timeout`): the suite's 300 s would cut
    `make fuzz`'s ten thousand examples short."""
    return setup + fuzz_examples() * SECONDS_PER_EXAMPLE


def fuzz_settings() -> settings:
    """Settings for one whole-path target (use as a decorator above `@given`)."""
    return settings(
        max_examples=fuzz_examples(),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )
