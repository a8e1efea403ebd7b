"""Epochs as Dagster partitions: one daily time-window partition per epoch.

Epoch ``0`` is the partition ``2020-01-01`` and epoch ``n`` the day ``n`` days later; the engine's
``time`` for a partition is `epoch_number` of its key. Time windows are used (rather than a static
or dynamic partition set) because `TimeWindowPartitionMapping` is the only partition mapping with
offsets that the daemon understands, and the arrangements depend on their own previous epoch.

A key comes from outside (a landing folder name, a CLI argument), so `epoch_number` accepts only a
well-formed ``YYYY-MM-DD`` date at or after the start: nothing that could walk a path.

>>> epoch_key(0), epoch_key(31)
('2020-01-01', '2020-02-01')
>>> epoch_number("2020-02-01")
31
>>> epoch_number("../2020-01-01")
Traceback (most recent call last):
  ...
wcoj_core.errors.InputError: epoch key '../2020-01-01': not a date of the form YYYY-MM-DD
"""

from __future__ import annotations

import datetime as dt
import re

from dagster import DailyPartitionsDefinition

from wcoj_core.errors import InputError

EPOCH_START = "2020-01-01"
_START = dt.date.fromisoformat(EPOCH_START)
_KEY = re.compile(r"^\d{4}-\d{2}-\d{2}$", re.ASCII)


def epoch_partitions() -> DailyPartitionsDefinition:
    """The partitions definition shared by every asset and check: one day per epoch."""
    return DailyPartitionsDefinition(start_date=EPOCH_START)


def epoch_key(n: int) -> str:
    """The partition key of epoch `n` (``n >= 0``)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(f"an epoch is a non-negative integer, got {n!r}", "epoch_key")
    return (_START + dt.timedelta(days=n)).isoformat()


def epoch_number(key: str) -> int:
    """The epoch of a partition key; `InputError` for anything but a valid key.

    >>> epoch_number("2019-12-31")
    Traceback (most recent call last):
      ...
    wcoj_core.errors.InputError: epoch key '2019-12-31': is before the first epoch 2020-01-01
    >>> epoch_number("2020-13-01")
    Traceback (most recent call last):
      ...
    wcoj_core.errors.InputError: epoch key '2020-13-01': not a valid date (month must be in 1..12)
    """
    source = f"epoch key {key!r}"
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise InputError("not a date of the form YYYY-MM-DD", source)
    try:
        day = dt.date.fromisoformat(key)
    except ValueError as e:
        raise InputError(f"not a valid date ({e})", source) from None
    if day < _START:
        raise InputError(f"is before the first epoch {EPOCH_START}", source)
    return (day - _START).days


def is_epoch_key(key: str) -> bool:
    """True when `key` is a well-formed epoch key.

    >>> [is_epoch_key(k) for k in ("2020-01-03", "..", "abc", "/2020-01-03", "2020-1-3")]
    [True, False, False, False, False]
    """
    try:
        epoch_number(key)
    except InputError:
        return False
    return True
