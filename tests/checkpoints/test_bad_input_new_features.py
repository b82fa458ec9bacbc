"""Bad input to validation, export, generation and the CLI, found by trying the features as a careless
user would (a breaker's session): each is refused with a message naming the fix, before anything
starts and with nothing registered; none is a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tune_magic.checkpoints.catalog import CheckpointError
from tune_magic.checkpoints.export import export_checkpoint
from tune_magic.ui import cli

from ckptfolders import write_epoch

FULL = "full"


def _cmd(capsys, *words) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["cmd", *words])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("override, said", [
    ("batch_size_val=${nope}", "batch_size_val (or a key it interpolates) cannot be resolved: Interpolation key 'nope' "
                               "not found; fix the value"),
    ("batch_size=${nope}", "batch_size_val (or a key it interpolates) cannot be resolved"),  # its default ${batch_size}
    ("run_val_every_n_steps=${nope}", "run_val_every_n_steps (or a key it interpolates) cannot be resolved"),
    ("dataset_val=null", "dataset_val._component_ is None, which is not a dataset: give a dataset node with a "
                         "_component_"),
])
def test_validation_keys_that_cannot_work_are_refused_by_cmd(job_registry, capsys, override, said):
    code, err = _cmd(capsys, "lora_finetune", "--config", "tiny/lora_val", override)
    assert code == 2 and said in err, err
    assert "Traceback" not in err and list(job_registry.iterdir()) == []


@pytest.mark.parametrize("words, said", [
    (["--val-split", "0.1", "generate", "--config", "generation"],
     "--val-split 0.1: recipe generate validates neither in its loop nor by saving checkpoints"),
    (["generate", "--config", "generation", "run_val_every_n_steps=3"],
     "run_val_every_n_steps=3: recipe generate validates neither in its loop nor by saving checkpoints"),
    (["--val-split", "0.1", "lora_finetune", "--config", "tiny/lora_val"],
     "drop --val-split (the config's dataset_val is used), or use a config without dataset_val"),
])
def test_a_recipe_that_cannot_validate_is_told_first(job_registry, capsys, words, said):
    """The reason given is the one that holds (before: 'the config's dataset is not one dataset' for
    generate, then a refusal of the dataset_val it advised; '~dataset_val', which 0.6.1 cannot do)."""
    code, err = _cmd(capsys, *words)
    assert code == 2 and said in err, err
    assert "~dataset_val" not in err and "give dataset_val yourself" not in err


def test_run_has_no_dry_run_and_says_which_command_does(job_registry, capsys):
    capsys.readouterr()
    assert cli.main(["run", "--dry-run", "lora_finetune", "--config", "tiny/lora"]) == 2
    err = capsys.readouterr().err
    assert "tune-magic run has no --dry-run: tune-magic cmd with the same words prints what it would run" in err
    assert "node-rank" not in err and list(job_registry.iterdir()) == []


@pytest.mark.parametrize("where, said", [
    (lambda tmp: Path("/proc/tune_magic_export"), "cannot write the export into /proc"),
    (lambda tmp: tmp / "afile" / "sub", "cannot write the export into"),
    (lambda tmp: tmp / "out" / "epoch_7", "is where the job keeps its checkpoints"),
    (lambda tmp: tmp / "out" / "recipe_state" / "x", "is where the job keeps its checkpoints"),
])
def test_an_export_destination_that_cannot_or_must_not_be_written_is_refused(tmp_path, where, said):
    src = write_epoch(tmp_path / "out", 0, FULL)
    (tmp_path / "afile").write_text("a file")
    dest = where(tmp_path)
    with pytest.raises(CheckpointError, match=said):
        export_checkpoint(src, dest)
    assert not (tmp_path / "out" / "epoch_7").exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["epoch_0"]


def test_an_export_beside_the_checkpoints_under_another_name_is_allowed(tmp_path):
    src = write_epoch(tmp_path / "out", 0, FULL)
    result = export_checkpoint(src, tmp_path / "out" / "hf_export")
    assert result.dest == tmp_path / "out" / "hf_export" and (result.dest / "config.json").is_file()


@pytest.mark.parametrize("dest", [None, 3.5, ["/tmp/x"], b"/tmp/x", "", "  "])
def test_job_export_takes_a_path_only(job_registry, dest):
    from tune_magic.job.checkpoints import export_of

    with pytest.raises(CheckpointError, match=r"give the export's folder as a path \(a str or pathlib.Path\)"):
        export_of(object(), dest)


def test_on_text_that_is_not_callable_is_refused_before_any_process_starts(job_registry, monkeypatch):
    from tune_magic.errors import PlanError
    from tune_magic.job import generators

    monkeypatch.setattr(generators, "choose_checkpoint", lambda *a, **k: pytest.fail("got past the checks"))
    with pytest.raises(PlanError, match=r"on_text=3: give a function called with each new piece of text"):
        generators.generate(object(), "hi", on_text=3)


def test_checkpoints_of_a_job_without_any_says_why(job_registry, capsys):
    from tune_magic.registry import store as jobstore
    from tune_magic.registry.store import JobRecord

    d = job_registry / "20261205-100000-aaaaaa"
    d.mkdir()
    (d / "output.log").write_text("")
    jobstore.write_record(d, JobRecord(
        id=d.name, name="short", argv=["python", "r.py"], env={}, cwd=str(job_registry.parent), started_at=1.0,
        ended_at=2.0, log_path=str(d / "output.log"), status="stopped", returncode=-15,
        output_dir=str(job_registry.parent / "runs" / "short")))
    capsys.readouterr()
    assert cli.main(["checkpoints", d.name]) == 0
    assert capsys.readouterr().out == f"job {d.name} has no checkpoints: it ended (stopped) without saving one\n"
    assert cli.main(["checkpoints", d.name, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
