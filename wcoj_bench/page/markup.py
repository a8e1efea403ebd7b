"""The benchmark page's generated regions (find and replace them), the markdown every renderer
shares, and the page's machine section.

``docs/benchmarks.md`` is written by hand except for regions marked like this::

    <!-- generated: NAME -->
    (markdown rendered from the JSON of part NAME)
    <!-- /generated -->

`replace_regions` rewrites the body of named regions and keeps every other byte of the page.
The renderers (`wcoj_bench.page.runs`, `wcoj_bench.page.processes`, and `render_machine` here)
turn one saved part (the record `wcoj_bench.report` writes: the command, date, wall time, load
average, machine and the command's JSON) into markdown. They read nothing but that record, so
the same JSON always renders the same page. Pure Python: no Spark, no files.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from collections.abc import Sequence
from typing import Any

from wcoj_core.errors import WcojError

PAGE = "benchmarks.md"
MACHINE = "machine"
DASH = "\u2013"  # an en dash, as in the page's hand-written tables and ranges
_REGION = re.compile(
    r"(<!-- generated: (?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /generated -->)", re.DOTALL
)
_OPEN = re.compile(r"<!-- generated: ([a-z0-9-]+) -->")


class PageError(WcojError):
    """A page whose regions are malformed, or that lacks a region to fill."""


def regions(text: str) -> dict[str, str]:
    """The body of every region of `text`, by name.

    >>> regions("a\\n<!-- generated: x -->\\nbody\\n<!-- /generated -->\\nb\\n")
    {'x': 'body\\n'}
    """
    return {m.group("name"): m.group("body") for m in _REGION.finditer(text)}


def replace_regions(text: str, bodies: dict[str, str], page: str = PAGE) -> str:
    """`text` with the body of each region named in `bodies` replaced; all else kept.

    >>> page = "intro\\n<!-- generated: a -->\\nold\\n<!-- /generated -->\\noutro\\n"
    >>> print(replace_regions(page, {"a": "new"}), end="")
    intro
    <!-- generated: a -->
    <BLANKLINE>
    new
    <BLANKLINE>
    <!-- /generated -->
    outro
    >>> replace_regions(page, {"b": "x"})
    Traceback (most recent call last):
      ...
    wcoj_bench.page.markup.PageError: benchmarks.md has no region 'b'; add a line <!-- generated: b --> and a line <!-- /generated --> where its figures belong
    """
    opened = _OPEN.findall(text)
    found = [m.group("name") for m in _REGION.finditer(text)]
    if len(found) != len(opened) or found != opened:
        raise PageError(f"{page}: every <!-- generated: NAME --> needs its <!-- /generated -->")
    twice = sorted({n for n in found if found.count(n) > 1})
    if twice:
        raise PageError(f"{page}: region {twice[0]!r} appears twice; keep one")
    for name in bodies:
        if name not in found:
            raise PageError(
                f"{page} has no region {name!r}; add a line <!-- generated: {name} --> and a "
                "line <!-- /generated --> where its figures belong"
            )

    def body(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in bodies:
            return m.group(0)
        return f"{m.group(1)}\n{bodies[name].strip()}\n\n{m.group(4)}"

    return _REGION.sub(body, text)


# Longer names for the methods, as the tables show them.
LABELS = {
    "recompute": "recompute (Spark SQL binary plan)",
    "binary-delta": "binary-delta (delta rules, binary joins)",
    "wcoj": "wcoj",
    "wcoj-apply": "wcoj-apply (the input applied: batches and the output written)",
    "wcoj-bag": "wcoj-bag (the relation an undirected bag)",
    "wcoj-executors": "wcoj-executors (the kernel in Spark's executors)",
    "spark-sql": "spark-sql (binary plan, `reference.py`)",
    "neighbour-array": "neighbour-array (`collect_set` + `array_intersect`)",
    "duckdb": "duckdb (SQL)",
    "kuzu": "kuzu (Cypher)",
    "scipy": "scipy (`sum((U @ U) ∘ U)`, from the deduplicated edges)",
    "tc": "tc (the peer C counter `../shared/peers/tc.c`, exec to exit)",
    "wcoj-count": "wcoj-count (the `wcoj count` process, exec to exit)",
    "wcoj-count-baseline": "wcoj-count-baseline (the same, another checkout's program)",
}


def _n(value: int | None) -> str:
    return DASH if value is None else f"{value:,}"


def _s(value: float) -> str:
    """Seconds: two decimals, three below a tenth.

    >>> [_s(v) for v in (70.349, 0.19, 0.0031)]
    ['70.35', '0.19', '0.003']
    """
    return f"{value:.2f}" if value >= 0.1 else f"{value:.3f}"


def _bytes(value: int | None) -> str:
    """Bytes in decimal units with three digits: 270 MB, 8.52 MB, 7.4 GB.

    >>> [_bytes(v) for v in (512, 8_520_000, 270_400_000, 7_400_000_000)]
    ['512 B', '8.52 MB', '270 MB', '7.4 GB']
    """
    if value is None:
        return DASH
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value} B"


def _bold(text: str, on: bool) -> str:
    return f"**{text}**" if on else text


def _option(argv: Sequence[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _runs(values: Sequence[float]) -> str:
    return " / ".join(_s(v) for v in values)


def _epochs(first: int, last: int) -> str:
    return f"epoch {last}" if first == last else f"epochs {first}{DASH}{last}"


def _paragraph(text: str) -> str:
    return textwrap.fill(text, width=100, break_on_hyphens=False, break_long_words=False)


def _bullets(items: Sequence[str]) -> list[str]:
    return [
        textwrap.fill(
            item,
            width=100,
            initial_indent="* ",
            subsequent_indent="  ",
            break_on_hyphens=False,
            break_long_words=False,
        )
        for item in items
    ]


def _measured(record: dict[str, Any], then: str) -> list[str]:
    """The part's command, then one paragraph: when it ran, how long, how loaded, where, and
    `then`."""
    load = " → ".join("?" if v is None else f"{v:g}" for v in record["load_average"])
    when = (
        f"Measured {record['machine']['date']} in {record['seconds']:.0f} s (load average {load}, "
        f"start → end)."
    )
    argv = record["argv"]
    where = []
    master = _option(argv, "--master")
    if master and master.startswith("spark://"):
        where.append(
            f"On a standalone cluster on this machine ({master}: two workers of one core each, "
            "started by `wcoj-bench cluster up`)."
        )
    deploy = _option(argv, "--deploy")
    if deploy:
        where.append(f"wcoj's kernel deployed: `{deploy}`.")
    settings = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--conf"]
    if settings:
        where.append("Spark settings: " + ", ".join(f"`{c}`" for c in settings) + ".")
    text = " ".join([when, *where, then])
    return ["```sh", wrap_command(record["command"]), "```", "", _paragraph(text)]


def wrap_command(command: str, width: int = 96) -> str:
    """A shell command folded into lines of at most `width`, an option kept with its value.

    >>> print(wrap_command("wcoj-bench epochs --input edge=g.txt --epochs 4 --json", width=40))
    wcoj-bench epochs --input edge=g.txt \\
        --epochs 4 --json
    """
    groups: list[str] = []
    for word in shlex.split(command):
        last = groups[-1] if groups else ""
        if last.startswith("--") and " " not in last and not word.startswith("--"):
            groups[-1] = f"{last} {shlex.quote(word)}"
        else:
            groups.append(shlex.quote(word))
    lines = [groups[0]]
    for group in groups[1:]:
        if len(lines[-1]) + len(group) + 3 > width:
            lines.append("    " + group)
        else:
            lines[-1] += " " + group
    return " \\\n".join(lines)


def render_machine(records: dict[str, dict[str, Any]]) -> str:
    """Where and how the parts ran: machine, versions, settings, dates, the exact commands."""
    lines = ["The generated parts of this page were measured on:", ""]
    described: list[str] = []
    for record in records.values():
        text = _machine_text(record["machine"])
        if text not in described:
            described.append(text)
    lines += _bullets(described)
    lines += ["", "| part | date | wall time | load average (start → end) |", "|---|---|---:|---|"]
    for name, record in records.items():
        load = " → ".join("?" if v is None else f"{v:g}" for v in record["load_average"])
        lines.append(
            f"| {name} | {record['machine']['date']} | {record['seconds']:.0f} s | {load} |"
        )
    lines += ["", "```sh"]
    for name, record in records.items():
        lines += [f"# {name}", wrap_command(record["command"])]
    lines.append("```")
    return "\n".join(lines)


def _machine_text(facts: dict[str, Any]) -> str:
    conf = facts.get("spark_conf") or {}
    spark = (
        f"pyspark {facts['packages'].get('pyspark')} ({facts.get('spark_master')}, driver memory "
        f"{conf.get('spark.driver.memory')}, {conf.get('spark.sql.shuffle.partitions')} shuffle "
        f"partitions, AQE {conf.get('spark.sql.adaptive.enabled')})"
        if facts.get("spark_master")
        else f"pyspark {facts['packages'].get('pyspark')} (no session in the part's own process)"
    )
    others = ", ".join(
        f"{p} {v}" for p, v in facts["packages"].items() if p != "pyspark" and v is not None
    )
    return (
        f"{facts['cores']} cores, {facts['memory_gib']} GiB, {facts['platform']}; Python "
        f"{facts['python']}, {facts.get('java', 'Java unknown')}, {spark}; {others}."
    )


__all__ = [
    "DASH",
    "MACHINE",
    "PAGE",
    "PageError",
    "regions",
    "render_machine",
    "replace_regions",
    "wrap_command",
]
