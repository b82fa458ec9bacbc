"""The tutorial notebooks, executed top to bottom in real Jupyter kernels (nbclient), with real jobs.

quickstart.ipynb runs once, through the README's demo (``tune-magic demo``, which executes it with
nbclient): the test checks the demo's summary and the executed notebook's outputs. panel.ipynb,
resume.ipynb, sweep.ipynb and gpu_node.ipynb (with ``TUNE_MAGIC_DRY_RUN=1``: no GPU here) are executed directly. Executed
notebooks are written under ``test-artifacts/notebooks/`` for inspection.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import tune_magic
from tune_magic.registry import store as jobstore
from tune_magic.job import get_job, jobs

from jobhelpers import processes_mentioning

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
ARTIFACTS = REPO / "test-artifacts" / "notebooks"
CELL_TIMEOUT_S = 600
#: The quickstart must run in well under this on 2 CPU cores.
QUICKSTART_BUDGET_S = 180


def execute(name: str, cwd: Path) -> nbformat.NotebookNode:
    """Execute notebooks/<name>.ipynb in a fresh python3 kernel in ``cwd``; save it to test-artifacts."""
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                       resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        nbformat.write(nb, ARTIFACTS / f"{name}.executed.ipynb")
    return nb


def cell(nb, cell_id: str):
    return next(c for c in nb.cells if c.get("id") == cell_id)


def stdout(nb, cell_id: str) -> str:
    return "".join(o.text for o in cell(nb, cell_id).outputs if o.output_type == "stream" and o.name == "stdout")


def stderr(nb, cell_id: str) -> str:
    return "".join(o.text for o in cell(nb, cell_id).outputs if o.output_type == "stream" and o.name == "stderr")


def texts(nb, cell_id: str, kind: str | None = None) -> list[str]:
    """text/plain of a cell's display_data / execute_result outputs."""
    return [o.data.get("text/plain", "") for o in cell(nb, cell_id).outputs
            if o.output_type in ("display_data", "execute_result") and (kind is None or o.output_type == kind)]


def widget_tree(state: dict, model_id: str) -> list[dict]:
    """Every widget model under ``model_id`` in a notebook's saved widget state (itself first)."""
    out, todo = [], [model_id]
    while todo:
        model = state[todo.pop(0).removeprefix("IPY_MODEL_")]
        out.append(model)
        for value in model["state"].values():
            for ref in value if isinstance(value, list) else [value]:
                if isinstance(ref, str) and ref.startswith("IPY_MODEL_") and ref.removeprefix("IPY_MODEL_") in state:
                    todo.append(ref)
    return out


def layout_of(state: dict, model: dict) -> dict:
    return state[model["state"]["layout"].removeprefix("IPY_MODEL_")]["state"]


def array_of(model: dict, name: str):
    """A bqplot mark's array trait (``x``, ``y``) from the saved state's base64 buffer."""
    import base64

    import numpy as np

    (buf,) = [b for b in model["buffers"] if b["path"] == [name, "value"]]
    return np.frombuffer(base64.b64decode(buf["data"]), dtype=model["state"][name]["dtype"])


def launched_id(nb, cell_id: str) -> str:
    """The job id in a %%tune_run cell's result (``<Job ID 'name' status>``)."""
    (result,) = texts(nb, cell_id, "execute_result")
    return re.match(r"<Job (\S+) ", result).group(1)


def port(job) -> str:
    return job.rendezvous_endpoint.rsplit(":", 1)[1]


def table_rows(text: str) -> dict[str, list[str]]:
    """%tune_jobs text/plain: job id -> [name, status, step, loss, elapsed, reason words...]."""
    return {line.split()[0]: line.split()[1:] for line in text.splitlines()[1:] if line.strip()}


@pytest.fixture
def stop_leftovers(tmp_path):
    """Stop any job still running from ``tmp_path`` when the test ends (a failed notebook)."""
    yield tmp_path
    for job in jobs():
        if job.record.cwd == str(tmp_path) and job.status == "running":
            job.stop(grace_s=2)


