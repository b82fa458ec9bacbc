"""What a user reads of SLURM jobs on the real two-node test cluster (tests/slurmcluster.py), issue 22:
SLURM's job id on the card and as a column with the nodes (the CLI and the live table), a stop
that reads as a stop everywhere (card, listings, ``tune-magic logs``) whatever squeue calls it, a
failure whose first line and card tail name the same rank and say how many ranks failed, and the
warnings about paths on a node's own disk (this session's TUNE_MAGIC_HOME is under /tmp)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import tune_magic
from tune_magic.ui.cards import JobCard
from tune_magic.ui.views import JobsTable

from jobhelpers import toy_args
from waiting import wait_for

pytestmark = pytest.mark.slurm
TIMEOUT = 240
CLI = [sys.executable, "-m", "tune_magic"]


def shown(widget) -> str:
    return re.sub(r"<[^>]+>", "", widget.value.replace("<br>", "\n")).replace("&#x27;", "'").replace("&amp;", "&")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=TIMEOUT)


def test_a_stopped_two_node_job_shows_its_slurm_id_and_reads_as_a_stop_everywhere(cluster):
    # its ranks ignore SIGTERM, so the stop ends with SLURM's own kill: slurmstepd's CANCELLED and srun's
    # "task N: Killed" lines in the log (the case)
    job = tune_magic.launch(toy_args("steps=100000", "step_s=0.2", "ignore_sigterm=true", nproc=1),
                            scheduler="slurm", nodes=2, cpus_per_node=1, name="stop me")
    cluster.started.append(job)
    slurm_id = job.engine_id
    assert slurm_id and slurm_id.isdigit()
    card = JobCard(job, watch=False)
    wait_for(lambda: (card.watcher.poll_once().step or 0) >= 2 and len(card.snapshot.nodes) == 2, timeout=TIMEOUT,
             interval=0.5, what="step 2 on both nodes", describe=lambda: card.text())
    assert re.search(r"<span class='tm-engine-id'>([^<]*)</span>", card.header.value)[1] == f"SLURM ID {slurm_id}"
    notes = shown(card.notes)  # this session's TUNE_MAGIC_HOME (and so the output_dir) is under /tmp
    assert "TUNE_MAGIC_HOME" in notes and "is under /tmp, which each node has for itself" in notes, notes
    assert f"warning: output_dir {job.output_dir} is under /tmp, which each node has for itself" in notes
    # the SLURM id and the nodes as columns: tune-magic jobs and the live table
    lines = cli("jobs").stdout.splitlines()
    at = lines[0].index("SLURM ID")
    row = next(line for line in lines if line.startswith(job.id))
    engine, nodes = row[at:].split()[:2]
    assert engine == slurm_id and sorted(nodes.split(",")) == sorted(cluster.node_names), (lines[0], row)
    table = JobsTable(live=False)
    cell = re.fullmatch(r"<span class='tm-engine'[^>]*>([^<]*)</span><div class='tm-nodes'[^>]*>([^<]*)</div>",
                        table.rows[job.id]["engine"].value)
    assert cell[1] == slurm_id and sorted(cell[2].split(", ")) == sorted(cluster.node_names), cell.groups()
    assert "SLURM ID" in table.text().splitlines()[0]
    table.close()

    r = cli("stop", "--grace", "2", job.id)  # a user's stop
    assert r.returncode == 0 and r.stdout.split() == [job.id, "stopped"], (r.stdout, r.stderr)
    said = cluster.client(["squeue", "-t", "all", f"--jobs={slurm_id}", "--noheader", "--format=%T %r"],
                          check=False).stdout.split()
    print(f"squeue says of the stopped job {slurm_id}: {said}")  # FAILED JobLaunchFailure, or CANCELLED
    raw = open(job.log_path).read()
    # SLURM's own lines are in the log ...
    # (slurmstepd writes into the ranks' file: its line may land in the middle of a progress bar's)
    assert re.search(r"slurmstepd(-\S+)?: error: \*\*\* (JOB|STEP) \S+ ON \S+ CANCELLED AT", raw), raw[-3000:]
    assert re.search(r"^srun: error: \S+: tasks? [\d,-]+: (Killed|Exited with exit code \d+)$", raw, re.M), raw[-3000:]
    card.watcher.poll_once()
    tail = [line for line in card.snapshot.tail if line.strip()]
    for word in ("srun:", "slurmstepd", "Traceback", "SignalException", "Killed", "Exited with exit code"):
        assert not any(word in line for line in tail), (word, tail)  # ... not on the card
    assert re.fullmatch(r"(SLURM cancelled job \d+ on [^;]+; srun stopped its tasks|torchrun got SIGTERM \(signal 15\) "
                        r"and stopped its workers)", tail[-1]), tail
    assert shown(card.error).startswith("stopped by the user at step ")
    listed = {r_["id"]: r_ for r_ in json.loads(cli("jobs", "--json").stdout)}[job.id]
    assert (listed["status"], listed["error"], listed["engine_id"]) == ("stopped", None, slurm_id)
    assert not (job.dir / "failure.json").exists()
    logs = cli("logs", job.id)
    assert logs.stdout == raw and logs.stderr.startswith(f"tune-magic logs: job {job.id} stopped · step ")
    assert logs.stderr.rstrip().endswith(" · stopped by the user"), logs.stderr


def test_every_rank_failing_names_the_first_on_its_card_and_says_how_many_failed(cluster):
    # both ranks (one a node) raise at the same step: two agents' reports in one log
    job = tune_magic.launch(toy_args("steps=5", "crash_rank=[0,1]", nproc=1), scheduler="slurm", nodes=2,
                            cpus_per_node=1, name="both fail")
    cluster.started.append(job)
    assert job.wait(TIMEOUT) == "failed", "\n".join(job.tail(80))
    raw = open(job.log_path).read()
    first = min((0, 1), key=lambda r: raw.index(f"[rank{r}]: RuntimeError"))  # whose traceback the log has first
    host = next(w["host"] for w in job.workers if w["rank"] == first)
    assert job.error == (f"rank {first} on {host} failed first; 2 ranks failed: RuntimeError: toy recipe crashed on "
                         "purpose"), job.error
    card = JobCard(job, watch=False)
    card.watcher.poll_once()
    assert shown(card.error) == job.error
    tail = [line for line in card.snapshot.tail if line.strip()]
    assert tail[-1] == f"[rank{first}]: RuntimeError: toy recipe crashed on purpose", tail
    assert job.failure().rank == first and f"rank {first} on {host}" in cli("jobs").stdout
