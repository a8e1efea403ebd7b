"""Spark when the work needs it: a starter that makes the session once, and says why.

The engine works on a local state without Spark: it reads landed files and writes batches and
arrangements with pyarrow and numpy. Some work needs Spark — the executors deployment, a state
on remote storage, changes given as a Spark DataFrame, the Spark SQL check — and asks a
`SparkStarter` for the session, naming the reason. The first request starts the JVM (several
seconds) and is announced, once, with its reason; later ones get the same session. Importing
this module imports no pyspark.

>>> starter = SparkStarter(announce=print)
>>> starter.started, starter.reason
(False, None)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG = logging.getLogger("wcoj")


class SparkStarter:
    """Makes the Spark session on first use (see the module)."""

    def __init__(
        self,
        master: str | None = None,
        conf: Mapping[str, str] | None = None,
        *,
        app_name: str = "wcoj",
        announce: Callable[[str], None] | None = None,
        quiet: bool = True,
        session: SparkSession | None = None,
    ) -> None:
        self.master = master
        self.conf = dict(conf or {})
        self.app_name = app_name
        self.announce = announce or LOG.info
        self.quiet = quiet
        self._session = session
        self.reason: str | None = None if session is None else "given"

    @property
    def started(self) -> bool:
        return self._session is not None

    def __call__(self, reason: str) -> SparkSession:
        """The session, started now (announced with `reason`) if it is not running yet."""
        if self._session is None:
            from wcoj_core.fence import lift_pandas_fence

            lift_pandas_fence()  # pyspark's Arrow conversions need pandas
            from wcoj_core import spark

            active = spark.active_session(self.master)
            if active is None:
                self.announce(f"starting Spark ({self.master or spark.DEFAULT_MASTER}): {reason}")
            self._session = active or spark.session(
                self.master, self.conf, app_name=self.app_name, quiet=self.quiet
            )
            self.reason = reason
        return self._session


def starter_of(spark: object) -> SparkStarter:
    """A starter for what a caller gave: a starter, a running session, or None (a default
    starter that logs its announcement)."""
    if isinstance(spark, SparkStarter):
        return spark
    if spark is None:
        return SparkStarter()
    return SparkStarter(session=spark)  # type: ignore[arg-type]
