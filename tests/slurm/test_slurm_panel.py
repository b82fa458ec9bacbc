"""The panel's SLURM fields against the real two-node test cluster (tests/slurmcluster.py): the
partition list comes from its sinfo, the preview's sbatch line is the one the launch runs, and
Launch submits one two-node job whose row the panel's table shows to the end."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tune_magic.ui.panel import Panel
from tune_magic.schedulers import slurm as slurm_sched

import tune_magic
from jobhelpers import TOY_CONFIG, TOY_RECIPE, own_python_warnings
from waiting import wait_for

pytestmark = pytest.mark.slurm
TIMEOUT = 240


def test_panel_launches_one_two_node_job_on_the_cluster(cluster, tmp_path):
    panel = Panel(cwd=tmp_path)
    job = None
    try:
        assert "slurm" in panel.schedulers_offered
        fields = panel.scheduler_fields["slurm"]
        panel.recipe.value = str(TOY_RECIPE)
        panel.config.value = str(TOY_CONFIG)
        panel.overrides.value = "steps=3 step_s=0.2"
        panel.name.value = "from the panel"
        panel.scheduler.value = "slurm"
        assert fields["partition"].options == (cluster.partition,)  # the cluster's sinfo, its * removed
        fields["partition"].value = cluster.partition
        fields["nodes"].value = 2
        fields["cpus_per_node"].value = 1
        fields["time_limit"].value = "10"
        preview, script = panel.command_preview.value, panel.script_preview.value
        assert preview == f"sbatch --parsable {Path(os.environ['TUNE_MAGIC_HOME'])}/jobs/<job-id>/job.sbatch", preview
        for line in ("#SBATCH --job-name=tune_magic-<job-id>", "#SBATCH --nodes=2",
                     f"#SBATCH --partition={cluster.partition}", "#SBATCH --time=10"):
            assert line in script.splitlines(), (line, script)
        panel.launch_button.click()
        # launched, with the node-local warnings this test's home under /tmp earns (the test cluster's
        # nodes are one machine, so it works here; on a real cluster it would not)
        (job,) = panel.launched
        home = os.environ["TUNE_MAGIC_HOME"]
        warned = re.findall(r"<div class='tm-warning'[^>]*>(.*?)</div>", panel.error.value)
        # and the one for this run's own interpreter when the clone lives under /tmp
        own = own_python_warnings(tune_magic.launch(f"{TOY_RECIPE} --config {TOY_CONFIG}", scheduler="slurm", nodes=2,
                                                    dry_run=True, env=dict(os.environ)), os.environ)
        assert [w.split(" is under ")[0] for w in warned] == [f"output_dir {home}/runs/toy/{job.id}",
                                                              f"TUNE_MAGIC_HOME {home}",
                                                              *(w.split(" is under ")[0] for w in own)], panel.error.value
        assert re.sub(r"<div class='tm-warning'[^>]*>.*?</div>", "", panel.error.value) == ""  # nothing else
        assert job.scheduler == "slurm" and job.num_nodes == 2 and job.name == "from the panel"
        # what was submitted is what the preview showed, with the job's own id
        assert (job.dir / slurm_sched.SCRIPT).read_text() == script.replace("<job-id>", job.id)
        assert job.id in panel.jobs_table.rows  # in the panel's table at once
        assert job.wait(TIMEOUT) == "succeeded", job.tail(30)
        assert sorted(job.nodes) == sorted(cluster.node_names)
        wait_for(lambda: panel.jobs_table.summaries[job.id][1:3] == ("succeeded", 3), timeout=15, interval=0.5,
                 what=f"{job.id} succeeded at step 3 in the panel's table",
                 describe=lambda: panel.jobs_table.summaries[job.id])
    finally:
        if job is not None and job.status in ("pending", "running"):
            job.stop(grace_s=1)
        panel.close()
