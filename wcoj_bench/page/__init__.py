"""The benchmark page, ``docs/benchmarks.md``: its generated regions, each rendered from one
part's saved JSON.

* `wcoj_bench.page.markup` — find and replace the regions; the markdown the renderers share;
  the machine section;
* `wcoj_bench.page.runs` — the parts that run in one process (epochs, static, the curves);
* `wcoj_bench.page.processes` — the parts that time whole processes (cold, dagster-run,
  cluster-idle, scale).

`RENDERERS` maps every part to its renderer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wcoj_bench.page.markup import (
    MACHINE,
    PAGE,
    PageError,
    regions,
    render_machine,
    replace_regions,
    wrap_command,
)
from wcoj_bench.page.processes import render_cold, render_dagster_run, render_idle, render_scale
from wcoj_bench.page.runs import RENDER

RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    **RENDER,
    "cold": render_cold,
    "dagster-run": render_dagster_run,
    "cluster-idle": render_idle,
    "scale": render_scale,
}

__all__ = [
    "MACHINE",
    "PAGE",
    "RENDERERS",
    "PageError",
    "regions",
    "render_machine",
    "replace_regions",
    "wrap_command",
]