def test_quickstart_through_the_demo(tmp_path, tiny_assets):
    out = ARTIFACTS / "quickstart.executed.ipynb"
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "tune_magic", "demo", "--out", str(out)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - start
    assert r.returncode == 0, r.stdout + r.stderr
    assert wall < QUICKSTART_BUDGET_S, f"the demo took {wall:.0f} s"
    nb = nbformat.read(out, as_version=4)
    ida, idb, idc = (launched_id(nb, c) for c in ("launch-a", "launch-b", "launch-c"))
    a, b, c = (get_job(i) for i in (ida, idb, idc))

    # the jobs: two side by side from one config with distinct OS-chosen ports, the third stopped
    assert [a.status, b.status, c.status] == ["succeeded", "succeeded", "stopped"], [j.tail(20) for j in (a, b)]
    assert (a.name, b.name, c.name) == ("lr-1e-2", "lr-2e-3", "long")
    assert a.record.config == b.record.config and a.record.config.endswith("tiny/lora.yaml")
    for job in (a, b):
        argv = job.argv
        assert argv[argv.index("torch.distributed.run") + 1:][:3] == ["--standalone", "--nproc_per_node", "2"]
        assert "max_steps_per_epoch=8" in argv
    assert port(a) != port(b)
    assert a.started_at < b.started_at < a.ended_at  # they did run side by side
    assert processes_mentioning(idc) == []

    # the notebook's outputs
    waited = stdout(nb, "wait").splitlines()
    assert waited == [f"lr-1e-2  {ida}  succeeded  rendezvous {a.rendezvous_endpoint}",
                      f"lr-2e-3  {idb}  succeeded  rendezvous {b.rendezvous_endpoint}"]
    cards = texts(nb, "cards")
    assert len(cards) == 2
    for text, job in zip(cards, (a, b)):
        assert text.startswith(f"job {job.id} ({job.name}): succeeded")
        assert f"rendezvous {job.rendezvous_endpoint}" in text
        # where the run is: epoch of epochs, step of steps, loss, the validation loss (the latest, and
        # the best where it is another step's), steps this epoch, how long it took
        assert re.search(r"^epoch 1/1 · step 8/8 · loss \d+\.\d+ · val loss \d+\.\d+( · best \d+\.\d+ \(step [246]\))? · "
                         r"8/8 this epoch · took \d+:\d\d( |$)", text, re.M), text
    # the validation losses (--val-split 0.1, run_val_every_n_steps=2): every 2 steps, 8 the epoch's end
    for job in (a, b):
        assert job.record.validation == {"mode": "in_loop", "every_n_steps": 2}
        assert "dataset.split=train[:90%]" in job.argv and [p.step for p in job.validation_points()] == [2, 4, 6, 8]
    printed = {line.split()[0]: line.split()[2:] for line in stdout(nb, "val-points").splitlines()}
    for job in (a, b):
        assert printed[job.name] == [w for p in job.validation_points() for w in (f"{p.step}:", f"{p.value:.4f}")]
        shown = next(t for t in cards if t.startswith(f"job {job.id} "))
        assert "val_loss by step: " + " · ".join(f"{p.step}: {p.value:.5g}" for p in job.validation_points()) in shown
    # the cards' charts, as the notebook keeps their widget state: val_loss is a series of its own
    # (its colour, a square at each point, the legend above the chart naming loss and val_loss)
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    for output, job in zip([o for o in cell(nb, "cards").outputs if o.output_type == "display_data"], (a, b)):
        card = widget_tree(state, output.data["application/vnd.jupyter.widget-view+json"]["model_id"])
        legend = next(m for m in card if "tm-legend" in m["state"].get("value", ""))
        assert re.findall(r"</span> ([^<]*)</span>", legend["state"]["value"]) == ["loss", "val_loss"]
        assert legend["state"]["layout"] is not None and layout_of(state, legend)["display"] is None
        (val,) = [m for m in card if m["model_name"] == "LinesModel" and m["state"]["labels"] == ["val_loss"]]
        (loss,) = [m for m in card if m["model_name"] == "LinesModel" and m["state"]["labels"] == ["loss"]]
        assert val["state"]["colors"] != loss["state"]["colors"] and val["state"]["marker"] == "square"
        points = job.validation_points()
        assert array_of(val, "x").tolist() == [p.step for p in points]
        assert array_of(val, "y").tolist() == pytest.approx([p.value for p in points])
    rows = table_rows(texts(nb, "jobs")[0])
    assert rows[ida][:3] == ["lr-1e-2", "succeeded", "8"] and rows[idb][:3] == ["lr-2e-3", "succeeded", "8"]
    table = [line.split() for line in stdout(nb, "compare-table").splitlines()]
    assert table[0] == ["step", "lr-1e-2", "lr-2e-3"]
    assert [row[0] for row in table[1:]] == [str(s) for s in range(1, 9)]
    first, last = float(table[1][1]), float(table[-1][1])
    assert last < first - 0.5, "lr 1e-2 did not lower the loss"
    assert table[1][1] == table[1][2]  # same config and seed: the same first step
    (frame,) = texts(nb, "metrics-frame")
    assert "loss" in frame and "lr" in frame and "tokens_per_second_per_gpu" in frame
    assert re.fullmatch(r"step \d+, loss \d+\.\d+\n", stdout(nb, "few-steps"))
    assert stdout(nb, "stop") == f"{idc} stopped\n"
    after = table_rows(texts(nb, "jobs-after")[0])
    assert [after[i][1] for i in (ida, idb, idc)] == ["succeeded", "succeeded", "stopped"]
    # the misspelled override is refused before anything starts, with the nearest key of the config
    assert cell(nb, "typo").metadata.tags == ["raises-exception"]
    refused = stderr(nb, "typo")
    assert refused.startswith("UsageError: override optimzer.lr=1e-3: the config has no key optimzer; did you mean "
                              "optimizer.lr? (to add optimzer.lr as a new key on purpose, write +optimzer.lr=1e-3)"), refused
    assert not [j for j in jobs() if j.name == "typo" and j.record.cwd == a.record.cwd]  # nothing started
    # the comparison chart comes with its legend (which curve is which job), read from the widget
    # state the notebook keeps (the output's text form is a snapshot of when the cell returned, cut
    # short; the browser test reads the same legend on screen: tests/e2e/test_browser.py)
    (shown,) = [o for o in cell(nb, "compare-chart").outputs if o.output_type == "execute_result"]
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    model = lambda ref: state[ref.removeprefix("IPY_MODEL_")]["state"]  # noqa: E731
    note, legend, plot = (model(ref) for ref in model(shown.data["application/vnd.jupyter.widget-view+json"]["model_id"])["children"])
    assert note["value"] == "" and plot["_model_name"] == "FigureModel", note
    assert re.findall(r"<span class='tm-legend-item'[^>]*><span [^>]*></span> ([^<]*)</span>", legend["value"]) == [
        f"{name} {i[-6:]}" for i, name in sorted({ida: "lr-1e-2", idb: "lr-2e-3"}.items())], legend["value"]
    for c_ in nb.cells:
        if c_.cell_type == "code" and c_.get("id") != "typo":
            assert not any(o.output_type == "error" for o in c_.outputs), c_.source

    # the demo's summary: one row per job, then where the executed notebook is
    lines = r.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["NAME", "ID"])
    summary = {line.split()[1]: line.split() for line in lines[header + 1:header + 4]}
    assert set(summary) == {ida, idb, idc}
    for job, status, step in ((a, "succeeded", "8"), (b, "succeeded", "8"), (c, "stopped", None)):
        name, _id, st, steps, loss, prt, secs, unit = summary[job.id]
        assert (name, st) == (job.name, status)
        assert step is None or steps == step
        float(loss)
        assert prt == port(job)
        assert 0 < float(secs) < QUICKSTART_BUDGET_S and unit == "s"
    assert f"Executed notebook: {out}" in lines
    assert "ran in" in r.stdout and "its 3 jobs" in r.stdout


