"""Epochs finer than a day: 1,440 minute epochs a day, a Dagster partition a day (issue 42.8).

Each minute lands in ``<landing>/edge/<day>/<HHMM>/``; minutes without a folder are gaps. One
ranged run over the days applies every landed minute as an epoch of its own (one commit each),
and Dagster counts days: a materialization per asset and day, each check's status per day. The
output at every minute epoch, landed or a gap, is the oracle's. No Spark: the step reads local
files with pyarrow and the binary join is never due.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
from dagster import DagsterInstance, build_sensor_context
from oracle import naive_eval, stored
from wcoj_support import (
    Changes,
    Pipeline,
    checks,
    failures,
    materializations,
    set_oracle,
    updates,
)

from wcoj_assets.checks import CURRENT
from wcoj_assets.epochs import Epochs
from wcoj_assets.instance import prepare_home
from wcoj_core.traces import output_trace_name

MINUTES = Epochs(per_day=1440)
# The landed minutes (engine epochs: day * 1440 + minute): gaps between, none at day 1's start.
LANDED = [0, 1, 2, 7, 1439, 1440 + 5, 1440 + 600, 1440 + 601]
GAPS = [3, 6, 8, 1438, 1440, 1444, 1440 + 599, 2879]


def land(p: Pipeline, t: int, changes: Changes) -> Path:
    folder = p.landing / "edge" / MINUTES.folder(t)
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["src,dst,diff"] + [f"{a},{b},{d}" for (a, b), d in changes]
    path = folder / "part.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def oracle(p: Pipeline, history: dict[int, Changes], t: int) -> Counter:
    edge: Counter = Counter()
    for time, ups in history.items():
        for tup, d in ups if time <= t else ():
            edge[tup] += d
    return naive_eval(p.topology.query("triangles"), {"edge": {k: m for k, m in edge.items() if m}})


def exact(p: Pipeline, history: dict[int, Changes], epochs: list[int]) -> None:
    for t in epochs:
        assert stored(p.engine, output_trace_name("triangles"), t) == oracle(p, history, t), (
            MINUTES.folder(t)
        )


def tick(p: Pipeline, cursor: str | None = None):
    sensor = p.defs.resolve_sensor_def("wcoj_landing_sensor")
    with build_sensor_context(
        cursor=cursor, instance=p.instance, definitions=p.defs, resources={"wcoj": p.resource}
    ) as context:
        return sensor.evaluate_tick(context)


@pytest.fixture
def minutes(tmp_path: Path) -> tuple[Pipeline, dict[int, Changes]]:
    instance = DagsterInstance.from_config(str(prepare_home(tmp_path / "home")))
    p = Pipeline(None, tmp_path, instance=instance, check_every=10**9, epochs_per_day=1440)
    history = dict(zip(LANDED, updates(seed=11, epochs=len(LANDED), nodes=8), strict=True))
    for t, ups in history.items():
        land(p, t, ups)
    return p, history


def test_a_day_of_minute_epochs_is_one_run_one_commit_per_minute_and_exact(
    minutes: tuple[Pipeline, dict[int, Changes]],
) -> None:
    p, history = minutes
    result = p.run((0, 1))  # days 0 and 1: a range of two partitions
    assert result.success, failures(result)
    assert len(p.instance.get_runs()) == 1
    assert p.generation() == len(LANDED)  # one commit per landed minute
    made = materializations(result)
    days = ["2020-01-01", "2020-01-02"]
    assets = {k.to_user_string() for k in p.defs.resolve_asset_graph().get_all_asset_keys()}
    assert sorted((m.asset_key.to_user_string(), m.partition) for m in made) == sorted(
        (a, d) for a in assets for d in days
    )
    out = {m.partition: m.metadata for m in made if m.asset_key.to_user_string() == "triangles"}
    assert [out[d]["epoch"].value for d in days] == [1439, 1440 + 601]  # each day's last
    own = [c for c in checks(result) if c.partition is not None]
    assert own and all(c.passed for c in own)
    assert {c.partition for c in own} == set(days)
    exact(p, history, LANDED + GAPS)
    assert tick(p).run_requests == []  # the sensor: both days ran from the files there


def test_a_corrected_minute_reruns_its_day_and_the_next_day_is_rebuilt_exact(
    minutes: tuple[Pipeline, dict[int, Changes]],
) -> None:
    p, history = minutes
    assert p.run((0, 1)).success
    (p.landing / "edge" / "2020-01-01" / "7am").mkdir()  # not an epoch's folder
    history[7] = history[7][:-2]
    land(p, 7, history[7])  # a correction of minute 0007 of day 0
    asked = tick(p)
    assert [r.partition_key for r in asked.run_requests or []] == ["2020-01-01"]
    first = p.run(0)
    assert first.success, failures(first)
    stale = [c for c in checks(first) if c.name == CURRENT and not c.passed]
    assert {c.partition for c in stale} == {"2020-01-02"}  # day 1 derived from the old minute
    # Day 1's minute 0600 removed since it ran: applied again as an empty epoch.
    for f in (p.landing / "edge" / MINUTES.folder(1440 + 600)).iterdir():
        f.unlink()
    (p.landing / "edge" / MINUTES.folder(1440 + 600)).rmdir()
    del history[1440 + 600]
    again = p.run(1)
    assert again.success and all(c.passed for c in checks(again)), failures(again)
    exact(p, history, LANDED + GAPS)


def test_a_downstream_asset_reads_each_minute_of_its_day(
    minutes: tuple[Pipeline, dict[int, Changes]],
) -> None:
    """Annotated ``dict[str, pa.Table]``, an asset of the day's partition gets the change of each
    minute epoch the state holds, by folder (``day/HHMM``): each one the oracle's."""
    p, history = minutes
    assert p.run(0).success
    seen: dict[str, int] = {}

    @dg.asset(partitions_def=MINUTES.partitions())
    def per_minute(triangles_deltas: dict[str, pa.Table]) -> None:
        seen.update({k: sum(v.column("diff").to_pylist()) for k, v in triangles_deltas.items()})

    defs = dg.Definitions.merge(p.defs, dg.Definitions(assets=[per_minute]))
    job = defs.resolve_implicit_global_asset_job_def()
    ran = job.execute_in_process(
        instance=p.instance, asset_selection=[per_minute.key], partition_key="2020-01-01"
    )
    assert ran.success
    day0 = [t for t in LANDED if t < 1440]
    assert sorted(seen) == [MINUTES.folder(t) for t in day0]
    for before, t in zip([-1, *day0], day0, strict=False):
        net = sum(oracle(p, history, t).values()) - sum(oracle(p, history, before).values())
        assert seen[MINUTES.folder(t)] == net, t


