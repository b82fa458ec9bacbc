"""Validation loss through the product (issue 28): real tiny jobs on CPU launched by
``tune_magic.launch``, ``tune_magic.sweep``, ``%%tune_run`` and ``tune-magic run``.

Every value a job reports is compared, within 1e-4 relative, with :mod:`valreference` (computed
from each ``epoch_N/`` folder's files alone, sharing no code with ``recipes/``):

* bad validation input is refused before anything starts, naming the fix, with nothing registered;
* tune_magic's own recipes validate in their loop (``full_finetune`` on 2 processes, ``lora_finetune``
  on 1): a point at every expected step, the epoch-end ones equal to the reference of that epoch's
  checkpoint, no evaluation job;
* torchtune 0.6.1's unmodified recipes get one evaluation job per checkpoint, listed like any job,
  each point at its save step equal to the reference (full, LoRA merged, LoRA adapter-only); an
  evaluation that fails leaves the training job as it was and shows with its error;
* a 2 x 2 sweep is ranked by validation loss in every view (here the trial with the lowest final
  loss is another one), and a sweep of torchtune's recipes is waited for until its evaluations end.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from IPython.core.error import UsageError

import tune_magic
from tune_magic.assets import AssetPaths
from tune_magic.checkpoints.validation import read_result
from tune_magic.errors import PlanError
from tune_magic.registry import store as jobstore
from tune_magic.sweeping import store as sweepstore
from valreference import reference_for_folder, val_examples

pytestmark = pytest.mark.e2e

REL = 1e-4
EPOCHS, STEPS = 3, 4  # 3 epochs of 4 optimizer steps: checkpoints saved at steps 4, 8, 12
SAVE_STEPS = [STEPS * (e + 1) for e in range(EPOCHS)]
TIMEOUT = 600


@pytest.fixture(scope="module")
def assets(tiny_assets) -> AssetPaths:
    return tiny_assets


@pytest.fixture(scope="module")
def examples(assets, tmp_path_factory):
    return val_examples(assets, tmp_path_factory.mktemp("hf"))


def assert_close(got: float, want: float, what: str) -> None:
    assert abs(got - want) <= REL * abs(want), f"{what}: {got} vs reference {want} (rel {abs(got - want) / want:.2e})"


def registry_state() -> tuple:
    """What a launch would leave: the jobs listed, every entry of jobs/ (staging folders too),
    every sweep, and the runs/ folders of the tiny configs."""
    home = Path(os.environ["TUNE_MAGIC_HOME"])
    entries = lambda d: sorted(os.listdir(d)) if d.is_dir() else []  # noqa: E731
    runs = sorted(str(p.relative_to(home)) for p in (home / "runs").glob("*/*")) if (home / "runs").is_dir() else []
    return ({j.id for j in tune_magic.jobs()}, entries(jobstore.jobs_root(create=False)),
            entries(sweepstore.sweeps_root()), runs)


def evaluation_jobs(job) -> list:
    """The registry's jobs evaluating ``job``'s checkpoints, by epoch."""
    found = [j for j in tune_magic.jobs() if (j.record.evaluates or {}).get("job") == job.id]
    return sorted(found, key=lambda j: j.record.evaluates["epoch"])


def timed(what: str):
    start = time.perf_counter()
    return lambda: print(f"{what}: {time.perf_counter() - start:.1f} s")


# -- bad input: refused before anything starts ------------------------------------------------------

def _tiny_data(tmp_path: Path, assets: AssetPaths, n: int) -> Path:
    path = tmp_path / f"tiny{n}.json"
    path.write_text(json.dumps(json.loads(assets.dataset_path.read_text())[:n]))
    return path


VAL_NODE = ("dataset_val._component_=torchtune.datasets.instruct_dataset dataset_val.source=json "
            "dataset_val.column_map.input=instruction dataset_val.column_map.output=output")
BAD = {  # name -> (args, launch keywords, substrings of the message)
    "missing data file": (f"lora_finetune --config tiny/lora {VAL_NODE} dataset_val.data_files={{tmp}}/nope.json", {},
                          ["dataset_val cannot be built", "nope.json", "check dataset_val's data_files",
                           "Nothing was started"]),
    "unknown component": ("lora_finetune --config tiny/lora_val dataset_val._component_=torchtune.datasets.no_such", {},
                          ["No module named 'torchtune.datasets.no_such'", "check dataset_val._component_: a dotted path"]),
    "column_map the data lacks": ("lora_finetune --config tiny/lora_val dataset_val.column_map.input=nope", {},
                                  ["KeyError: 'nope'", "column_map names a column its data lacks"]),
    "run_val_every_n_steps alone": ("lora_finetune --config tiny/lora run_val_every_n_steps=2", {},
                                    ["run_val_every_n_steps=2 is set but dataset_val is not: add a dataset_val",
                                     "--val-split 0.1"]),
    "val-split 0": ("lora_finetune --config tiny/lora", {"val_split": 0}, ["--val-split 0: give the fraction", "between 0 and 1"]),
    "val-split 1": ("lora_finetune --config tiny/lora", {"val_split": 1}, ["--val-split 1: give the fraction"]),
    "val-split 1.5": ("lora_finetune --config tiny/lora", {"val_split": 1.5}, ["--val-split 1.5: give the fraction"]),
    "val-split 0.125": ("lora_finetune --config tiny/lora", {"val_split": 0.125},
                        ["splits datasets by whole percents; give e.g. --val-split 0.12"]),
    "val-split of a slice": ("lora_finetune --config tiny/lora dataset.split=train[:50%]", {"val_split": 0.1},
                             ["the dataset's split 'train[:50%]' is already a slice; give dataset_val yourself"]),
    "val-split beside dataset_val": ("lora_finetune --config tiny/lora_val", {"val_split": 0.1},
                                     ["--val-split 0.1 and the config's dataset_val both say what to validate on",
                                      "drop --val-split (the config's dataset_val is used), or use a config "
                                      "without dataset_val"]),
    "val-split leaving no example": ("lora_finetune --config tiny/lora dataset.data_files={tiny3}", {"val_split": 0.1},
                                     ["corresponds to no data", "the validation set is empty: give it data"]),
    "a recipe that saves no checkpoint": ("generate --config tiny/lora_val", {},
                                          ["recipe generate validates neither in its loop nor by saving checkpoints",
                                           "remove dataset_val"]),
}


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("case", list(BAD))
def test_bad_validation_input_is_refused_before_anything_starts(case, assets, tmp_path):
    args, keywords, parts = BAD[case]
    args = args.format(tmp=tmp_path, tiny3=_tiny_data(tmp_path, assets, 3))
    before = registry_state()
    done = timed(case)
    with pytest.raises(PlanError) as info:
        tune_magic.launch(args, cwd=tmp_path, **keywords)
    done()
    for part in parts:
        assert part in str(info.value), str(info.value)
    assert registry_state() == before


@pytest.mark.timeout(TIMEOUT)
def test_bad_validation_input_through_the_magic_the_cli_and_a_sweep(ip, assets, tmp_path):
    before = registry_state()
    with pytest.raises(UsageError, match=r"--val-split 0\.125: Hugging Face splits datasets by whole percents"):
        ip.run_line_magic("tune_run", "--val-split 0.125 lora_finetune --config tiny/lora")
    body = (f"dataset_val:\n  _component_: torchtune.datasets.instruct_dataset\n  source: json\n"
            f"  data_files: {tmp_path}/gone.json\n  column_map: {{input: instruction, output: output}}\n")
    with pytest.raises(UsageError, match=r"dataset_val cannot be built .*gone\.json.*check dataset_val's data_files"):
        ip.run_cell_magic("tune_run", "lora_finetune --config tiny/lora", body)
    with pytest.raises(UsageError, match="run_val_every_n_steps=3 is set but dataset_val is not"):
        ip.run_cell_magic("tune_run", "--sweep lora_finetune --config tiny/lora seed=1,2", "run_val_every_n_steps=3\n")
    with pytest.raises(PlanError, match="column_map names a column its data lacks"):
        tune_magic.sweep("lora_finetune --config tiny/lora_val seed=1,2 dataset_val.column_map.input=nope", cwd=tmp_path)
    cli_cases = [(["--val-split", "1.5", "lora_finetune", "--config", "tiny/lora"],
                  "--val-split 1.5: give the fraction of the training data to hold out"),
                 (["--val-split", "0.1", "lora_finetune", "--config", "tiny/lora", "dataset.split=train[:50%]"],
                  "the dataset's split 'train[:50%]' is already a slice"),
                 (["lora_finetune", "--config", "tiny/lora_val", "dataset_val.column_map.input=nope"],
                  "column_map names a column its data lacks")]
    for argv, part in cli_cases:
        r = subprocess.run([sys.executable, "-m", "tune_magic", "run", *argv], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
        assert (r.returncode, r.stdout) == (2, ""), r
        assert r.stderr.startswith("tune-magic run: error: ") and part in r.stderr, r.stderr
        assert "\n" not in r.stderr.strip() and "Traceback" not in r.stderr  # one paragraph
    assert registry_state() == before


# -- tune_magic's own recipes: in the loop ----------------------------------------------------------

def _in_loop_checks(job, every: int, assets, examples) -> dict[int, float]:
    """The job validated in its loop at every ``every`` steps and each epoch's end; its epoch-end
    values are the reference of that epoch's checkpoint; no evaluation. Returns step -> val_loss."""
    assert job.record.validation == {"mode": "in_loop", "every_n_steps": every}
    points = job.validation_points()
    val = {p.step: p.value for p in points}
    assert len(val) == len(points) and all(p.source != "evaluation" for p in points)
    assert sorted(val) == sorted(set(range(every, EPOCHS * STEPS + 1, every)) | set(SAVE_STEPS))
    for epoch, step in enumerate(SAVE_STEPS):
        assert_close(val[step], reference_for_folder(Path(job.output_dir) / f"epoch_{epoch}", assets, examples),
                     f"epoch {epoch}")
    s = job.val_summary()
    best_step = min(val, key=lambda k: (val[k], k))
    assert (s.latest, s.latest_step, s.best, s.best_step, s.pending, s.failed) == (
        val[12], 12, val[best_step], best_step, 0, 0)
    assert job.evaluations() == [] and evaluation_jobs(job) == []
    assert not (job.dir / "evaluations.jsonl").exists() and not (job.dir / "keeper.log").exists()
    return val


