"""A job's append-only JSON-line files (``evaluations.jsonl``, ``pruned.jsonl``): written by one
``O_APPEND`` write a line, never through a link; read skipping a torn last line and foreign lines."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os

import pytest

from tune_magic.registry.files import append_json_line, read_epoch_lines


def _writer(path, n, tag):
    for i in range(n):
        append_json_line(path, {"epoch": i, "by": tag, "pad": "x" * 3000})


def test_lines_of_several_writers_never_mix(tmp_path):
    path = tmp_path / "evaluations.jsonl"
    procs = [multiprocessing.Process(target=_writer, args=(path, 200, t)) for t in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    entries = read_epoch_lines(path)
    assert len(entries) == 400 and len(path.read_text().splitlines()) == 400
    assert sorted((e["by"], e["epoch"]) for e in entries) == sorted((t, i) for t in "ab" for i in range(200))
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_torn_last_line_and_foreign_lines_are_skipped(tmp_path):
    path = tmp_path / "pruned.jsonl"
    path.write_text("\n".join([json.dumps({"epoch": 0, "bytes_freed": 10}), "[1, 2]", json.dumps({"epoch": "1"}),
                               json.dumps({"epoch": True}), "not json", json.dumps({"epoch": 2}),
                               '{"epoch": 3, "bytes_fr']))
    assert [e["epoch"] for e in read_epoch_lines(path)] == [0, 2]
    append_json_line(path, {"epoch": 4})  # after the torn line, on a line of its own: read, the torn one not
    assert [e["epoch"] for e in read_epoch_lines(path)] == [0, 2, 4]
    assert read_epoch_lines(tmp_path / "missing.jsonl") == []


def test_a_link_in_the_way_is_never_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(json.dumps({"epoch": 9}) + "\n")
    link = tmp_path / "evaluations.jsonl"
    link.symlink_to(elsewhere)
    with pytest.raises(OSError) as raised:
        append_json_line(link, {"epoch": 0})
    assert raised.value.errno == errno.ELOOP
    assert elsewhere.read_text() == json.dumps({"epoch": 9}) + "\n"
    assert read_epoch_lines(link) == []  # read as missing, not as the file it points at
    assert os.path.islink(link)
