"""What a resume launches again, read from a record's fields or, for records of earlier releases,
from its command (tune_magic.checkpoints.relaunch). Pure."""

from __future__ import annotations

import pytest

from tune_magic.errors import PlanError
from tune_magic.checkpoints.relaunch import given_torchrun_options, original_overrides, relaunch_argv

PY = "/venv/bin/python"
ARGV = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--redirects", "3",
        "--log-dir", "/home/jobs/j1/ranks", "/r/recipe.py", "--config", "/r/cfg.yaml", "epochs=3", "output_dir=/o/j1"]


def test_overrides_recorded_or_read_back_after_the_config():
    assert original_overrides(ARGV, "/r/cfg.yaml", None) == ["epochs=3", "output_dir=/o/j1"]
    assert original_overrides(ARGV, "/r/cfg.yaml", ["x=1"]) == ["x=1"]
    assert original_overrides([PY, "/r/recipe.py", "--config", "/r/cfg.yaml"], "/r/cfg.yaml", None) == []
    # a --config inside the overrides' values does not confuse it: the pair naming the config counts
    assert original_overrides([PY, "r.py", "--config", "/c.yaml", "note=--config"], "/c.yaml", None) == ["note=--config"]


def test_torchrun_options_without_what_the_launch_added():
    assert given_torchrun_options(ARGV, "/r/recipe.py", None, rendezvous="standalone", job_dir="/home/jobs/j1") == [
        "--nproc_per_node", "2", "--redirects", "3"]
    # the user's own log dir and endpoint stay; a recorded list wins
    argv = [PY, "-m", "torch.distributed.run", "--rdzv-endpoint", "h:29400", "--log-dir=/mine", "/r/recipe.py"]
    assert given_torchrun_options(argv, "/r/recipe.py", None, rendezvous="user", job_dir="/home/jobs/j1") == [
        "--rdzv-endpoint", "h:29400", "--log-dir=/mine"]
    assert given_torchrun_options(ARGV, "/r/recipe.py", ["--nnodes", "1"], rendezvous="standalone",
                                  job_dir="/x") == ["--nnodes", "1"]
    assert given_torchrun_options([PY, "/r/recipe.py"], "/r/recipe.py", None, rendezvous=None, job_dir="/x") == []


def test_relaunch_argv_replaces_the_trailing_overrides_only():
    new = relaunch_argv(ARGV, ["epochs=3", "output_dir=/o/j1"], ["epochs=3", "output_dir=/o/j1", "resume=1"])
    assert new == ARGV + ["resume=1"]
    assert relaunch_argv([PY, "r.py"], [], ["a=1"]) == [PY, "r.py", "a=1"]
    with pytest.raises(PlanError, match="does not end with its recorded overrides"):
        relaunch_argv(ARGV, ["epochs=4"], [])


def test_the_next_attempts_command_for_a_requeued_batch_script(tmp_path, monkeypatch):
    """``python -m tune_magic.checkpoints.relaunch JOB_DIR``: the command that continues from the last
    checkpoint, or (``--from-start-if-none``) from the beginning when none was saved."""
    import json
    import subprocess
    import sys

    from resumehelpers import fake_job, toy_checkpoint

    root = tmp_path / "jobs"
    out = tmp_path / "out"
    out.mkdir()
    rec = fake_job(root, "j", out)

    def run(*flags):
        p = subprocess.run([sys.executable, "-m", "tune_magic.checkpoints.relaunch", str(root / "j"), *flags],
                           capture_output=True, text=True, timeout=60)
        return p.returncode, json.loads(p.stdout)

    code, data = run()
    assert code == 3 and data["argv"] is None and data["summary"].startswith("nothing to resume from")
    code, data = run("--from-start-if-none")
    assert code == 0 and data["argv"] == rec.argv and data["resumed_from"] is None
    assert data["summary"].startswith("from the beginning: nothing to resume from")
    toy_checkpoint(out)
    code, data = run("--from-start-if-none")
    assert code == 0 and data["resumed_from"] == {"checkpoint": "epoch_0/", "epoch": 0, "step": 2}
    assert data["argv"] == rec.argv + ["resume_from_checkpoint=True",
                                       "checkpointer.checkpoint_files=[epoch_0/model-00001-of-00001.safetensors]",
                                       "checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt"]
    assert data["overrides"][-3:] == data["argv"][-3:] and data["summary"].startswith("Resume toy_recipe from epoch_0/")
    p = subprocess.run([sys.executable, "-m", "tune_magic.checkpoints.relaunch", str(tmp_path / "nope")], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "cannot read the job's record" in p.stderr
