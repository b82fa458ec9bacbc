"""The on-disk job registry: validation, atomic updates, corrupt records skipped."""

import json
import stat
import time

import pytest

from tune_magic.registry import store as jobstore
from tune_magic.registry.store import CorruptRecord, JobRecord, ProcessRef


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
    import tune_magic.job as J

    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path))
    root = jobstore.jobs_root()
    jobstore.create(rec("good"), root)
    bad = root / "bad"
    bad.mkdir()
    (bad / jobstore.RECORD).write_text(json.dumps({**rec("bad").to_dict(), **change}))
    skipped = []
    assert [r.id for r in jobstore.list_records(root, skipped)] == ["good"]
    assert skipped == [bad]
    with pytest.warns(RuntimeWarning, match=r"skipped job directory .*bad: "):
        assert [j.id for j in J.jobs()] == ["good"]
    J.remove("bad")  # an unreadable record can still be removed
    assert not bad.exists()


def test_home_that_is_a_file_is_a_clear_error(tmp_path):
    f = tmp_path / "afile"
    f.write_text("")
    with pytest.raises(jobstore.StateDirError, match="point TUNE_MAGIC_HOME at a writable directory"):
        jobstore.jobs_root({"TUNE_MAGIC_HOME": str(f)})


def test_stop_checks_grace_before_signalling_anything(tmp_path, monkeypatch):
    import tune_magic.job as J

    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path))
    d = jobstore.create(rec("j-grace"), jobstore.jobs_root())
    for grace in (-5, float("nan"), float("inf"), "3", True):
        with pytest.raises(ValueError, match="grace_s"):
            J.Job(d).stop(grace_s=grace)
    assert jobstore.read(d).stop_requested is False


def test_schema_1_record_loads_and_is_written_as_the_current_schema(tmp_path):
    old = rec("old").to_dict()
    for key in ("scheduler", "log_lost_at", "scheduler_options", "backend"):
        old.pop(key)
    old["schema"] = 1
    d = tmp_path / "old"
    d.mkdir()
    (d / jobstore.RECORD).write_text(json.dumps(old))
    back = jobstore.read(d)
    assert (back.scheduler, back.status, back.schema, back.backend) == ("local", "running", 3, {})
    jobstore.update(d, error="x")
    assert json.loads((d / jobstore.RECORD).read_text())["schema"] == 3


def test_fields_this_release_does_not_know_are_written_back_unchanged(tmp_path):
    # a later release's fields (or an earlier one's that moved) survive every read-modify-write
    data = {**rec("fut").to_dict(), "future_field": {"nested": [1, 2]}, "slurm_job_id": "42"}
    d = tmp_path / "fut"
    d.mkdir()
    (d / jobstore.RECORD).write_text(json.dumps(data))
    back = jobstore.read(d)
    assert back.extra == {"future_field": {"nested": [1, 2]}, "slurm_job_id": "42"}
    jobstore.update(d, error="x")
    written = json.loads((d / jobstore.RECORD).read_text())
    assert (written["future_field"], written["slurm_job_id"], written["error"]) == ({"nested": [1, 2]}, "42", "x")


def test_backend_and_scheduler_options_must_be_mappings_of_names(tmp_path):
    for key in ("backend", "scheduler_options"):
        with pytest.raises(jobstore.CorruptRecord, match=key):
            jobstore.JobRecord.from_dict({**rec().to_dict(), key: ["x"]})


def test_update_goes_through_the_transition_rule(tmp_path):
    d = jobstore.create(rec(), tmp_path)
    jobstore.update(d, status="succeeded", returncode=0)
    jobstore.update(d, status="failed", returncode=1)  # a later writer racing to record an end loses
    back = jobstore.read(d)
    assert (back.status, back.returncode) == ("succeeded", 1)


@pytest.mark.parametrize("content,why", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"id": "bad", "name": "n", "argv": ["x"], "env": {}, "cwd": "/", "log_path": "/x", "started_at": 1'
     + "0" * 400 + "}", "not a finite number"),
    (b"\xff\xfe\x00binary", "not UTF-8"),
])
def test_pathological_records_are_skipped_with_a_reason(tmp_path, content, why):
    jobstore.create(rec("good"), tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    path = bad / jobstore.RECORD
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    records, skipped = jobstore.list_records_checked(tmp_path)
    assert [r.id for r in records] == ["good"]
    assert [s.path for s in skipped] == [bad] and why in skipped[0].reason


def test_listing_a_missing_registry_writes_nothing(tmp_path):
    root = jobstore.jobs_root({"TUNE_MAGIC_HOME": str(tmp_path / "nothing")}, create=False)
    assert jobstore.list_records(root) == []
    assert not (tmp_path / "nothing").exists()


def test_job_dir_that_is_a_symlink_is_refused_and_never_followed(tmp_path):
    real = tmp_path / "elsewhere"
    real.mkdir()
    (real / jobstore.RECORD).write_text(json.dumps(rec("evil").to_dict()))
    root = tmp_path / "jobs"
    root.mkdir()
    (root / "evil").symlink_to(real)
    records, skipped = jobstore.list_records_checked(root)
    assert records == [] and "symbolic link" in skipped[0].reason
    with pytest.raises(jobstore.StateDirError, match="symbolic link"):
        jobstore.remove_tree(root / "evil")
    assert (real / jobstore.RECORD).exists()


def test_planted_lock_symlink_never_creates_a_file_outside(tmp_path):
    d = jobstore.create(rec("j"), tmp_path)
    outside = tmp_path / "outside" / "victim"
    outside.parent.mkdir()
    (d / jobstore.LOCK).symlink_to(outside)
    jobstore.update(d, error="boom")  # the link is replaced by a real lock file, never followed
    assert not outside.exists()
    assert not (d / jobstore.LOCK).is_symlink() and jobstore.read(d).error == "boom"


def test_procs_file_round_trip_and_damage(tmp_path):
    d = jobstore.create(rec("p"), tmp_path)
    assert jobstore.read_procs(d) == {}
    jobstore.write_procs(d, supervisor=ProcessRef(5, 1.0))
    jobstore.write_procs(d, agent=ProcessRef(6, 2.0), workers=[ProcessRef(7, 3.0, 0)])
    assert jobstore.read_procs(d) == {"supervisor": ProcessRef(5, 1.0), "agent": ProcessRef(6, 2.0),
                                      "workers": [ProcessRef(7, 3.0, 0)]}
    (d / jobstore.PROCS).write_text('{"agent": {"pid": -1')
    assert jobstore.read_procs(d) == {}


@pytest.mark.parametrize("content,expected", [
    (b" " * 128, None), (b'{"returncode": 0, "ended_at": 5.0}' + b" " * 90, jobstore.ExitInfo(0, 5.0)),
    (b'{"returncode": -9, "ended_at": 7.5}', jobstore.ExitInfo(-9, 7.5)), (b'{"returncode": "x"}', None),
    (b"garbage", None),
])
def test_exit_code_file(tmp_path, content, expected):
    d = jobstore.create(rec("e"), tmp_path)
    (d / jobstore.EXIT_CODE).write_bytes(content)
    assert jobstore.read_exit_code(d) == expected
