"""A job's attempts (tune_magic.registry.attempts) and the record fields a resume reads: their format,
their validation, and records of earlier releases (without them) loading with the defaults."""

from __future__ import annotations

import json
import time

import pytest

from tune_magic.registry import attempts as A
from tune_magic.registry import store as jobstore
from tune_magic.registry.store import CorruptRecord, JobRecord


def rec(**kw):
    return JobRecord(id="j1", name="n", argv=["python", "x.py"], env={}, cwd="/", log_path="/tmp/x.log",
                     started_at=100.0, **kw)


def test_begin_writes_the_first_attempt_then_the_next_and_finish_ends_the_last():
    first_end = A.finish([], ended_at=130.0, reason="rank 1: RuntimeError: boom", step=3, returncode=1,
                         first_started_at=100.0)
    assert first_end == [{"number": 1, "started_at": 100.0, "ended_at": 130.0, "reason": "rank 1: RuntimeError: boom",
                          "step": 3, "returncode": 1, "resumed_from": None, "log_offset": 0}]
    two = A.begin(first_end, started_at=131.0, first_started_at=100.0,
                  resumed_from={"checkpoint": "epoch_0/", "epoch": 0, "step": 2}, log_offset=4096)
    assert [a["number"] for a in two] == [1, 2] and two[1]["ended_at"] is None and two[1]["log_offset"] == 4096
    done = A.finish(two, ended_at=160.0, reason=None, step=6, returncode=0)
    parsed = A.parse(done)
    assert [(a.number, a.elapsed_s, a.step) for a in parsed] == [(1, 30.0, 3), (2, 29.0, 6)]
    assert A.finish(done, ended_at=999.0, reason="later", step=9, returncode=2) == done  # an end is kept
    assert first_end[0]["number"] == 1 and len(first_end) == 1  # inputs are not modified


def test_begin_on_an_empty_list_adds_the_jobs_first_attempt_too():
    two = A.begin([], started_at=50.0, first_started_at=10.0, resumed_from=None, log_offset=0)
    assert [(a["number"], a["started_at"]) for a in two] == [(1, 10.0), (2, 50.0)]


def test_notes_say_where_each_attempt_resumed_and_why_the_one_before_ended():
    attempts = A.parse(A.finish(A.begin(A.finish([], ended_at=5.0, reason="requeued (preempted)", step=3,
                                                 returncode=None, first_started_at=1.0),
                                        started_at=6.0, first_started_at=1.0,
                                        resumed_from={"checkpoint": "epoch_0/", "epoch": 0, "step": 2}, log_offset=9),
                                ended_at=9.0, reason=None, step=6, returncode=0))
    assert A.notes(attempts) == ["attempt 2: resumed from epoch_0/ at step 2 after requeued (preempted) "
                                 "(attempt 1 reached step 3)"]
    again = A.parse([{"number": 1, "started_at": 1.0, "ended_at": 2.0}, {"number": 2, "started_at": 3.0}])
    assert A.notes(again) == ["attempt 2: started over from the beginning"]


@pytest.mark.parametrize("bad, why", [
    ("x", "must be a list"), ([1], "is not an object"), ([{"started_at": 1.0}], "positive number"),
    ([{"number": 1, "started_at": 1.0, "step": "3"}], "step has the wrong type"),
    ([{"number": 1, "started_at": 1.0, "reason": 5}], "reason must be text"),
    ([{"number": 1, "started_at": 1.0, "resumed_from": {"epoch": 0}}], "must name a checkpoint"),
])
def test_malformed_attempts_are_refused(bad, why):
    with pytest.raises(ValueError, match=why):
        A.parse(bad)
    with pytest.raises(CorruptRecord, match="field 'attempts'"):
        JobRecord.from_dict({**rec().to_dict(), "attempts": bad})


def test_the_resume_fields_round_trip_and_an_earlier_releases_record_has_their_defaults(tmp_path):
    r = rec(recipe_name="lora_finetune", torchrun_options=["--nproc_per_node", "2"], overrides=["epochs=3"],
            resumed_from="j0", resumed_by="j2", resume_point={"checkpoint": "epoch_1/", "epoch": 1, "step": 8},
            attempts=A.finish([], ended_at=130.0, reason=None, step=3, returncode=0, first_started_at=100.0),
            max_resumes=2)
    d = jobstore.create(r, tmp_path)
    back = jobstore.read(d)
    assert (back.recipe_name, back.torchrun_options, back.overrides, back.resumed_from, back.resumed_by,
            back.resume_point, back.max_resumes) == ("lora_finetune", ["--nproc_per_node", "2"], ["epochs=3"], "j0",
                                                     "j2", {"checkpoint": "epoch_1/", "epoch": 1, "step": 8}, 2)
    assert back.attempts == r.attempts
    old = {k: v for k, v in rec().to_dict().items() if k not in (
        "recipe_name", "torchrun_options", "overrides", "resumed_from", "resumed_by", "resume_point", "attempts",
        "max_resumes")}
    (d / jobstore.RECORD).write_text(json.dumps(old))
    back = jobstore.read(d)
    assert (back.overrides, back.torchrun_options, back.resumed_from, back.attempts, back.max_resumes) == (
        None, None, None, [], None)


@pytest.mark.parametrize("field, value", [("overrides", ["a=1", 2]), ("torchrun_options", "x"), ("max_resumes", 0),
                                          ("resume_point", "epoch_1"), ("resumed_from", 3)])
def test_resume_fields_of_the_wrong_type_are_corrupt(field, value):
    with pytest.raises(CorruptRecord):
        JobRecord.from_dict({**rec().to_dict(), field: value, "started_at": time.time()})