def test_panel_notebook(stop_leftovers, tiny_assets):
    tmp_path = stop_leftovers
    nb = execute("panel", tmp_path)
    preview = stdout(nb, "preview")
    assert "--standalone --nproc_per_node 2 " in preview and "<job-id>" in preview
    assert "tiny/lora.yaml max_steps_per_epoch=6 seed=1 optimizer.lr=1e-2 " in preview
    assert "tiny/lora" in stdout(nb, "form")
    ids = re.findall(r"'(\S+?)'", stdout(nb, "launch"))
    assert stdout(nb, "launch").startswith("launched:") and len(set(ids)) == 2
    launched = [get_job(i) for i in ids]
    assert [j.status for j in launched] == ["succeeded", "succeeded"], [j.tail(20) for j in launched]
    assert [j.name for j in launched] == ["lr-1e-2", "lr-2e-3"]
    # the two runs differ in their learning rate only
    assert ["optimizer.lr=1e-2" in j.argv for j in launched] == [True, False]
    assert ["optimizer.lr=2e-3" in j.argv for j in launched] == [False, True]
    assert port(launched[0]) != port(launched[1])
    assert stdout(nb, "wait").splitlines() == [f"{j.id}  succeeded  rendezvous {j.rendezvous_endpoint}"
                                               for j in launched]
    series = dict(line.split(" ", 1) for line in stdout(nb, "series").splitlines())
    assert list(series) == ids
    curves = []
    for job_id in ids:
        points = re.findall(r"\((\d+), (\d+\.\d+)\)", series[job_id])
        assert [int(s) for s, _ in points] == [1, 2, 3, 4, 5, 6]
        curves.append([float(v) for _, v in points])
    fast, slow = curves
    assert fast[0] == slow[0]  # same seed and data: the same first step
    assert fast != slow and fast[-1] < slow[-1]  # two curves: the larger learning rate lowers the loss faster
    assert stdout(nb, "chart-facts").splitlines() == ["curves: 2", "x ticks: [1, 2, 3, 4, 5, 6]"]
    # the table is live: it shows both ends without a Refresh; names as given, steps and losses
    table = table_rows(stdout(nb, "table"))
    for job, curve in zip(launched, curves):
        name, status, step, loss = table[job.id][:4]
        assert (name, status, step) == (job.name, "succeeded", "6")
        assert abs(float(loss) - curve[-1]) < 1e-3


