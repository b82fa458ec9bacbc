"""Failure reasons read from real torchrun logs (captured into tests/data from real runs here)."""

from pathlib import Path

from tune_magic.failure import describe_failure

DATA = Path(__file__).parent / "data"


def test_rank1_crash_names_rank_and_message():
    # captured: 2-process toy recipe, rank 1 raised RuntimeError("boom on rank one")
    assert describe_failure((DATA / "torchrun_rank1_crash.log").read_text()) == "rank 1: RuntimeError: boom on rank one"


def test_agent_eaddrinuse_names_it():
    # captured: second torchrun on the same --master_port
    reason = describe_failure((DATA / "torchrun_eaddrinuse.log").read_text())
    assert reason.startswith("torch.distributed.DistNetworkError: ")
    assert "EADDRINUSE" in reason and "port: 29511" in reason


def test_root_cause_without_message_gives_exit_code():
    log = """Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_20:33:36
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 4462)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4462
============================================================
"""
    assert describe_failure(log) == "rank 3: Signal 9 (SIGKILL) received by PID 4462"


def test_one_process_traceback():
    log = "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'model'\n"
    assert describe_failure(log) == "KeyError: 'model'"


def test_no_failure_in_log():
    assert describe_failure("1|3|Loss: 2.0\nall good\n") is None