def test_the_components_epochs_per_day_runs_a_day_of_minutes_in_one_run(tmp_path: Path) -> None:
    """The quick start's component with ``epochs_per_day: 1440``: a day's folders of minutes are
    one run of the day's partition, exact; a count that does not divide a day is refused."""
    from wcoj_assets.component import QueryModel, RelationModel, WcojComponent
    from wcoj_core.errors import InputError

    attributes = {
        "relations": [RelationModel(name="edge", arity=2)],
        "queries": [QueryModel(name="triangles", query="triangles")],
        "undirected": ["edge"],
        "landing": str(tmp_path / "landing"),
        "storage": str(tmp_path / "state"),
        "check_every": 10**9,
    }
    p = Pipeline(None, tmp_path, undirected=["edge"], check_every=10**9)
    history = dict(zip([0, 3, 1439], updates(seed=2, epochs=3, nodes=7), strict=True))
    for t, ups in history.items():
        land(p, t, ups)
    defs = WcojComponent(**attributes, epochs_per_day=1440).build_defs(None)  # type: ignore[arg-type]
    job = next(j for j in defs.resolve_all_job_defs() if j.name.endswith("epoch_job"))
    with DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(instance=instance, partition_key="2020-01-01")
        assert result.success and len(instance.get_runs()) == 1
    assert p.generation() == 3
    for t in (0, 1, 3, 1000, 1439):
        upto = [ups for time, ups in sorted(history.items()) if time <= t]
        assert stored(p.engine, output_trace_name("triangles"), t) == set_oracle(
            p.topology, "triangles", upto, len(upto) - 1
        ), t
    with pytest.raises(InputError, match="epochs_per_day 7: not a divisor of 1,440"):
        WcojComponent(**attributes, epochs_per_day=7).build_defs(None)  # type: ignore[arg-type]