def test_sweep_notebook(stop_leftovers, tiny_assets):
    nb = execute("sweep", stop_leftovers)
    dry = stdout(nb, "dry-run")
    assert dry.startswith("sweep lora_finetune: 4 trials (2 optimizer.lr x 2 model.lora_rank), 2 at a time "
                          "without GPUs")
    names = re.findall(r"^trial (\d): (\S+)$", dry, re.M)
    assert names == [("0", "lr=1e-3,lora_rank=4"), ("1", "lr=1e-3,lora_rank=8"), ("2", "lr=3e-3,lora_rank=4"),
                     ("3", "lr=3e-3,lora_rank=8")]
    assert " optimizer.lr=3e-3 model.lora_rank=8 max_steps_per_epoch=5 'dataset.split=train[:90%]' 'dataset_val=" in dry
    sweep_id = re.match(r"<Sweep (sweep-\S+) 'lr-rank': 4 trials, 2 at a time>", stdout(nb, "wait")).group(1)
    assert stdout(nb, "wait").splitlines()[1] == "{'succeeded': 4}"
    (card,) = texts(nb, "sweep", "display_data")
    assert card.startswith(f"sweep lr-rank ({sweep_id}): running, 4 trials, 2 at a time")
    sweep = tune_magic.get_sweep(sweep_id)
    jobs = sweep.jobs
    assert [j.name for j in jobs] == [n for _, n in names] and all(j.status == "succeeded" for j in jobs)
    # the frame: a row per trial, the axes as the recipe reads them, 5 steps each, losses from the logs
    rows = [line.split() for line in stdout(nb, "frame").splitlines()[2:]]
    assert [r[:5] for r in rows] == [["0", "0.001", "4", "succeeded", "5"], ["1", "0.001", "8", "succeeded", "5"],
                                     ["2", "0.003", "4", "succeeded", "5"], ["3", "0.003", "8", "succeeded", "5"]]
    finals, vals = [float(r[5]) for r in rows], [float(r[7]) for r in rows]
    for job, final, val in zip(jobs, finals, vals):
        losses = [p["value"] for p in job.metrics() if p["name"] == "loss"]
        assert len(losses) == 5 and abs(losses[-1] - final) < 1e-5
        # --val-split 0.1: validated in the recipe's loop at the epoch's end (step 5), no evaluation job
        (point,) = job.validation_points()
        assert point.step == 5 and abs(point.value - val) < 1e-5 * val and job.evaluations() == []
    # the best trial is the one with the lowest validation loss, said as such
    best = vals.index(min(vals))
    assert stdout(nb, "best").startswith(f"best by val_loss: trial {best} ({names[best][1]}), val_loss {min(vals):.4f}, "
                                         f"final loss {finals[best]:.4f}, job {jobs[best].id}")
    assert sweep.best().trial.index == best and sweep.best().ranked_by == "val_loss"
    (again,) = texts(nb, "card", "display_data")
    assert again.startswith(f"sweep lr-rank ({sweep_id}): finished, 4 trials, 2 at a time: 4 succeeded")
    assert f"* best: trial {best} ({names[best][1]}), val_loss " in again and "(best by val_loss: " in again


