"""A job's lineage (tune_magic.checkpoints.lineage, Job.lineage, Job.lineage_metrics): jobs that resumed one
another, their metrics as one run, the notes and marks listings and cards show. Records and logs
are written here by hand (FAKE: no process ran) in the formats real jobs write."""

from __future__ import annotations

import pytest

import tune_magic
from tune_magic.checkpoints import lineage as L
from tune_magic.logs.points import MetricPoint
from tune_magic.registry import store as jobstore

from resumehelpers import fake_job, metric_log


@pytest.fixture
def root(job_registry):
    return job_registry




def chain(root, tmp_path):
    """a (steps 1-3, stopped) <- b (resumed at step 2: steps 3-5, failed) <- c (resumed at 4: steps 5-6)."""
    out = tmp_path / "out"
    fake_job(root, "a", out, status="stopped", log=metric_log(out, [1, 2, 3]), started=100.0, resumed_by="b")
    fake_job(root, "b", out, log=metric_log(out, [3, 4, 5]), started=200.0, resumed_from="a", resumed_by="c",
             resume_point={"checkpoint": "epoch_0/", "epoch": 0, "step": 2, "case": "exact"})
    fake_job(root, "c", out, status="succeeded", log=metric_log(out, [5, 6]), started=300.0, resumed_from="b",
             resume_point={"checkpoint": "epoch_1/", "epoch": 1, "step": 4, "case": "exact"})


def test_a_lineage_of_three_is_one_run(root, tmp_path):
    chain(root, tmp_path)
    c = tune_magic.get_job("c")
    assert [j.id for j in c.lineage()] == ["a", "b", "c"]
    assert [j.id for j in tune_magic.get_job("b").lineage()] == ["a", "b"]
    loss = [(m["job"], m["step"], m["value"]) for m in c.lineage_metrics() if m["name"] == "loss"]
    # each job's points up to where the next one resumed; the redone steps are the later job's
    assert loss == [("a", 1, 10.0), ("a", 2, 5.0), ("b", 3, 10 / 3), ("b", 4, 2.5), ("c", 5, 2.0), ("c", 6, 10 / 6)]
    curve = L.earlier_curve(c.record, L.ancestors(c.record))
    assert curve == L.EarlierCurve((1, 2, 3, 4), (10.0, 5.0, 10 / 3, 2.5), (2, 4))


def test_a_removed_or_looping_ancestor_ends_the_lineage(root, tmp_path):
    chain(root, tmp_path)
    jobstore.remove_tree(root / "a")
    assert [j.id for j in tune_magic.get_job("c").lineage()] == ["b", "c"]
    rec = jobstore.read(root / "b")
    rec.resumed_from = "c"  # a hand-edited loop
    jobstore.write_record(root / "b", rec)
    assert [r.id for r in L.ancestors(jobstore.read(root / "c"))] == ["b"]


def test_steps_that_restarted_are_shifted_to_continue():
    a, b = (MetricPoint(s, "loss", v, 1, "disklogger") for s, v in ((1, 3.0), (2, 2.0)))
    first = MetricPoint(1, "loss", 1.5, 1, "disklogger")
    from tune_magic.registry.store import JobRecord

    def rec(i, point=None):
        return JobRecord(id=i, name=i, argv=["p"], env={}, cwd="/", log_path="/x", started_at=0.0,
                         resume_point=point)

    merged = L.lineage_points([rec("x"), rec("y", {"step": 2, "case": "steps_restart"})], [[a, b], [first]])
    assert [(j, p.step, p.value) for j, p in merged] == [("x", 1, 3.0), ("x", 2, 2.0), ("y", 3, 1.5)]


def test_notes_marks_and_the_listing_links_a_resume_left_unlinked(root, tmp_path):
    chain(root, tmp_path)
    rec = jobstore.read(root / "b")
    assert L.notes(rec) == ["resumed job a from epoch_0/ at step 2", "resumed by job c"]
    assert L.mark(rec) == "resume of a from epoch_0/, resumed by c"
    a = jobstore.read(root / "a")
    a.resumed_by = None  # the resume that made b was killed before it linked a
    jobstore.write_record(root / "a", a)
    assert {j.id: j.record.resumed_by for j in tune_magic.jobs()}["a"] == "b"
    assert jobstore.read(root / "a").resumed_by == "b"
