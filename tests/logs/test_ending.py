"""What a job's own files say about its end (tune_magic.logs.endevidence): here, the failed-resume line of a
resumed run, found in a log of any size from the current attempt on."""

from __future__ import annotations

import time

import pytest

from tune_magic.logs import endevidence as ending
from tune_magic.registry.store import JobRecord

LINE = ("[rank0]:WARNING:torchtune.utils._logging:Failed to load distributed checkpoint: shape mismatch. "
        "Training will start from the base checkpoint.")


def record(log, *argv, attempts=()):
    return JobRecord(id="j", name="n", argv=["python", "r.py", "--config", "c.yaml", *argv], env={}, cwd="/",
                     log_path=str(log), started_at=time.time(), attempts=list(attempts))


@pytest.mark.parametrize("chunk", [4 << 20, 7, 64])
def test_the_line_is_found_whole_wherever_the_chunks_cut_it(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(ending, "_SCAN_BYTES", chunk)
    log = tmp_path / "output.log"
    bar = "1|3|Loss: 2.5:  50%|█████     | 1/2 [00:01<00:01,  2.00it/s]"
    log.write_text("x" * 5000 + "\n" + f"\r{bar}\r{bar}\n" + LINE + "\n" + "y" * 300 + "\n")
    assert ending.failed_resume_line(log) == LINE
    assert ending.failed_resume_line(log, since=log.stat().st_size - 100) is None  # before this attempt
    assert ending.failed_resume_line(tmp_path / "missing.log") is None


def test_only_a_resumed_run_that_exited_0_is_searched_and_the_attempts_log_offset_counts(tmp_path):
    log = tmp_path / "output.log"
    log.write_text(LINE + "\n" + "z" * 50 + "\n")
    resumed = record(log, "resume_from_checkpoint=True")
    ev, _ = ending.evidence(tmp_path, resumed, 0, nothing_runs=True)
    assert ev.failed_resume == LINE
    assert ending.evidence(tmp_path, record(log), 0, nothing_runs=True)[0].failed_resume is None  # not a resume
    later = record(log, "resume_from_checkpoint=true", attempts=[
        {"number": 1, "started_at": 1.0, "ended_at": 2.0}, {"number": 2, "started_at": 3.0, "log_offset": len(LINE) + 1}])
    assert ending.evidence(tmp_path, later, 0, nothing_runs=True)[0].failed_resume is None  # attempt 1's line
    assert ending.is_resume(later) and not ending.is_resume(record(log, "resume_from_checkpoint=False"))


@pytest.mark.parametrize("epochs, cut, finished", [
    (1, None, True),  # the whole log: last step, its save, then torchrun's SIGTERM traceback
    (2, None, False),  # the config asked for 2 epochs: the save was the end of epoch 1 only
    (1, "INFO:torchtune.utils._logging:Saving checkpoint took", False),  # the stop came before the save ended
    (None, None, False),  # epochs unknown: never taken for finished on a guess
])
def test_a_stop_that_reached_the_job_after_training_ended_leaves_it_succeeded(tmp_path, epochs, cut, finished):
    """tests/data/stop_after_save_torchrun.log: the toy recipe under torchrun (2 processes, 3 steps,
    its save, then lingering), stopped once it printed 'toy recipe done'; torchrun's agent exits 1.
    The stop was recorded while the log did not show it yet (finished_at_stop False): the log at the
    job's end decides."""
    from jobhelpers import DATA
    from tune_magic.registry.outcome import STOPPED_AFTER_END, decide
    from tune_magic.registry.status import Status

    text = (DATA / "stop_after_save_torchrun.log").read_text()
    log = tmp_path / "output.log"
    log.write_text(text if cut is None else text[:text.index(cut)])
    rec = record(log)
    rec.epochs, rec.stop_requested, rec.finished_at_stop = epochs, True, False
    ev, reason = ending.evidence(tmp_path, rec, 1, nothing_runs=True)
    assert (ev.stop_requested, ev.finished_at_stop, reason) == (True, finished, None)
    end = decide(ev)
    assert (end.status, end.reason, end.returncode) == (
        (Status.SUCCEEDED, STOPPED_AFTER_END, 1) if finished else (Status.STOPPED, None, 1))


def test_the_record_failure_json_and_logs_error_of_a_real_instantiation_error(job_registry, capsys):
    """The captured one-process InstantiationError log (tests/data/instantiation_error.log), ended
    as the supervisor ends a job: the record's reason, failure.json and ``tune-magic logs --error``
    all name the exception (they used to say only "exited with code 1")."""
    import json

    from jobhelpers import DATA
    from tune_magic.registry import store as jobstore
    from tune_magic.registry.outcome import decide
    from tune_magic.ui import cli

    d = job_registry / "20261203-074906-4533ff"
    d.mkdir()
    log = d / "output.log"
    log.write_text((DATA / "instantiation_error.log").read_text())
    rec = record(log)
    rec.id, rec.started_at = d.name, 1.0
    jobstore.write_record(d, rec)
    ev, reason = ending.evidence(d, rec, 1, nothing_runs=True)
    ending.keep_failure(d, reason)
    with jobstore.locked(d) as locked:
        for key, value in ending.changes(decide(ev), locked, 2.0).items():
            locked.set_status(value) if key == "status" else setattr(locked, key, value)
    line = ("rank 0: torchtune.config._errors.InstantiationError: Error loading 'torchtune.utils.metric_logging."
            "DiskLogger': ModuleNotFoundError(\"No module named 'torchtune.utils.metric_logging'\")")
    assert jobstore.read(d).error == line
    saved = json.loads((d / "failure.json").read_text())
    assert (saved["line"], saved["exc_type"], saved["kind"]) == (line, "torchtune.config._errors.InstantiationError",
                                                                 "exception")
    capsys.readouterr()
    assert cli.main(["logs", "--error", d.name]) == 0
    out = capsys.readouterr().out
    assert out.startswith(line + "\n") and "Are you sure that 'metric_logging' is importable" in out
