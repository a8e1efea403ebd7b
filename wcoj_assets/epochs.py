"""Epochs as Dagster partitions: one daily time-window partition per epoch, from a first day.

Epoch ``0`` is the partition of the first day (`Epochs.start`, ``2020-01-01`` unless set) and
epoch ``n`` the day ``n`` days later; the engine's ``time`` for a partition is `Epochs.number` of
its key. Every place that turns epoch numbers into keys or back (the asset steps, the checks, the
sensor, the landing writer) is given the same `Epochs`, so a code location may start its epochs on
any day: start them on the first landed epoch's day and the UI counts the epochs there are
("5 of 5"), not every day since 2020. Time windows are used (rather than a static or dynamic
partition set) because `TimeWindowPartitionMapping` is the only partition mapping with offsets
that the daemon understands, and the arrangements depend on their own previous epoch.

A key comes from outside (a landing folder name, a CLI argument), so `Epochs.number` accepts only
a well-formed ``YYYY-MM-DD`` date at or after the start: nothing that could walk a path.

>>> epochs = Epochs("2024-03-01")
>>> epochs.key(0), epochs.key(31), epochs.number("2024-04-01")
('2024-03-01', '2024-04-01', 31)
>>> epoch_key(0), epoch_number("2020-02-01")
('2020-01-01', 31)
>>> epoch_number("../2020-01-01")
Traceback (most recent call last):
  ...
wcoj_core.errors.InputError: epoch key '../2020-01-01': not a date of the form YYYY-MM-DD
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from dagster import DailyPartitionsDefinition

from wcoj_core.errors import InputError

EPOCH_START = "2020-01-01"
# The environment variable the default code location reads its first epoch's day from.
START_ENV = "WCOJ_EPOCH_START"
_KEY = re.compile(r"^\d{4}-\d{2}-\d{2}$", re.ASCII)


def date_of_key(key: str, what: str = "epoch key") -> dt.date:
    """The day a key names; `InputError` unless it is a valid ``YYYY-MM-DD`` date.

    >>> date_of_key("2020-13-01")
    Traceback (most recent call last):
      ...
    wcoj_core.errors.InputError: epoch key '2020-13-01': not a valid date (month must be in 1..12)
    """
    source = f"{what} {key!r}"
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise InputError("not a date of the form YYYY-MM-DD", source)
    try:
        return dt.date.fromisoformat(key)
    except ValueError as e:
        raise InputError(f"not a valid date ({e})", source) from None


@dataclass(frozen=True, slots=True)
class Epochs:
    """Epoch numbers and their daily partition keys, counted from the day `start`.

    >>> Epochs("2024-02-30")
    Traceback (most recent call last):
      ...
    wcoj_core.errors.InputError: first epoch '2024-02-30': not a valid date (day is out of range for month)
    """

    start: str = EPOCH_START

    def __post_init__(self) -> None:
        date_of_key(self.start, "first epoch")

    @property
    def first_day(self) -> dt.date:
        return dt.date.fromisoformat(self.start)

    def partitions(self) -> DailyPartitionsDefinition:
        """The partitions definition shared by every asset and check: one day per epoch."""
        return DailyPartitionsDefinition(start_date=self.start)

    def key(self, n: int) -> str:
        """The partition key of epoch `n` (``n >= 0``)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InputError(f"an epoch is a non-negative integer, got {n!r}", "epoch_key")
        return (self.first_day + dt.timedelta(days=n)).isoformat()

    def number(self, key: str) -> int:
        """The epoch of a partition key; `InputError` for anything but a valid key.

        >>> Epochs().number("2019-12-31")
        Traceback (most recent call last):
          ...
        wcoj_core.errors.InputError: epoch key '2019-12-31': is before the first epoch 2020-01-01
        """
        day = date_of_key(key)
        if day < self.first_day:
            raise InputError(f"is before the first epoch {self.start}", f"epoch key {key!r}")
        return (day - self.first_day).days

    def is_key(self, key: str) -> bool:
        """True when `key` is a well-formed epoch key.

        >>> [Epochs().is_key(k) for k in ("2020-01-03", "..", "abc", "/2020-01-03", "2020-1-3")]
        [True, False, False, False, False]
        """
        try:
            self.number(key)
        except InputError:
            return False
        return True


DEFAULT_EPOCHS = Epochs()


def epoch_partitions(start: str = EPOCH_START) -> DailyPartitionsDefinition:
    """`Epochs.partitions` of the epochs starting on `start`."""
    return Epochs(start).partitions()


def epoch_key(n: int, start: str = EPOCH_START) -> str:
    """`Epochs.key` of the epochs starting on `start`."""
    return Epochs(start).key(n)


def epoch_number(key: str, start: str = EPOCH_START) -> int:
    """`Epochs.number` of the epochs starting on `start`."""
    return Epochs(start).number(key)
