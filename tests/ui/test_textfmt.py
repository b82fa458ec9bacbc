"""Table cells for free text: control characters escaped, long values cut, never a broken row."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tune_magic.ui.textfmt import ELLIPSIS, NAME_WIDTH, cell, cut, display_width, escape, pad, table


@pytest.mark.parametrize("text, shown", [
    ("plain name", "plain name"),
    ("a\nb", "a\\nb"),
    ("a\tb", "a\\tb"),
    ("a\rb", "a\\rb"),
    ("a\x00b", "a\\x00b"),
    ("\x1b[31mred", "\\x1b[31mred"),
    ("del\x7f", "del\\x7f"),
    ("nel\x85", "nel\\x85"),
    ("ls\u2028ps\u2029", "ls\\u2028ps\\u2029"),
    ("\u202egnp.exe", "\\u202egnp.exe"),
    ("bom\ufeff", "bom\\ufeff"),
    ("bad\udcff", "bad\\udcff"),
    ("é 😀 日本", "é 😀 日本"),
    ("back\\slash", "back\\slash"),
])
def test_escape(text, shown):
    assert escape(text) == shown


def test_names_are_cut_to_40_characters_plus_ellipsis():
    assert cut("x" * 40) == "x" * 40
    assert cut("x" * 41) == "x" * 40 + ELLIPSIS
    assert cut("y" * 500) == "y" * 40 + ELLIPSIS
    assert NAME_WIDTH == 40


def test_an_escape_is_never_split():
    assert cut("x" * 38 + "\x00tail") == "x" * 38 + ELLIPSIS  # \x00 (4 characters) does not fit whole
    assert cut("x" * 36 + "\x00tail") == "x" * 36 + "\\x00" + ELLIPSIS


def test_paths_keep_their_end():
    path = "/data/" + "d" * 80 + "/runs/job-123"
    assert cut(path, 20, keep="end") == ELLIPSIS + path[-20:]
    assert cut("/short", 20, keep="end") == "/short"


def test_cell_shows_a_dash_for_nothing():
    assert (cell(None), cell(""), cell(0), cell("a\nb")) == ("-", "-", "0", "a\\nb")


def test_bad_arguments():
    with pytest.raises(ValueError):
        cut("x", 0)
    with pytest.raises(ValueError):
        cut("x", 5, keep="middle")


@given(st.text(), st.integers(min_value=1, max_value=80), st.sampled_from(["start", "end"]))
def test_any_text_gives_one_printable_line_of_bounded_length(text, width, keep):
    shown = cut(text, width, keep=keep)
    assert len(shown) <= width + 1
    assert all(c.isprintable() or c == " " for c in shown)
    if len(escape(text)) <= width:
        assert shown == escape(text)
    else:
        assert ELLIPSIS in (shown[0], shown[-1])


@given(st.text().filter(lambda t: not set(t) & set("\\'\"")))
def test_escapes_are_the_ones_python_repr_writes(text):
    assert escape(text) == repr(text)[1:-1]


def test_cli_reports_a_damaged_record_in_a_strangely_named_directory_on_one_line(tmp_path):
    import os
    import subprocess
    import sys

    bad = tmp_path / "jobs" / "bad\nname\x1b[2J"
    bad.mkdir(parents=True)
    (bad / "record.json").write_text("{")
    r = subprocess.run([sys.executable, "-m", "tune_magic", "jobs"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TUNE_MAGIC_HOME": str(tmp_path)})
    assert r.returncode == 0
    assert r.stderr.count("\n") == 1 and "\x1b" not in r.stderr
    assert f"skipped {tmp_path}/jobs/bad\\nname\\x1b[2J: " in r.stderr


@pytest.mark.parametrize("text, width", [
    ("plain", 5), ("", 0), ("实验-α", 6), ("😀", 2), ("é", 1), ("e\u0301", 1), ("日本語", 6), ("ｶﾀｶﾅ", 4),
])
def test_display_width_counts_terminal_columns(text, width):
    assert display_width(text) == width


def test_table_pads_by_terminal_columns():
    lines = table([("NAME", "STATUS"), ("实验-α", "ok"), ("😀", "failed"), ("plain-run", "running")])
    assert lines == ["NAME       STATUS", "实验-α     ok", "😀         failed", "plain-run  running"]
    assert {display_width(line[:line.rindex(" ") + 1]) for line in lines} == {11}
    # a short row gets empty cells; trailing spaces are cut
    assert table([("a", "b", "c"), ("x",)]) == ["a  b  c", "x"]
    assert pad("实验", 5) == "实验 " and pad("toolong", 3) == "toolong"
