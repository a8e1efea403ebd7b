"""The layout as promised: docs/layout.md names every module of the product, and no function of
it runs over 80 lines."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_of_the_product_is_in_the_layout_page() -> None:
    page = (ROOT / "docs" / "layout.md").read_text()
    modules = [
        p.relative_to(ROOT).as_posix()
        for package in ("wcoj_core", "wcoj_assets")
        for p in sorted((ROOT / package).rglob("*"))
        if p.suffix in (".py", ".c") and p.name != "__main__.py" and "__pycache__" not in p.parts
    ]
    missing = [m for m in modules if f"`{m}`" not in page]
    assert len(modules) > 50 and not missing, f"add to docs/layout.md: {missing}"
    named = {line.split("`")[1] for line in page.splitlines() if line.startswith("| `wcoj_")}
    gone = sorted(n for n in named if n.endswith((".py", ".c")) and not (ROOT / n).exists())
    assert not gone, f"docs/layout.md names modules that no longer exist: {gone}"


def test_no_function_of_the_product_is_over_80_lines() -> None:
    import ast

    long = [
        f"{p.relative_to(ROOT)}:{f.lineno} {f.name} ({(f.end_lineno or 0) - f.lineno + 1} lines)"
        for package in ("wcoj_core", "wcoj_assets")
        for p in sorted((ROOT / package).rglob("*.py"))
        for f in ast.walk(ast.parse(p.read_text()))
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
        and (f.end_lineno or f.lineno) - f.lineno + 1 > 80
    ]
    assert not long, f"split these (STYLE.md: functions under 80 lines): {long}"


def test_every_environment_variable_the_product_reads_is_a_documented_knob() -> None:
    import re

    from wcoj_core.knobs import KNOBS

    named = {
        (p.relative_to(ROOT).as_posix(), m)
        for package in ("wcoj_core", "wcoj_assets")
        for p in sorted((ROOT / package).rglob("*"))
        if p.suffix in (".py", ".c") and "__pycache__" not in p.parts
        for m in re.findall(r"WCOJ_[A-Z_]+", p.read_text())
    }
    # WCOJ_SOURCE_HASH is a compile-time macro of the kernel's build, not a variable.
    unknown = sorted((f, m) for f, m in named if m not in KNOBS and m != "WCOJ_SOURCE_HASH")
    assert not unknown, f"declare these in wcoj_core/knobs.py and docs/cli.md: {unknown}"
    direct = sorted(
        p.relative_to(ROOT).as_posix()
        for package in ("wcoj_core", "wcoj_assets")
        for p in sorted((ROOT / package).rglob("*.py"))
        if p.name != "knobs.py" and re.search(r"environ(\.get)?[\[(]\s*\"WCOJ_", p.read_text())
    )
    assert not direct, f"read these knobs through wcoj_core.knobs.knob: {direct}"
    page = (ROOT / "docs" / "cli.md").read_text()
    rows = {f"| `{k.name}` | `{k.default}` | {k.meaning} |" for k in KNOBS.values()}
    assert all(row in page.splitlines() for row in rows), "docs/cli.md's knob table != KNOBS"