@pytest.mark.timeout(TIMEOUT)
def test_full_finetune_on_two_processes_validates_in_its_loop(assets, examples, tmp_path):
    done = timed("full_finetune x2, in the loop")
    job = tune_magic.launch(f"--nproc_per_node 2 full_finetune --config tiny/full_val epochs={EPOCHS} "
                            f"max_steps_per_epoch={STEPS} run_val_every_n_steps=3 batch_size_val=3", cwd=tmp_path)
    assert job.wait(TIMEOUT) == "succeeded", job.tail(30)
    assert job.wait_evaluations(10) == []  # nothing to wait for in the loop
    done()
    val = _in_loop_checks(job, 3, assets, examples)
    assert val[12] < val[3]


@pytest.mark.timeout(TIMEOUT)
def test_lora_finetune_with_val_split_validates_in_its_loop(assets, examples, tmp_path):
    done = timed("lora_finetune x1 --val-split 0.1, in the loop")
    job = tune_magic.launch(f"lora_finetune --config tiny/lora epochs={EPOCHS} max_steps_per_epoch={STEPS} "
                            "run_val_every_n_steps=2", val_split=0.1, cwd=tmp_path)
    assert job.wait(TIMEOUT) == "succeeded", job.tail(30)
    done()
    assert "dataset.split=train[:90%]" in job.overrides
    _in_loop_checks(job, 2, assets, examples)


