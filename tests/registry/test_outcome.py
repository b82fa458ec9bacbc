"""The one outcome rule (tune_magic.registry.outcome.decide), row by row: what each kind of evidence
ends a job as. The same rows run as real jobs on both schedulers in tests/e2e/test_outcome_table.py
and tests/slurm/test_slurm_outcome.py."""

from __future__ import annotations

import pytest

from tune_magic.registry.outcome import (CANCELLED_OUTSIDE, FAILED_RESUME, STOPPED_AFTER_END, Evidence, Outcome, decide,
                                         exit_text)
from tune_magic.registry.status import Status

S, F, X, U = Status.SUCCEEDED, Status.FAILED, Status.STOPPED, Status.UNKNOWN
LINE = "rank 1: RuntimeError: boom"
RESUME_LINE = "Failed to load distributed checkpoint: bad. Training will start from the base checkpoint."


@pytest.mark.parametrize("evidence, outcome", [
    # no stop asked
    (Evidence(returncode=0), Outcome(S, None, 0)),
    (Evidence(returncode=1, failure_line=LINE), Outcome(F, LINE, 1)),
    (Evidence(returncode=3), Outcome(F, "exited with code 3", 3)),
    (Evidence(returncode=-9), Outcome(F, "killed by SIGKILL", -9)),
    (Evidence(returncode=-15), Outcome(X, CANCELLED_OUTSIDE, -15)),  # a one-process job someone SIGTERMed
    (Evidence(returncode=1, signalled=15), Outcome(X, CANCELLED_OUTSIDE, 1)),  # torchrun's agent got SIGTERM
    (Evidence(returncode=143, failure_line=LINE), Outcome(F, LINE, 143)),  # srun's 128+15 after a rank failed
    (Evidence(verdict="cancelled"), Outcome(X, CANCELLED_OUTSIDE, None)),
    (Evidence(verdict="completed"), Outcome(S, None, 0)),
    (Evidence(verdict="timeout", verdict_reason="hit the --time limit 10"), Outcome(F, "hit the --time limit 10")),
    (Evidence(returncode=1, verdict="timeout", verdict_reason="hit the --time limit 10", signalled=15),
     Outcome(F, "hit the --time limit 10", 1)),  # the engine's own word beats the signal it sent
    (Evidence(verdict="node_fail"), Outcome(F, "node fail")),
    (Evidence(returncode=0, verdict="node_fail", verdict_reason="NODE_FAIL: a node of the job failed"),
     Outcome(F, "NODE_FAIL: a node of the job failed", 0)),  # srun exits 0 when a node of its step fails
    (Evidence(verdict="failed", failure_line=LINE), Outcome(F, LINE)),
    # a stop asked before the end
    (Evidence(returncode=1, stop_requested=True), Outcome(X, None, 1)),
    (Evidence(returncode=0, stop_requested=True), Outcome(X, None, 0)),  # a recipe that saves and exits 0
    # ... after training ended (its last step and the save after it were logged): succeeded, whatever
    # the exit code (torchrun's agent exits 1 once a signal reached it; a worker killed in its teardown)
    (Evidence(returncode=0, stop_requested=True, finished_at_stop=True), Outcome(S, STOPPED_AFTER_END, 0)),
    (Evidence(returncode=1, stop_requested=True, finished_at_stop=True), Outcome(S, STOPPED_AFTER_END, 1)),
    (Evidence(returncode=-15, stop_requested=True, finished_at_stop=True), Outcome(S, STOPPED_AFTER_END, -15)),
    (Evidence(verdict="cancelled", stop_requested=True, finished_at_stop=True), Outcome(S, STOPPED_AFTER_END, None)),
    (Evidence(nothing_runs=True, stop_requested=True, finished_at_stop=True), Outcome(S, STOPPED_AFTER_END)),
    (Evidence(returncode=1, stop_requested=False, finished_at_stop=True, failure_line=LINE), Outcome(F, LINE, 1)),
    (Evidence(verdict="cancelled", stop_requested=True), Outcome(X, None, None)),
    (Evidence(verdict="failed", stop_requested=True), Outcome(X, None, None)),  # our stop's signal: 22.05 says FAILED
    # a resume whose recipe trained from the base model instead (rule 4)
    (Evidence(returncode=0, failed_resume=RESUME_LINE), Outcome(F, f"{FAILED_RESUME}: {RESUME_LINE}", 0)),
    (Evidence(verdict="completed", failed_resume=RESUME_LINE), Outcome(F, f"{FAILED_RESUME}: {RESUME_LINE}", 0)),
    (Evidence(returncode=0, stop_requested=True, failed_resume=RESUME_LINE), Outcome(X, None, 0)),
    (Evidence(returncode=1, failure_line=LINE, failed_resume=RESUME_LINE), Outcome(F, LINE, 1)),  # the crash says why
    # no exit code, no verdict
    (Evidence(nothing_runs=True), Outcome(U)),
    (Evidence(nothing_runs=True, stop_requested=True), Outcome(X)),
])
def test_each_kind_of_evidence_ends_the_job_as_the_rule_says(evidence, outcome):
    assert decide(evidence) == outcome


@pytest.mark.parametrize("evidence", [
    Evidence(),  # nothing known yet: the job may run
    Evidence(stop_requested=True),  # asked, but processes may still run
    Evidence(nothing_runs=True, answered=False),  # the engine did not answer: no news
    Evidence(nothing_runs=True, stop_requested=True, answered=False),
])
def test_no_news_ends_nothing(evidence):
    assert decide(evidence) is None


def test_an_unknown_verdict_is_a_programming_error_and_exit_text_reads_signals():
    with pytest.raises(ValueError, match="verdict"):
        Evidence(verdict="exploded")
    assert (exit_text(2), exit_text(-9), exit_text(-99)) == ("exited with code 2", "killed by SIGKILL",
                                                            "killed by signal 99")
