"""Every benchmark module compiles on this Python (3.11): bench/run.py reports a row that does not
as an "error" and CI never gates on the benchmarks, so a syntax error there went unseen (row 9's
f-string nested its own quotes, which only Python 3.12 accepts)."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SOURCES = sorted(BENCH.rglob("*.py"))


def test_there_are_benchmark_sources():
    assert len(SOURCES) >= 17  # bench/run.py's rows and their helpers


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(BENCH).as_posix())
def test_the_benchmark_module_compiles(path):
    compile(path.read_text(), str(path), "exec")


def test_benchmarks_md_is_what_bench_run_renders_from_its_results():
    """BENCHMARKS.md is written from bench/results.json, never by hand: rendering the results again
    gives the file byte for byte (a hand edit, or a results.json left behind, shows here)."""
    import json
    import sys

    sys.path.insert(0, str(BENCH.parent))
    try:
        from bench import run
    finally:
        sys.path.remove(str(BENCH.parent))
    results = json.loads((BENCH / "results.json").read_text())
    assert run.rendered(results) == (BENCH.parent / "BENCHMARKS.md").read_text()


def test_a_row_measured_in_a_later_run_names_its_machine():
    import sys

    sys.path.insert(0, str(BENCH.parent))
    try:
        from bench import run
    finally:
        sys.path.remove(str(BENCH.parent))
    mach = {"usable_cpus": 2, "cpu_count": 2, "cpu_model": "A", "memory_gib": 23.5, "platform": "P", "python": "3.11",
            "torch": "t", "torchtune": "0.6.1", "ipython": "i", "ipywidgets": "w", "loadavg": [1.0, 1.0, 1.0]}
    row = {"key": "x", "number": "9", "metric": "m", "project": "p", "anchor": "a", "ratio": "1", "goal": "g",
           "met": True, "how": "h", "spread": "s", "note": "Its own note."}
    later = {**row, "number": "10", "machine": {**mach, "cpu_model": "B", "loadavg": [2.0, 2.0, 2.0]}}
    text = run.render([row, {**row, "number": "9b", "machine": mach}, later], mach, {"x": 1.0}, None)
    notes = text.split("## Notes per row")[1].splitlines()
    assert "- **9** Its own note." in notes and "- **9b** Its own note." in notes
    (line,) = [n for n in notes if n.startswith("- **10**")]
    assert line.startswith("- **10** Measured in a later `--only` run, on 2 usable CPU cores (2 online; B)")
    assert "at start [2.0, 2.0, 2.0]" in line and line.endswith("Its own note.")