# -- torchtune 0.6.1's recipes: one evaluation job per checkpoint -----------------------------------

BUILTINS = [
    ("full_finetune_single_device", "tiny/builtin_full_single", "", "full"),
    ("lora_finetune_single_device", "tiny/builtin_lora_single", "", "lora_merged"),
    ("lora_finetune_single_device", "tiny/builtin_lora_single", " save_adapter_weights_only=True", "adapter_only"),
]


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("recipe,config,extra,kind", BUILTINS, ids=[b[3] for b in BUILTINS])
def test_torchtune_recipes_get_one_evaluation_job_per_checkpoint(recipe, config, extra, kind, assets, examples,
                                                                  tmp_path):
    done = timed(f"{recipe} ({kind}) and its evaluations")
    job = tune_magic.launch(f"{recipe} --config {config} epochs={EPOCHS} max_steps_per_epoch={STEPS}{extra}",
                            val_split=0.1, cwd=tmp_path)
    assert job.record.validation == {"mode": "checkpoints", "every_n_steps": None}
    evaluations = job.wait_evaluations(TIMEOUT)
    done()
    assert job.status == "succeeded", job.tail(30)
    assert [(e.epoch, e.step, e.status, e.error) for e in evaluations] == [
        (epoch, step, "succeeded", None) for epoch, step in enumerate(SAVE_STEPS)]
    listed = evaluation_jobs(job)  # evaluations are jobs like any: tune_magic.jobs() lists them
    assert [j.id for j in listed] == [e.job_id for e in evaluations]
    for epoch, (ev_job, step) in enumerate(zip(listed, SAVE_STEPS)):
        assert ev_job.record.evaluates == {"job": job.id, "epoch": epoch, "step": step}
        assert ev_job.name == f"validate {job.name} epoch_{epoch}" and ev_job.status == "succeeded"
        result = read_result(ev_job.output_dir)
        assert (result["kind"], result["epoch"], result["step"], result["examples"]) == (kind, epoch, step, 13)
        assert not Path(ev_job.output_dir).is_relative_to(job.output_dir)
    points = job.validation_points()
    assert [(p.step, p.epoch, p.source) for p in points] == [(s, e + 1, "evaluation") for e, s in enumerate(SAVE_STEPS)]
    for epoch, (p, e) in enumerate(zip(points, evaluations)):
        assert p.value == e.val_loss
        assert_close(p.value, reference_for_folder(Path(job.output_dir) / f"epoch_{epoch}", assets, examples),
                     f"epoch {epoch}")
    s = job.val_summary()
    best = min(points, key=lambda p: p.value)
    assert (s.latest, s.latest_step, s.best, s.best_step, s.pending, s.failed) == (
        points[-1].value, 12, best.value, best.step, 0, 0)
    assert (job.dir / "keeper.done").exists()


