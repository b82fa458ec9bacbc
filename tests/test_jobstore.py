"""The on-disk job registry: validation, atomic updates, corrupt records skipped."""

import json
import stat
import time

import pytest

from tune_magic import jobstore
from tune_magic.jobstore import CorruptRecord, JobRecord, ProcessRef


def rec(job_id="j1", **kw):
    return JobRecord(id=job_id, name="n", argv=["python", "x.py"], env={"A": "1"}, cwd="/", log_path="/tmp/x.log",
                     started_at=time.time(), **kw)


def test_round_trip_and_mode_0700(tmp_path):
    d = jobstore.create(rec(agent=ProcessRef(12, 3.5), workers=[ProcessRef(13, 3.6, 0)]), tmp_path)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    back = jobstore.read(d)
    assert back.agent == ProcessRef(12, 3.5) and back.workers == [ProcessRef(13, 3.6, 0)]
    assert back.env == {"A": "1"} and back.status == "running"


def test_jobs_root_is_0700(tmp_path):
    root = jobstore.jobs_root({"TUNE_MAGIC_HOME": str(tmp_path / "h")})
    assert root == tmp_path / "h" / "jobs"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_update_is_read_modify_write(tmp_path):
    d = jobstore.create(rec(), tmp_path)
    jobstore.update(d, returncode=3, status="failed")
    jobstore.update(d, error="boom")
    back = jobstore.read(d)
    assert (back.returncode, back.status, back.error) == (3, "failed", "boom")


@pytest.mark.parametrize("content", [
    "{not json", "[]", json.dumps({"id": "x"}), json.dumps({**rec().to_dict(), "status": "exploded"}),
    json.dumps({**rec().to_dict(), "argv": "python x.py"}), json.dumps({**rec().to_dict(), "agent": {"pid": 1}}),
    json.dumps({**rec().to_dict(), "started_at": "yesterday"}),
])
def test_corrupt_records_are_rejected_and_skipped_in_listing(tmp_path, content):
    good = jobstore.create(rec("good"), tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / jobstore.RECORD).write_text(content)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorruptRecord):
        jobstore.read(bad)
    assert [r.id for r in jobstore.list_records(tmp_path)] == ["good"]
    assert good.exists()


def test_create_refuses_existing_id(tmp_path):
    jobstore.create(rec("same"), tmp_path)
    with pytest.raises(FileExistsError):
        jobstore.create(rec("same"), tmp_path)


@pytest.mark.parametrize("change", [
    {"id": "other-id"}, {"supervisor": {"pid": "x", "create_time": 1.0}}, {"ended_at": "yesterday"},
    {"name": 5}, {"started_at": float("nan")}, {"gpus": ["0"]}, {"env": {"A": 1}}, {"returncode": True},
])
def test_every_field_is_validated_and_bad_records_can_be_removed(tmp_path, monkeypatch, change):
    import tune_magic.jobctl as J

    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path))
    root = jobstore.jobs_root()
    jobstore.create(rec("good"), root)
    bad = root / "bad"
    bad.mkdir()
    (bad / jobstore.RECORD).write_text(json.dumps({**rec("bad").to_dict(), **change}))
    skipped = []
    assert [r.id for r in jobstore.list_records(root, skipped)] == ["good"]
    assert skipped == [bad]
    assert [j.id for j in J.jobs()] == ["good"]
    J.remove("bad")  # an unreadable record can still be removed
    assert not bad.exists()


def test_home_that_is_a_file_is_a_clear_error(tmp_path):
    f = tmp_path / "afile"
    f.write_text("")
    with pytest.raises(jobstore.StateDirError, match="point TUNE_MAGIC_HOME at a writable directory"):
        jobstore.jobs_root({"TUNE_MAGIC_HOME": str(f)})


def test_stop_checks_grace_before_signalling_anything(tmp_path, monkeypatch):
    import tune_magic.jobctl as J

    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path))
    d = jobstore.create(rec("j-grace"), jobstore.jobs_root())
    for grace in (-5, float("nan"), float("inf"), "3", True):
        with pytest.raises(ValueError, match="grace_s"):
            J.Job(d).stop(grace_s=grace)
    assert jobstore.read(d).stop_requested is False