def test_gpu_node_notebook_in_dry_run(stop_leftovers, monkeypatch):
    monkeypatch.setenv("TUNE_MAGIC_DRY_RUN", "1")  # inherited by the kernel: every launch only prints
    before = {r.id for r in jobstore.list_records()}
    nb = execute("gpu_node", stop_leftovers)
    assert stdout(nb, "setup").strip() == "dry run: True"
    commands = {cid: stdout(nb, cid).strip() for cid in ("job-01", "job-23", "multi")}
    for cid, line in commands.items():
        assert len(line.splitlines()) == 1 and line.startswith("PYTHONUNBUFFERED=1 "), line
        assert "lora_finetune_distributed.py --config " in line and "1B_lora.yaml batch_size=4 output_dir=" in line
    assert "CUDA_VISIBLE_DEVICES=0,1 " in commands["job-01"]
    assert "CUDA_VISIBLE_DEVICES=2,3 " in commands["job-23"]
    for cid in ("job-01", "job-23"):
        assert " -m torch.distributed.run --standalone --nproc_per_node 2 " in commands[cid]
    multi = commands["multi"]
    assert ("-m torch.distributed.run --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-id run42 "
            "--rdzv-endpoint node0:29400 ") in multi
    assert "--standalone" not in multi and "CUDA_VISIBLE_DEVICES" not in multi
    per_job = stdout(nb, "compare").splitlines()
    assert [line.split()[0] for line in per_job] == ["CUDA_VISIBLE_DEVICES=0,1", "CUDA_VISIBLE_DEVICES=2,3"]
    assert per_job[0].split("output_dir=")[1] != per_job[1].split("output_dir=")[1]
    assert stdout(nb, "keep-multi").strip() == "rendezvous=user  endpoint=node0:29400  nnodes=2"
    assert "needs a rendezvous endpoint" in stderr(nb, "refused") + stdout(nb, "refused")
    assert {r.id for r in jobstore.list_records()} == before  # nothing started, nothing registered