@pytest.mark.timeout(TIMEOUT)
def test_an_evaluation_that_fails_leaves_the_job_as_it_was_and_shows_its_error(assets, tmp_path):
    out = tmp_path / "run"
    blocker = tmp_path / "run-val-epoch_1"  # where the evaluation of epoch_1 would write: a file is in the way
    blocker.write_text("not a folder\n")
    done = timed("full_finetune_single_device, one evaluation failing")
    job = tune_magic.launch(f"full_finetune_single_device --config tiny/builtin_full_single epochs=2 "
                            f"max_steps_per_epoch=2 output_dir={out}", val_split=0.1, cwd=tmp_path)
    evaluations = job.wait_evaluations(TIMEOUT)
    done()
    assert job.status == "succeeded" and job.error is None and job.record.returncode == 0
    ok, bad = evaluations
    assert (ok.epoch, ok.status, ok.error) == (0, "succeeded", None) and ok.val_loss > 0
    assert (bad.epoch, bad.step, bad.status, bad.val_loss) == (1, 4, "failed", None)
    assert "FileExistsError" in bad.error and str(blocker) in bad.error
    assert tune_magic.get_job(bad.job_id).status == "failed"
    s = job.val_summary()
    assert (s.latest, s.best, s.pending, s.failed) == (ok.val_loss, ok.val_loss, 0, 1)
    assert [(p.step, p.value) for p in job.validation_points()] == [(2, ok.val_loss)]
    assert blocker.read_text() == "not a folder\n"


# -- sweeps ---------------------------------------------------------------------------------------

