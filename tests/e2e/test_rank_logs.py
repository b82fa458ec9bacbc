"""--redirects/--tee end to end: the plan puts torchrun's per-rank files in <job dir>/ranks, the
follower finds the progress and metrics there, and the failure reason comes from the rank's file."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tune_magic.job.launch import build_plan
from tune_magic.logs.failure import describe_failure
from tune_magic.logs.metricfollow import JobMetricsFollower
from tune_magic.logs.logfiles import rank_log_files, read_rank_logs

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def run_plan(plan, log: Path, cwd: Path) -> int:
    with open(log, "wb") as out:
        return subprocess.run(plan.argv, cwd=cwd, env={**os.environ, **plan.env}, stdin=subprocess.DEVNULL,
                              stdout=out, stderr=subprocess.STDOUT, timeout=180).returncode


def test_redirected_job_is_followed_through_its_rank_files(tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    plan = build_plan(["--redirects", "3", "--nproc-per-node", "2", str(RECIPES / "toy_recipe.py"), "--config",
                       str(RECIPES / "toy.yaml"), "steps=3", "step_s=0.05", "crash_rank=1",
                       "crash_message=rank one fails in its own file", f"output_dir={tmp_path}/out"],
                      cwd=tmp_path, job_dir=str(job_dir))
    assert plan.rank_log_dir == f"{job_dir}/ranks"
    log = job_dir / "output.log"
    assert run_plan(plan, log, tmp_path) == 1
    files = rank_log_files(plan.rank_log_dir)
    assert {(f.local_rank, f.stream) for f in files} == {(0, "stdout"), (0, "stderr"), (1, "stdout"), (1, "stderr")}

    # the combined log holds only torchrun's report; the reason is in rank 1's stderr file
    text = log.read_text()
    assert "rank one fails" not in text.split("Root Cause")[0]
    assert describe_failure(text).line == "rank 1: exited with code 1"
    reason = describe_failure(text, rank_logs=read_rank_logs(plan.rank_log_dir))
    assert (reason.line, reason.kind, reason.rank, reason.exc_type) == (
        "rank 1: RuntimeError: rank one fails in its own file", "exception", 1, "RuntimeError")

    # rank 0 runs its 3 steps (it meets rank 1 only in the final barrier); its bar and the
    # "Writing logs to" line naming its DiskLogger file are only in its own files
    with JobMetricsFollower(log, rank_log_dir=plan.rank_log_dir, cwd=tmp_path) as job:
        job.finish()
        assert job.latest_progress.startswith("1|3|Loss: 3.3333333333333335: 100%|")
        assert job.metrics_path is not None and job.metrics_path.parent == tmp_path / "out" / "logs"
        assert [(p.step, p.name, p.value) for p in job.points() if p.name == "loss"] == [
            (1, "loss", 10.0), (2, "loss", 5.0), (3, "loss", 10.0 / 3)]
        assert any(label == "rank 1 stderr" and lines[-1] == "[rank1]: RuntimeError: rank one fails in its own file"
                   for label, lines in job.log_sections())
