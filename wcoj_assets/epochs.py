"""Epochs as Dagster partitions: one daily time-window partition per day, from a first day.

Epoch ``0`` is the partition of the first day (`Epochs.start`, ``2020-01-01`` unless set) and
epoch ``n`` the day ``n`` days later; the engine's ``time`` for a partition is `Epochs.number` of
its key. With `Epochs.per_day` of ``N`` (a divisor of 1,440: 24 hourly epochs, 1,440 minute
epochs) a day's partition holds the epochs ``d*N .. d*N+N-1``, each landed in ``<day>/<HHMM>``
(its first minute: `Epochs.folder`) and its own engine epoch, while Dagster counts days (a year
of minutes is 365 partition keys, not 525,600). Every place that turns epoch numbers into keys or
back (the step, the checks, the sensor, the landing writer) is given the same `Epochs`, so a code
location may start its epochs on any day: start them on the first landed epoch's day and the UI
counts the epochs there are ("5 of 5"), not every day since 2020. Time windows are used (rather
than a static or dynamic partition set) because `TimeWindowPartitionMapping` is the only
partition mapping with offsets that the daemon understands, and the arrangements depend on their
own previous epoch.

A key comes from outside (a landing folder name, a CLI argument), so `Epochs.number` accepts only
a well-formed ``YYYY-MM-DD`` date (then ``/HHMM``) at or after the start: nothing that could walk
a path.

>>> epochs = Epochs("2024-03-01")
>>> epochs.key(0), epochs.key(31), epochs.number("2024-04-01")
('2024-03-01', '2024-04-01', 31)
>>> minutes = Epochs("2024-03-01", per_day=1440)
>>> minutes.key(1441), minutes.folder(1441), minutes.span("2024-03-02"), minutes.number("2024-03-02/0001")
('2024-03-02', '2024-03-02/0001', range(1440, 2880), 1441)
>>> epoch_key(0), Epochs().number("2020-02-01")
('2020-01-01', 31)
>>> Epochs().number("../2020-01-01")
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
_TIME = re.compile(r"^([01]\d|2[0-3])([0-5]\d)$", re.ASCII)
DAY_MINUTES = 1440


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
    """Epoch numbers and their daily partition keys, counted from the day `start`, `per_day`
    epochs a day (see the module).

    >>> Epochs("2024-02-30")
    Traceback (most recent call last):
      ...
    wcoj_core.errors.InputError: first epoch '2024-02-30': not a valid date (day is out of range for month)
    >>> Epochs(per_day=7)
    Traceback (most recent call last):
      ...
    wcoj_core.errors.InputError: epochs_per_day 7: not a divisor of 1,440 (1, 24, 96, 1440...): an epoch starts on a whole minute
    """

    start: str = EPOCH_START
    per_day: int = 1

    def __post_init__(self) -> None:
        date_of_key(self.start, "first epoch")
        n = self.per_day
        if isinstance(n, bool) or not isinstance(n, int) or n < 1 or DAY_MINUTES % n:
            raise InputError(
                "not a divisor of 1,440 (1, 24, 96, 1440...): an epoch starts on a whole minute",
                f"epochs_per_day {n!r}",
            )

    @property
    def first_day(self) -> dt.date:
        return dt.date.fromisoformat(self.start)

    def partitions(self) -> DailyPartitionsDefinition:
        """The partitions definition shared by every asset and check: one per day."""
        return DailyPartitionsDefinition(start_date=self.start)

    def key(self, n: int) -> str:
        """The partition key (the day) of epoch `n` (``n >= 0``)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InputError(f"an epoch is a non-negative integer, got {n!r}", "epoch_key")
        return (self.first_day + dt.timedelta(days=n // self.per_day)).isoformat()

    def folder(self, n: int) -> str:
        """Epoch `n`'s landing folder under its relation's: its day, then (several epochs a
        day) ``HHMM``, the epoch's first minute."""
        if self.per_day == 1:
            return self.key(n)
        minute = n % self.per_day * (DAY_MINUTES // self.per_day)
        return f"{self.key(n)}/{minute // 60:02d}{minute % 60:02d}"

    def number(self, key: str) -> int:
        """The first epoch of a partition key (or the epoch of a folder, `folder`); `InputError`
        for anything but a valid one.

        >>> Epochs().number("2019-12-31")
        Traceback (most recent call last):
          ...
        wcoj_core.errors.InputError: epoch key '2019-12-31': is before the first epoch 2020-01-01
        >>> Epochs(per_day=24).number("2020-01-01/0030")
        Traceback (most recent call last):
          ...
        wcoj_core.errors.InputError: epoch folder '2020-01-01/0030': not an epoch's first minute (HHMM, every 60 minutes from 0000)
        """
        day_key, slash, time = key.partition("/") if isinstance(key, str) else (key, "", "")
        day = date_of_key(day_key if slash and _KEY.fullmatch(day_key) else key)
        if day < self.first_day:
            raise InputError(f"is before the first epoch {self.start}", f"epoch key {key!r}")
        first = (day - self.first_day).days * self.per_day
        if not slash:
            return first
        step = DAY_MINUTES // self.per_day
        hhmm = _TIME.fullmatch(time)
        minute = int(hhmm[1]) * 60 + int(hhmm[2]) if hhmm else -1
        if self.per_day == 1 or minute < 0 or minute % step:
            raise InputError(
                f"not an epoch's first minute (HHMM, every {step} minutes from 0000)",
                f"epoch folder {key!r}",
            )
        return first + minute // step

    def span(self, key: str) -> range:
        """The epochs of a partition key."""
        first = self.number(key)
        return range(first, first + self.per_day)

    def is_key(self, key: str) -> bool:
        """True when `key` is a well-formed epoch key (or folder).

        >>> [Epochs().is_key(k) for k in ("2020-01-03", "..", "abc", "/2020-01-03", "2020-1-3")]
        [True, False, False, False, False]
        """
        try:
            self.number(key)
        except InputError:
            return False
        return True


DEFAULT_EPOCHS = Epochs()


def epoch_key(n: int, start: str = EPOCH_START) -> str:
    """`Epochs.key` of the epochs starting on `start`."""
    return Epochs(start).key(n)