def _cli_json(*args: str) -> object:
    r = subprocess.run([sys.executable, "-m", "tune_magic", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _every_view(sweep) -> dict[str, tuple]:
    """(best trial, measure) in every view: the frame, Sweep.best(), the card, tune-magic sweeps
    --json and jobs --sweep --json (real CLI processes)."""
    from tune_magic.ui.cards import SweepCard

    df, best = sweep.frame(), sweep.best()
    card = SweepCard(sweep, watch=False)
    try:
        card.update(card.watcher.poll_once())
        snap, text = card.snapshot, card.text()
    finally:
        card.close()
    (listed,) = [s for s in _cli_json("sweeps", "--json") if s["id"] == sweep.id]
    trials = _cli_json("jobs", "--sweep", sweep.id, "--json")
    return {"frame": (df.attrs["best"], df.attrs["ranked_by"]), "best()": (best.trial.index, best.ranked_by),
            "card": (snap.best, snap.ranked_by), "sweeps --json": (listed["best"]["trial"], listed["ranked_by"]),
            "jobs --sweep --json": (trials["best"], trials["ranked_by"]), "_text": text, "_df": df,
            "_trials": trials["trials"]}


@pytest.mark.timeout(TIMEOUT)
def test_a_two_by_two_sweep_is_ranked_by_validation_loss_in_every_view(assets, tmp_path):
    done = timed("2 x 2 tiny LoRA sweep, --val-split 0.1")
    sweep = tune_magic.sweep("lora_finetune --config tiny/lora optimizer.lr=5e-3,1e-2 seed=1,2 epochs=2 "
                             "max_steps_per_epoch=3", val_split=0.1, max_parallel=2, name="val-lr-seed", cwd=tmp_path)
    try:
        assert sweep.wait(TIMEOUT) == {"succeeded": 4}
    finally:
        sweep.stop(grace_s=2)
    done()
    # each trial's best validation loss, independently: the lowest of its own val_loss points
    vals = [min(p.value for p in j.validation_points()) for j in sweep.jobs]
    assert [len(j.validation_points()) for j in sweep.jobs] == [2] * 4  # each epoch's end (steps 3, 6)
    chosen = vals.index(min(vals))
    finals = [[p["value"] for p in j.metrics() if p["name"] == "loss"][-1] for j in sweep.jobs]
    assert finals.index(min(finals)) != chosen  # here the two measures disagree: the ranking shows which it used
    views = _every_view(sweep)
    assert {k: v for k, v in views.items() if not k.startswith("_")} == dict.fromkeys(
        ("frame", "best()", "card", "sweeps --json", "jobs --sweep --json"), (chosen, "val_loss"))
    assert views["_df"]["best_val_loss"].tolist() == vals
    assert [t["best_val_loss"] for t in views["_trials"]] == vals
    assert sweep.best().best_val_loss == min(vals) and sweep.ranking().note is None
    assert f"* best: trial {chosen} " in views["_text"] and "(best by val_loss: the lowest validation loss)" in views["_text"]


@pytest.mark.timeout(TIMEOUT)
def test_a_sweep_of_torchtune_recipes_waits_for_its_evaluations_then_ranks_by_them(assets, examples, tmp_path):
    done = timed("2-trial sweep of lora_finetune_single_device, evaluations")
    sweep = tune_magic.sweep("lora_finetune_single_device --config tiny/builtin_lora_single optimizer.lr=1e-3,1e-2 "
                             "epochs=1 max_steps_per_epoch=3", val_split=0.1, max_parallel=2, name="val-builtin",
                             cwd=tmp_path)
    try:
        assert sweep.wait(TIMEOUT) == {"succeeded": 2}  # and their evaluations (the default when trials validate)
    finally:
        sweep.stop(grace_s=2)
    done()
    evaluations = [j.evaluations() for j in sweep.jobs]
    assert [[(e.epoch, e.step, e.status) for e in ev] for ev in evaluations] == [[(0, 3, "succeeded")]] * 2
    for job, (e,) in zip(sweep.jobs, evaluations):
        assert_close(e.val_loss, reference_for_folder(Path(job.output_dir) / "epoch_0", assets, examples), job.name)
    vals = [ev[0].val_loss for ev in evaluations]
    ranking = sweep.ranking()
    assert (ranking.best.trial.index, ranking.measure, ranking.pending, ranking.note) == (
        vals.index(min(vals)), "val_loss", 0, None)
    views = _every_view(sweep)
    assert {v for k, v in views.items() if not k.startswith("_")} == {(vals.index(min(vals)), "val_loss")}
    assert [t["val_pending"] for t in views["_trials"]] == [0, 0] and not any(math.isnan(v) for v in vals)
