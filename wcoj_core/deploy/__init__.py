"""Where the kernel runs: on the driver or inside Spark's executors, chosen in one place.

An epoch's work (`work.Work`) runs on the **driver** (`driver`: this process, traces kept in
memory, no Spark job) or the **executors** (`executors`: one Spark job, each Python worker keeping
the traces). `choose` alone decides, and says why (recorded in every epoch's metrics): the driver
serves a state on this machine within `Limits.driver_max_rows` and `Limits.driver_epoch_rows`
(by default any: it streams and spills within the budget), the executors everything else;
`Limits.mode` forces either.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from wcoj_core.errors import QueryError

# The driver maps the traces an epoch reads and spills what its memory budget cannot hold: it
# takes any state and any epoch unless a caller sets limits (tests, to reach the executors).
DRIVER_MAX_ROWS = 1 << 62
DRIVER_EPOCH_ROWS = 1 << 62
# What an executor's Python worker holds replicated: beyond it, arrangements are sharded.
EXECUTOR_MAX_ROWS = 100_000_000
# A small work (at most this many changed rows) runs in one task on warm executors: no second
# stage (`wcoj_core.deploy.spark_job`).
ONE_TASK_ROWS = 50_000


class Deployment(Enum):
    """Where an epoch's kernel work runs."""

    DRIVER = "driver"
    EXECUTORS = "executors"


@dataclass(frozen=True, slots=True)
class Choice:
    """A deployment and why it was chosen (for the epoch's metrics and logs); on the executors,
    the number of shards each arrangement is cut into (1: replicated to every executor)."""

    deployment: Deployment
    reason: str
    shards: int = 1

    @property
    def on_driver(self) -> bool:
        return self.deployment is Deployment.DRIVER


MODES = ("auto", "driver", "executors")


@dataclass(frozen=True, slots=True)
class Limits:
    """How `choose` decides: a forced deployment (`mode`), or the driver's limits."""

    mode: str = "auto"
    driver_max_rows: int = DRIVER_MAX_ROWS
    driver_epoch_rows: int = DRIVER_EPOCH_ROWS
    executor_max_rows: int = EXECUTOR_MAX_ROWS

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise QueryError(f"deployment {self.mode!r}: expected one of {', '.join(MODES)}")


def choose(limits: Limits, *, local: bool, held: int, changed: int | None = None) -> Choice:
    """The deployment of an epoch's work: `local` (the state on this disk), `held` (rows of the
    traces read), `changed` (rows the epoch changes; None: not counted yet, the caller counts up
    to `limits.driver_epoch_rows` and asks again). Traces beyond `limits.executor_max_rows` are
    sharded.

    >>> choose(Limits(), local=True, held=5_000, changed=1_000).reason
    'fits the driver (6,000 rows held, 1,000 changed)'
    >>> choose(Limits(), local=False, held=5).reason
    'the state is not on this machine: only executors reach it'
    >>> c = choose(Limits("executors", executor_max_rows=100), local=True, held=250, changed=0)
    >>> c.deployment.value, c.shards, c.reason
    ('executors', 3, "executors asked for; 250 rows exceed an executor's 100: 3 shards")
    """
    on_driver = _driver(limits, local, held, changed)
    if on_driver is not None:
        return on_driver
    reason = _executors(limits, local, held, changed)
    total = held + (changed or 0)
    if total <= limits.executor_max_rows:
        return Choice(Deployment.EXECUTORS, reason)
    shards = -(-total // max(limits.executor_max_rows, 1))
    more = f"{total:,} rows exceed an executor's {limits.executor_max_rows:,}: {shards} shards"
    return Choice(Deployment.EXECUTORS, f"{reason}; {more}", shards)


def _driver(limits: Limits, local: bool, held: int, changed: int | None) -> Choice | None:
    """The driver's choice, when it is one."""
    if limits.mode == "driver":
        return Choice(Deployment.DRIVER, "the driver asked for")
    if limits.mode == "executors" or not local or limits.driver_epoch_rows <= 0:
        return None
    total = held + (changed or 0)
    if total > limits.driver_max_rows:
        return None
    if changed is not None and changed > limits.driver_epoch_rows:
        return None
    if changed is None:
        return Choice(Deployment.DRIVER, f"fits the driver so far ({held:,} rows held)")
    return Choice(Deployment.DRIVER, f"fits the driver ({total:,} rows held, {changed:,} changed)")


def _executors(limits: Limits, local: bool, held: int, changed: int | None) -> str:
    """Why the executors run a work the driver does not."""
    if limits.mode == "executors":
        return "executors asked for"
    if not local:
        return "the state is not on this machine: only executors reach it"
    if limits.driver_epoch_rows <= 0:
        return "the driver is turned off"
    total = held + (changed or 0)
    if total > limits.driver_max_rows:
        return f"{total:,} rows held exceed the driver's {limits.driver_max_rows:,}"
    return f"more than the driver's {limits.driver_epoch_rows:,} rows changed at the epoch"