def test_resume_notebook(stop_leftovers, tiny_assets):
    nb = execute("resume", stop_leftovers)
    first = get_job(launched_id(nb, "launch"))
    step = int(stdout(nb, "past-checkpoint").split()[-1])
    last = first.summary().step  # where the stop caught it
    assert 66 <= step <= last < 192 and stdout(nb, "stopped") == f"{first.id} stopped\n"
    assert first.status == "stopped"
    preflight = stdout(nb, "preflight")
    # the stop comes a few steps into epoch 2 (epoch_0/ saved); on a fast machine it may land after epoch_1/
    k = 0 if last < 128 else 1
    at = 64 * (k + 1)
    assert preflight.startswith(f"Resume job {first.id}: lora_finetune from epoch_{k}/ ({k + 1} of 3 epochs done, "
                                f"global step {at})")
    assert f"  lost: {last - at} step{'s' if last - at != 1 else ''} (step" in preflight
    assert f"  the resumed run starts at step {at + 1}" in preflight
    assert f"  adds: resume_from_checkpoint=True checkpointer.adapter_checkpoint=epoch_{k}/adapter_model.pt " in preflight
    assert "  case: exact: the remaining steps give the same losses as an uninterrupted run" in preflight
    resumed = get_job(launched_id(nb, "resume"))
    assert stdout(nb, "resume").startswith(preflight.split("\n  command:")[0])  # the same pre-flight, then the card
    assert stdout(nb, "wait") == "succeeded True True\n"
    assert first.record.resumed_by == resumed.id and resumed.record.resume_point["step"] == at
    (card,) = texts(nb, "card")
    assert card.startswith(f"job {resumed.id} (three-epochs): succeeded")
    assert f"resumed job {first.id} from epoch_{k}/ at step {at}" in card and "step 192/192" in card
    lines = stdout(nb, "lineage").splitlines()
    assert lines[:2] == [f"stopped run: steps 1-{at}, {at} points", f"resumed run: steps {at + 1}-192, {192 - at} points"]
    around = dict(part.split(": ") for part in lines[2].removeprefix("around the resume: ").split(", "))
    assert list(around) == [str(s) for s in range(at - 2, at + 4)]
    stopped = {m["step"]: m["value"] for m in first.metrics() if m["name"] == "loss" and m["source"] == "disklogger"}
    redone = [s for s in (at + 1, at + 2) if s in stopped]
    assert redone  # the stopped run got past its checkpoint
    for s in redone:  # the steps the stopped run did after its checkpoint came out the same again
        assert abs(float(around[str(s)]) - stopped[s]) < 1e-4
    jobs_text = {line.split()[0]: line for line in stdout(nb, "jobs").splitlines()[1:] if line.strip()}
    assert jobs_text[first.id].endswith(f"resumed by {resumed.id}")
    assert jobs_text[resumed.id].endswith(f"resume of {first.id} from epoch_{k}/")
    # what the text says is what the cells show
    md = {c_.get("id"): c_.source for c_ in nb.cells if c_.cell_type == "markdown"}
    assert "`epoch_2/` after step\n192" in md["launch-md"] and "checkpoint saved: epoch_2 " in card
    assert all((Path(first.output_dir) / f"epoch_{e}").is_dir() for e in range(3))
    assert "(step 66: `epoch_0/`" in md["launch-md"] and step >= 66
    assert "`%tune_stop` says the job is `stopped`" in md["launch-md"] and stdout(nb, "stopped").endswith(" stopped\n")
    assert "card (`succeeded`, step 192/192)" in md["curve-md"] and "succeeded" in card.splitlines()[0]
    assert "`resumed by` the new one" in md["curve-md"] and "`resume of`\nthe stopped one `from epoch_0/`" in md["curve-md"]
    if k == 0:  # the text's numbers are those of a stop in epoch 2 (a very fast machine may pass epoch_1/ first)
        claims = md["preflight-md"]
        assert "`epoch_0/` (1 of 3 epochs done, global step 64)" in claims
        assert "(1 of 3 epochs done, global step 64)" in preflight.splitlines()[0]
        assert "the resumed run starts at step 65" in claims and "  the resumed run starts at step 65\n" in preflight
        assert "are lost and done again" in claims and ", done again\n" in preflight
        assert "the\ncase is `exact`" in claims and "  case: exact: " in preflight
        assert "`resumed job ... from epoch_0/ at step 64`" in md["curve-md"]
        assert f"resumed job {first.id} from epoch_0/ at step 64" in card
        assert "steps 1-64 from the stopped run" in md["curve-md"] and "and 65-192 from the resumed one" in md["curve-md"]
        assert lines[:2] == ["stopped run: steps 1-64, 64 points", "resumed run: steps 65-192, 128 points"]
    for c_ in nb.cells:
        if c_.cell_type == "code":
            assert not any(o.output_type == "error" for o in c_.outputs), c_.source


