"""The tool's own errors: one exception tree; only user errors become UsageError / exit 2; -h on
every magic; a %%tune_run cell with nothing under it runs as %tune_run."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

import tune_magic
from tune_magic import errors
from tune_magic.ui import cli
from tune_magic import gpus
from tune_magic import job as jobctl
from tune_magic.job import launch as launcher
import tune_magic.job.launch as L
from tune_magic import errors
from tune_magic.ui.magics import empty_cell_to_line

from jobhelpers import toy_args


@pytest.mark.parametrize("exc,bases", [
    (errors.PlanError, (errors.UserError, errors.TuneMagicError, ValueError)),
    (errors.JobNotFound, (errors.UserError, errors.TuneMagicError, LookupError)),
    (errors.StateDirError, (errors.UserError, errors.TuneMagicError, ValueError)),
    (errors.JobStartError, (errors.TuneMagicError, RuntimeError)),
    (gpus.GpuError, (errors.PlanError, errors.UserError, ValueError)),
])
def test_each_public_exception_keeps_its_builtin_base(exc, bases):
    assert all(b in exc.__mro__ for b in bases)
    assert not issubclass(errors.JobStartError, errors.UserError)  # a start failure is not the user's fault
    assert getattr(tune_magic, exc.__name__, exc) is exc


def test_an_internal_bug_in_the_magic_keeps_its_traceback(ip, monkeypatch):
    def broken(*a, **kw):
        raise KeyError("internal")

    monkeypatch.setattr(launcher, "launch", broken)
    with pytest.raises(KeyError, match="internal"):
        ip.run_line_magic("tune_run", toy_args())
    monkeypatch.setattr(jobctl, "get_job", broken)
    with pytest.raises(KeyError):
        ip.run_line_magic("tune_logs", "x")


def test_an_internal_bug_in_the_cli_is_not_exit_2(monkeypatch):
    def broken(*a, **kw):
        raise KeyError("internal")

    monkeypatch.setattr(launcher, "launch", broken)
    with pytest.raises(KeyError):
        cli.main(["run", *toy_args().split()])


def test_user_errors_are_usage_errors_and_exit_2(ip, capsys):
    with pytest.raises(UsageError, match="unknown recipe"):
        ip.run_line_magic("tune_run", "no_such_recipe --config x")
    with pytest.raises(UsageError, match="no job"):
        ip.run_line_magic("tune_logs", "20990101-000000-abcdef")
    assert cli.main(["logs", "20990101-000000-abcdef"]) == 2
    assert "no job" in capsys.readouterr().err


@pytest.mark.parametrize("magic,line", [("tune_run", "-h"), ("tune_run", "--help"), ("tune_jobs", "-h"),
                                        ("tune_logs", "--help"), ("tune_stop", "-h"), ("tune_panel", "--help")])
def test_help_on_every_magic(ip, capsys, magic, line):
    assert ip.run_line_magic(magic, line) is None
    out = capsys.readouterr().out
    assert f"%{magic}" in out and "::" in out


def test_cell_magic_help(ip, capsys):
    assert ip.run_cell_magic("tune_run", "--help", "max_steps=3\n") is None
    assert "--scheduler" in capsys.readouterr().out


@pytest.mark.parametrize("lines,expected", [
    (["%%tune_run --dry-run x --config y\n"], ["%tune_run --dry-run x --config y\n"]),
    (["%%tune_run a b\n", "\n", "   \n"], ["%tune_run a b\n"]),
    (["  %%tune_run a"], ["%tune_run a\n"]),
    (["%%tune_run a\n", "lr=1\n"], ["%%tune_run a\n", "lr=1\n"]),  # a body: unchanged
    (["%%tune_runner a\n"], ["%%tune_runner a\n"]),  # another magic
    (["print(1)\n"], ["print(1)\n"]),
])
def test_empty_cell_transformer(lines, expected):
    assert empty_cell_to_line(list(lines)) == expected


def test_empty_cell_body_runs_like_the_line_magic(ip, capsys):
    result = ip.run_cell(f"%%tune_run --dry-run {toy_args('steps=3')}\n")
    assert result.error_in_exec is None and result.error_before_exec is None
    assert isinstance(result.result, tune_magic.LaunchPlan)
    assert "steps=3" in capsys.readouterr().out
    ip.run_line_magic("load_ext", "tune_magic")  # loading twice registers the transformer once
    names = [getattr(t, "__name__", "") for t in ip.input_transformers_cleanup]
    assert names.count("empty_cell_to_line") == 1


@pytest.mark.parametrize("visible,gpus,expected,warned", [
    ("2,3", "0,1", "2,3", False), (None, "0,1", "0,1", False), ("", "0", "0", True), ("2,3", "5", "5", True),
    ("GPU-aaaa,GPU-bbbb", "1", "GPU-bbbb", False),
])
def test_dry_run_shows_the_cuda_visible_devices_a_launch_would_give(monkeypatch, visible, gpus, expected, warned):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    plan = tune_magic.launch(toy_args(nproc=None), gpus=gpus, dry_run=True)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == expected
    assert any("would refuse them" in w for w in plan.warnings) == warned


@pytest.mark.parametrize("value,dry", [("1", True), ("yes", True), ("ON", True), ("0", False), ("", False),
                                       ("off", False)])
def test_dry_run_env_values(monkeypatch, value, dry):
    monkeypatch.setenv("TUNE_MAGIC_DRY_RUN", value)
    assert L.dry_run_requested() is dry


@pytest.mark.parametrize("value", ["2", "y", "enabled", "tru"])
def test_an_unknown_dry_run_value_fails_closed(monkeypatch, value):
    from tune_magic.registry import store as jobstore

    monkeypatch.setenv("TUNE_MAGIC_DRY_RUN", value)
    before = {r.id for r in jobstore.list_records()}
    with pytest.raises(errors.PlanError, match="TUNE_MAGIC_DRY_RUN"):
        tune_magic.launch(toy_args(nproc=None))
    assert {r.id for r in jobstore.list_records()} == before


@pytest.mark.parametrize("kw,words", [
    ({"args": None}, "give the tune run-style words"), ({"force": "no"}, "force='no': give True or False"),
    ({"dry_run": "no"}, "dry_run='no'"), ({"name": "x" * 5000}, "at most 1000"),
    ({"time_limit": "two hours", "scheduler": "slurm"}, "e.g. --time 2:00:00"),
])
def test_api_types_are_checked_before_anything_starts(kw, words):
    kw = {"args": toy_args(nproc=None), **kw}
    with pytest.raises(errors.PlanError, match=words):
        tune_magic.launch(kw.pop("args"), **kw)


@pytest.mark.parametrize("override,words", [
    ("output_dir=~/somewhere", "torchtune does not expand ~"),
    ("output_dir={home}/jobs/fake", "inside tune_magic's job registry"),
])
def test_directories_a_job_would_misuse_are_refused(override, words):
    import os

    override = override.format(home=os.environ["TUNE_MAGIC_HOME"])
    with pytest.raises(errors.PlanError, match=words):
        tune_magic.launch(toy_args(override, nproc=None))
    plan = tune_magic.launch(toy_args(override, nproc=None), dry_run=True)
    assert any(words in w for w in plan.warnings)


def test_dry_runs_of_one_cell_body_share_one_file():
    import tempfile
    from pathlib import Path

    d = Path(tempfile.gettempdir()) / "tune_magic_dry_run"
    before = set(d.iterdir()) if d.is_dir() else set()
    body = f"steps: 3\n# {id(before)}\n"  # a body no earlier run had
    plans = [tune_magic.launch(toy_args(nproc=None), dry_run=True, config_overlay=body) for _ in range(3)]
    assert len(set(d.iterdir()) - before) == 1
    assert len({p.config for p in plans}) == 1 and "steps: 3" in Path(plans[0].config).read_text()


@pytest.mark.parametrize("var,value,words", [("PET_NNODES", "2", "endpoint"), ("PET_NPROC_PER_NODE", "2", None)])
def test_pet_variables_alone_mean_torchrun(monkeypatch, var, value, words):
    monkeypatch.setenv(var, value)
    if words:
        with pytest.raises(errors.PlanError, match=words):
            tune_magic.build_plan(toy_args(nproc=None))
    else:
        plan = tune_magic.build_plan(toy_args(nproc=None))
        assert plan.distributed and plan.nproc_per_node == "2"


@pytest.mark.parametrize("nodes", ["２", "²", "1.5", ""])
def test_counts_take_ascii_digits_only(nodes):
    with pytest.raises(errors.PlanError, match="positive integer"):
        tune_magic.launch(toy_args(nproc=1), scheduler="slurm", nodes=nodes, dry_run=True)


def test_nproc_gpu_without_a_visible_gpu_is_refused_before_anything_starts(monkeypatch, tmp_path):
    # no nvidia-smi on PATH (this machine has no GPU): torchrun's agent would stop with "Cuda is not available."
    import os
    from pathlib import Path

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    root = Path(os.environ["TUNE_MAGIC_HOME"]) / "jobs"
    before = set(root.iterdir()) if root.is_dir() else set()
    with pytest.raises(errors.PlanError, match=r"--nproc_per_node gpu .*nvidia-smi lists no GPU.*--nproc_per_node 2"):
        tune_magic.launch("--nproc_per_node gpu " + toy_args("steps=1", nproc=None))
    assert (set(root.iterdir()) if root.is_dir() else set()) == before  # no job directory, no process
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(errors.PlanError, match="CUDA_VISIBLE_DEVICES='' lets this kernel use no GPU"):
        tune_magic.launch("--nproc_per_node gpu " + toy_args("steps=1", nproc=None))
    plan = tune_magic.launch("--nproc_per_node gpu " + toy_args("steps=1", nproc=None), dry_run=True)
    assert plan.nproc_per_node == "gpu"  # a dry run (for a GPU machine) stays buildable here
