"""Test helpers for the shared SparkSession."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

WHOLE_STAGE = "spark.sql.codegen.wholeStage"


@contextmanager
def interpreted(spark: SparkSession) -> Iterator[SparkSession]:
    """`spark` with whole-stage code generation off for the block (tiny data: interpreting
    beats compiling code per plan), set back as it was after."""
    previous = spark.conf.get(WHOLE_STAGE)
    spark.conf.set(WHOLE_STAGE, "false")
    try:
        yield spark
    finally:
        spark.conf.set(WHOLE_STAGE, previous or "true")
