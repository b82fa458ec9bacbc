"""The listing path's speed-ups keep every result exactly as before (bench row 9 times them).

``jobs()`` reads each record once, ``read_bytes`` sizes its read by the file, ``cut``/``escape``
skip per-character work for printable text, and ``Summary.to_json`` serialises without a deep
copy: each is checked against the slow form it replaced.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict

from hypothesis import given, settings
from hypothesis import strategies as st

import tune_magic.job as J
from tune_magic.registry import store as jobstore
from tune_magic.logs import summary as S
from tune_magic.ui import textfmt
from tune_magic.registry.store import JobRecord


def _slow_cut(text: str, width: int, keep: str) -> str:
    """cut() as it was: one escape unit per character."""
    units = [textfmt.escape_char(c) for c in text]
    if sum(map(len, units)) <= width:
        return "".join(units)
    if keep == "end":
        units.reverse()
    kept, used = [], 0
    for unit in units:
        if used + len(unit) > width:
            break
        kept.append(unit)
        used += len(unit)
    return textfmt.ELLIPSIS + "".join(reversed(kept)) if keep == "end" else "".join(kept) + textfmt.ELLIPSIS


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=90), st.integers(1, 70), st.sampled_from(["start", "end"]))
def test_cut_and_escape_are_unchanged_for_any_text(text, width, keep):
    assert textfmt.cut(text, width, keep=keep) == _slow_cut(text, width, keep)
    assert textfmt.escape(text) == "".join(textfmt.escape_char(c) for c in text)


def test_cut_of_printable_text_keeps_its_start_or_end():
    name = "lora-" + "x" * 60 + "-end"
    assert textfmt.cut(name, 10) == "lora-xxxxx…"
    assert textfmt.cut(name, 10, keep="end") == "…xxxxxx-end"
    assert textfmt.cut("a b", 3) == "a b"  # a plain space is printable: kept as is
    assert textfmt.cut("a\u00a0b", 3) == "a…"  # a no-break space is not: its escape \\xa0 is never split


def test_read_bytes_returns_the_first_limit_plus_one_bytes_at_any_size(tmp_path):
    path = tmp_path / "f"
    for size in (0, 1, 100, 4096, 65535, 65536, 65537, (1 << 20) + 3, 5 << 20):
        data = os.urandom(size)
        path.write_bytes(data)
        for limit in (0, 10, 65536, 1 << 20, 4 << 20):
            assert jobstore.read_bytes(path, limit) == data[:limit + 1], (size, limit)


def test_read_json_still_refuses_a_file_over_its_limit(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b"[" + b"1," * 600_000 + b"1]")
    try:
        jobstore.read_json(path, 1 << 20)
    except ValueError as exc:
        assert "larger than 1048576 bytes" in str(exc)
    else:
        raise AssertionError("a 1.2 MB file passed a 1 MiB limit")


def test_summary_json_is_byte_for_byte_the_dataclass_dump():
    s = S.Summary(step=7, loss=float("nan"), epoch=1, progress="1|7|Loss: nan", metrics={"loss": float("inf"), "lr": 1e-3},
                  saving=True, error="rank 1 failed", log_offset=99, log_ident=[1, 2], metrics_path="/x/log_1.txt",
                  rank_offsets={"/r/0/stdout.log": 5}, nodes={"n1": "10.0.0.1"}, rank_hosts=[["n1", 0], ["n2", 1]],
                  endpoint="n1:29500", progress_step=7, progress_loss=-math.inf)
    assert s.to_json() == json.dumps(asdict(s)).encode()
    assert S.Summary().to_json() == json.dumps(asdict(S.Summary())).encode()
    back = S.Summary.from_dict(json.loads(s.to_json()))
    assert back.to_json() == s.to_json()


def _finished(root, job_id: str, started: float) -> JobRecord:
    d = root / job_id
    d.mkdir(parents=True)
    rec = JobRecord(id=job_id, name=job_id, argv=["python", "x.py"], env={}, cwd=str(root),
                    log_path=str(d / jobstore.OUTPUT_LOG), started_at=started, status="succeeded",
                    ended_at=started + 1, returncode=0)
    jobstore.write_record(d, rec)
    return rec


def test_a_listing_reads_each_record_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path))
    root = tmp_path / "jobs"
    for i in range(5):
        _finished(root, f"job{i}", time.time() - 100 + i)
    reads: list[str] = []
    real_read = jobstore.read
    monkeypatch.setattr(jobstore, "read", lambda d: reads.append(d.name) or real_read(d))
    listed = J.jobs()
    assert [j.id for j in listed] == [f"job{i}" for i in range(5)]
    assert sorted(reads) == [f"job{i}" for i in range(5)]  # before: each twice (list, then refresh)


def test_a_record_replaced_after_the_listing_read_it_is_shown_as_replaced(tmp_path, monkeypatch):
    """The listing's stamp is taken before its read, so a record changed in between or after is
    read again, never an old record kept under a new stamp."""
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path))
    root = tmp_path / "jobs"
    rec = _finished(root, "job0", time.time() - 100)
    real_read = jobstore.read

    def read_then_replace(d):
        got = real_read(d)
        jobstore.write_record(d, JobRecord.from_dict({**rec.to_dict(), "name": "renamed"}))
        return got

    monkeypatch.setattr(jobstore, "list_records_checked", _with_read(jobstore.list_records_checked, read_then_replace,
                                                                     monkeypatch))
    (job,) = J.jobs()
    assert job.name == "renamed"

    # and replaced between the stamp and the read: the new record, read again under its own stamp
    def replace_then_read(d):
        jobstore.write_record(d, JobRecord.from_dict({**rec.to_dict(), "name": "again"}))
        return real_read(d)

    monkeypatch.setattr(jobstore, "list_records_checked", _with_read(jobstore.list_records_checked.__wrapped__,
                                                                     replace_then_read, monkeypatch))
    (job,) = J.jobs()
    assert job.name == "again" and job.refresh().name == "again"


def _with_read(listing, read, monkeypatch):
    """``listing`` with jobstore.read replaced by ``read`` while it runs (refresh keeps the real one)."""
    real = jobstore.read

    def wrapped(*a, **kw):
        monkeypatch.setattr(jobstore, "read", read)
        try:
            return listing(*a, **kw)
        finally:
            monkeypatch.setattr(jobstore, "read", real)

    wrapped.__wrapped__ = listing
    return wrapped