#: What a real sinfo prints where SLURM is installed but no controller's configuration is reachable
#: (Debian's slurm-wlm 22.05 without a slurm.conf, measured here).
NO_CONTROLLER = ("sinfo: error: _establish_config_source: failed to fetch config\n"
                 "sinfo: fatal: Could not establish a configuration source\n")


def test_FAKE_sinfo_cluster_notebook_asks_for_a_controller_says_what_to_do_and_submits_nothing(
        stop_leftovers, tiny_assets, tmp_path, monkeypatch):
    """cluster.ipynb asks the SLURM scheduler, as the panel does (available(), then status_note(): a
    controller must answer sinfo), before it submits. With SLURM's clients on PATH but no controller
    answering (a FAKE sinfo that fails as the real one does, a FAKE sbatch that records any call),
    it says why and what to do, and its cells only show the plans: nothing is submitted or
    registered."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    called = tmp_path / "sbatch-called"
    (bin_dir / "sinfo").write_text(f"#!/bin/sh\ncat >&2 <<'END'\n{NO_CONTROLLER}END\nexit 1\n")
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\ntouch {called}\nexit 3\n")
    for f in ("sinfo", "sbatch"):
        (bin_dir / f).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")  # inherited by the kernel
    monkeypatch.delenv("TUNE_MAGIC_DRY_RUN", raising=False)
    monkeypatch.delenv("TUNE_MAGIC_SCHEDULER", raising=False)
    before = {r.id for r in jobstore.list_records()}
    nb = execute("cluster", stop_leftovers)
    said = stdout(nb, "setup").splitlines()
    assert said[0] == ("no SLURM to submit to: sbatch is here, but no SLURM controller answers (Could not establish "
                       "a configuration source): a job sent to slurm would not start"), said
    assert said[1].startswith("what to do: run this notebook where your cluster's controller answers `sinfo`")
    assert "TUNE_MAGIC_DRY_RUN=1" in said[1] and len(said) == 2
    for cid in ("two-nodes", "dry-run"):  # the plans: the sbatch line, then the batch script
        assert stdout(nb, cid).startswith("sbatch --parsable "), stdout(nb, cid)
    assert "#SBATCH --nodes=2" in stdout(nb, "two-nodes") and "#SBATCH --gpus-per-node=8" in stdout(nb, "dry-run")
    assert stdout(nb, "two-nodes-result") == "" and stdout(nb, "array-sweep-result") == ""  # no Job, no Sweep
    assert "nodes: 2  processes per node: 8  rendezvous: scheduler" in stdout(nb, "dry-run-result")
    assert not called.exists(), "sbatch was called: the notebook submitted with no controller answering"
    assert {r.id for r in jobstore.list_records()} == before
