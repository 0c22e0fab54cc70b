"""How the operator's tables show a value: one way for every table of the service.

A missing value (SQL NULL, a count not taken yet) is `-` in every table; `--json` says
`null`. Never `None`, never an empty cell.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from pin_runtime.listing import timestamp_cell

__all__ = ["NULL", "cell", "duration_cell", "percent_cell", "rate_cell"]

NULL: Final = "-"
"""The one symbol of a missing value in the service's tables."""
_MINUTE: Final = 60
_TENTHS_BELOW: Final = 10
"""Seconds shown with a tenth below this (a short wait), whole above."""


def cell(value: object, *, width: int | None = None) -> str:
    """A value as a table shows it: a timestamp to the second, `-` for none (or empty)."""
    if value is None:
        return NULL
    if isinstance(value, datetime):
        return timestamp_cell(value)
    text = str(value)
    if width is not None:
        text = text[:width]
    return text or NULL


def duration_cell(seconds: float | None) -> str:
    """Seconds as an operator reads them: `42s`, `3m05s`, `2h07m`; `-` for none."""
    if seconds is None:
        return NULL
    whole = round(seconds)
    if whole < _MINUTE:
        return f"{seconds:.1f}s" if seconds < _TENTHS_BELOW else f"{whole}s"
    minutes, secs = divmod(whole, _MINUTE)
    if minutes < _MINUTE:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, _MINUTE)
    return f"{hours}h{minutes:02d}m"


def percent_cell(percent: float | None) -> str:
    return NULL if percent is None else f"{percent:.1f}%"


def rate_cell(rate: float | None) -> str:
    return NULL if rate is None else f"{rate:,.1f}/s"
