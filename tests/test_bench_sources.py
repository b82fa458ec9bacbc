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
