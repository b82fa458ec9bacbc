"""The launch panel built in the test process itself (no kernel): it works in any Python process."""

from __future__ import annotations

import html
import os
import re
import threading
import time

import psutil
import pytest

from tune_magic.registry import store as jobstore
from tune_magic.job.launch import build_plan
from tune_magic.registry.store import JobRecord, ProcessRef
from tune_magic.ui import views
from tune_magic.ui.panel import Panel

from jobhelpers import own_python_warnings, write_fake_nvidia_smi
from waiting import wait_for


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """A FAKE nvidia-smi with 4 GPUs on PATH (there is no GPU here)."""
    write_fake_nvidia_smi(tmp_path / "bin", 4)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def fake_running_job_on_gpu_1():
    """A FAKE running job record holding GPU 1, 'supervised' by this very process (so it is alive)."""
    me = psutil.Process()
    rec = JobRecord(id="20990101-000000-fake01", name="fake", argv=["python", "x.py"], env={}, cwd="/",
                    log_path="/dev/null", started_at=time.time(), gpus=[1],
                    supervisor=ProcessRef(me.pid, me.create_time()),
                    agent=ProcessRef(me.pid, 0.0))  # never matches: a stop() could not signal us
    d = jobstore.create(rec, jobstore.jobs_root())  # jobs_root(): the registry, created if this test is the first
    yield rec.id
    jobstore.update(d, status="stopped")


def test_preview_is_exactly_the_builders_command(tmp_path):
    panel = Panel(cwd=tmp_path)
    assert panel.launch_button.disabled  # nothing chosen yet
    panel.recipe.value = "lora_finetune"
    assert panel.config.options[0] == "tiny/lora"
    panel.config.value = "tiny/lora"
    panel.nproc.value = 2
    panel.overrides.value = "max_steps_per_epoch=4\n# comment\nmetric_logger.name=\"my run\"\n"
    expected = build_plan(["--nproc_per_node", "2", "lora_finetune", "--config", "tiny/lora",
                           "max_steps_per_epoch=4", "metric_logger.name=my run"], cwd=tmp_path).command_line()
    assert panel.command_preview.value == expected
    assert not panel.launch_button.disabled and panel.error.value == ""


def test_invalid_choices_show_the_builders_error_and_disable_launch(tmp_path):
    panel = Panel(cwd=tmp_path)
    panel.recipe.value = "lora_finetune"
    panel.config.value = "tiny/lora"
    for endpoint, words in [("node0:99999", "outside 0-65535"), (":29400", "empty host"), ("fe80::1", "brackets")]:
        panel.endpoint.value = endpoint
        assert panel.launch_button.disabled, endpoint
        assert words in panel.error.value
        assert panel.command_preview.value == ""
    panel.endpoint.value = ""
    panel.overrides.value = "not an override"
    assert panel.launch_button.disabled and "key=value" in panel.error.value


def test_gpus_listed_with_busy_ones_marked(tmp_path, fake_gpus, fake_running_job_on_gpu_1):
    panel = Panel(cwd=tmp_path)
    assert panel.gpus.options == (("0", 0), (f"1 (busy: {fake_running_job_on_gpu_1})", 1), ("2", 2), ("3", 3))
    panel.recipe.value = "lora_finetune"
    panel.config.value = "tiny/lora"
    panel.gpus.value = (2, 3)
    assert "CUDA_VISIBLE_DEVICES=2,3" in panel.command_preview.value
    assert "--nproc_per_node 2" in panel.command_preview.value


def test_recipe_and_config_files_under_the_working_directory_are_offered(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "my_recipe.py").write_text("")
    (tmp_path / "my.yaml").write_text("output_dir: /tmp/x\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "hidden.py").write_text("")
    panel = Panel(cwd=tmp_path)
    assert "sub/my_recipe.py" in panel.recipe.options and ".venv/hidden.py" not in panel.recipe.options
    panel.recipe.value = "sub/my_recipe.py"
    assert panel.config.options == ("my.yaml",)


# --- GPUs: none here ----------------------------------------------------------------------------


def test_without_gpus_the_picker_says_so_and_is_disabled(tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no nvidia-smi
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    panel = Panel(cwd=tmp_path)
    assert panel.gpus.options == () and panel.gpus.disabled and panel.gpus.layout.display == "none"
    assert "no GPU found (nvidia-smi was not found on PATH)" in panel.gpu_note.value
    assert panel.gpu_note.layout.display is None and panel.gpu_note.description == "GPUs"


def test_FAKE_failing_nvidia_smi_reason_is_shown(tmp_path, monkeypatch):
    write_fake_nvidia_smi(tmp_path / "bin", 0, fail="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    panel = Panel(cwd=tmp_path)
    assert panel.gpus.disabled and "no GPU found (" in panel.gpu_note.value
    assert "couldn&#x27;t communicate with the NVIDIA driver" in panel.gpu_note.value


def test_with_FAKE_gpus_there_is_no_note(tmp_path, fake_gpus):
    panel = Panel(cwd=tmp_path)
    assert not panel.gpus.disabled and panel.gpu_note.layout.display == "none" and panel.gpus.layout.display is None


# --- override lines with spaces -----------------------------------------------------------------


def test_an_override_value_with_spaces_needs_no_quotes_in_the_panel(tmp_path):
    panel = Panel(cwd=tmp_path)
    panel.recipe.value = "lora_finetune"
    panel.config.value = "tiny/lora"
    panel.overrides.value = "seed=1 epochs=2\nmetric_logger.name=my run  # note\n"
    assert panel.error.value == "" and not panel.launch_button.disabled
    assert panel.args()[-3:] == ["seed=1", "epochs=2", "metric_logger.name=my run"]
    assert panel.command_preview.value.endswith(
        build_plan(["lora_finetune", "--config", "tiny/lora", "seed=1", "epochs=2", "metric_logger.name=my run"],
                   cwd=tmp_path).command_line().split("tiny/lora.yaml", 1)[1])
    assert "'metric_logger.name=my run'" in panel.command_preview.value


# --- the comparison chart -----------------------------------------------------------------------


@pytest.mark.parametrize("lo, hi, ticks", [
    (1, 6, [1, 2, 3, 4, 5, 6]), (1, 1, [1]), (0, 8, [0, 2, 4, 6, 8]), (1, 40, [5, 10, 15, 20, 25, 30, 35, 40]),
    (3, 7, [3, 4, 5, 6, 7]), (1, 1000, [200, 400, 600, 800, 1000]), (100, 130, list(range(100, 131, 5))),
])
def test_int_ticks(lo, hi, ticks):
    from tune_magic.ui.charts import MAX_TICKS, int_ticks

    got = int_ticks(lo, hi)
    assert got == ticks and len(got) <= MAX_TICKS and len(set(got)) == len(got)
    assert all(isinstance(t, int) for t in got)


def _snap(steps, losses):
    from types import SimpleNamespace

    return SimpleNamespace(steps=tuple(steps), losses=tuple(losses))


def test_compare_chart_has_integer_ticks_a_legend_apart_and_full_names(tmp_path):
    long_name = "learning-rate-sweep-" + "x" * 30  # 50 characters: the picker cuts at 40 and says so
    ids = []
    for i, name in enumerate((long_name, "lr 2e-3")):
        rec = JobRecord(id=f"20990101-00000{i}-cmp00{i}", name=name, argv=["python", "x.py"], env={}, cwd="/",
                        log_path="/dev/null", started_at=time.time(), status="succeeded", ended_at=time.time(),
                        returncode=0)
        jobstore.create(rec, jobstore.jobs_root())
        ids.append(rec.id)
    panel = Panel(cwd=tmp_path)
    try:
        labels = dict((v, k) for k, v in panel.compare.options)
        assert labels[ids[0]] == f"{long_name[:40]}…  {ids[0]}" and labels[ids[1]] == f"lr 2e-3  {ids[1]}"
        assert panel.compare.layout.width == "100%"
        # nothing compared yet: no chart (never an empty 0..1 grid with 0 0 0 1 1 ticks), a line says why
        assert panel.chart.layout.display == "none" and "choose jobs" in panel.chart_note.value
        panel.compare.value = tuple(ids)
        for w in panel._watchers.values():
            w.stop()
        panel.series = {i: [] for i in ids}  # what the stopped watchers read (these jobs logged nothing)
        panel._set_ticks()
        assert panel.chart.layout.display == "none" and "waiting for the first step" in panel.chart_note.value
        panel._show(ids[0], _snap(range(1, 7), [3.0, 2.5, 2.0, 1.8, 1.5, 1.2]))
        panel._show(ids[1], _snap(range(1, 4), [3.0, 2.9, 2.8]))
        assert list(panel._x_axis.tick_values) == [1, 2, 3, 4, 5, 6]
        assert (panel._x.min, panel._x.max) == (1.0, 6.0)
        assert panel.chart.layout.display is None and panel.chart_note.value == ""
        assert [len(m.x) for m in panel.chart.marks] == [6, 3]
        assert all(not m.display_legend for m in panel.chart.marks)  # nothing drawn over the curves
        assert panel.legend.value.count("tm-legend-item") == 2 and "lr 2e-3 cmp001" in panel.legend.value
        assert panel.legend in panel.children and panel.children.index(panel.legend) < panel.children.index(panel.chart)
        panel._show(ids[0], _snap(range(1, 2), [3.0]))  # a single point: a unit-wide axis, integer ticks
        panel._show(ids[1], _snap(range(1, 2), [3.0]))
        assert list(panel._x_axis.tick_values) == [1, 2]
        panel.compare.value = (ids[1],)
        assert len(panel.chart.marks) == 1 and panel.legend.value.count("tm-legend-item") == 1
    finally:
        panel.close(timeout=None)  # a refresh under load may outlast 2 s, then write a summary
        for i in ids:
            jobstore.remove_tree(jobstore.job_dir(i))


def test_an_ended_job_is_charted_as_soon_as_it_is_chosen(tmp_path):
    # an ended job's curve is final: read once when chosen, so the chart a cell returns holds it
    # (a notebook run headless keeps only what the cell's own messages set); no thread for it
    ids = []
    for i, status in enumerate(("succeeded",)):
        log = tmp_path / f"log{i}.txt"
        log.write_text("".join(f"\r1|{k}|Loss: {4 - k / 2}: {k * 25}%|#| {k}/4" for k in range(1, 5)) + "\n")
        rec = JobRecord(id=f"20990101-00001{i}-end00{i}", name=f"j{i}", argv=["python", "x.py"], env={}, cwd="/",
                        log_path=str(log), started_at=time.time(), status=status,
                        ended_at=time.time() if status == "succeeded" else None, returncode=0 if i == 0 else None)
        jobstore.create(rec, jobstore.jobs_root())
        ids.append(rec.id)
    panel = Panel(cwd=tmp_path)
    try:
        panel.compare.value = (ids[0],)
        assert panel.series[ids[0]] == [(1, 3.5), (2, 3.0), (3, 2.5), (4, 2.0)]
        assert panel._watchers[ids[0]]._thread is None
        assert panel.chart.layout.display is None and panel.chart_note.value == ""
    finally:
        panel.close(timeout=None)  # a refresh under load may outlast 2 s, then write a summary
        for i in ids:
            jobstore.remove_tree(jobstore.job_dir(i))


def test_close_without_a_timeout_waits_for_the_refresh_under_way(tmp_path, monkeypatch):
    # CI: a refresh outlasting close()'s 2 s wrote a job's summary after the test removed its directory
    started, ended = {}, {}  # per table: other tests' panels may still be refreshing

    def slow_refresh(self):
        started.setdefault(id(self), threading.Event()).set()
        time.sleep(2.5)
        ended.setdefault(id(self), threading.Event()).set()

    monkeypatch.setattr(views, "TABLE_INTERVAL_S", 0.05)
    monkeypatch.setattr(views.JobsTable, "refresh_once", slow_refresh)
    panel = Panel(cwd=tmp_path)
    me = id(panel.jobs_table)
    wait_for(lambda: me in started, timeout=10, interval=0.05, what="the panel's table refreshing")
    panel.close(timeout=None)
    assert ended[me].is_set() and not panel.jobs_table._thread.is_alive()


# --- SLURM fields (FAKE sbatch and sinfo: no SLURM cluster in a unit test) ------------------------


@pytest.fixture
def fake_slurm_clients(tmp_path, monkeypatch):
    """FAKE ``sinfo`` (partitions ``debug*`` and ``gpu``) and ``sbatch`` (never called by a preview:
    it fails the test's launch if reached) first on PATH."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text('#!/bin/sh\n[ "$*" = "-h -o %P" ] || exit 2\nprintf "debug*\\ngpu\\ngpu\\n"\n')
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 'FAKE sbatch must not run in this test' >&2\nexit 3\n")
    for f in ("sinfo", "sbatch"):
        (bin_dir / f).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("TUNE_MAGIC_SCHEDULER", raising=False)
    return bin_dir


def test_no_slurm_fields_without_sbatch(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no sbatch (this machine may have a real one)
    panel = Panel(cwd=tmp_path)
    assert panel.schedulers_offered == ["local"] and panel.scheduler_fields == {}
    form = panel.children[0]
    assert panel.scheduler not in form.children
    assert not any("tm-slurm-fields" in getattr(c, "_dom_classes", ()) for c in form.children)
    assert panel.scheduler_options() == {}


def test_FAKE_sbatch_slurm_fields_preview_sbatch_line_and_script(tmp_path, fake_slurm_clients):
    import tune_magic

    panel = Panel(cwd=tmp_path)
    assert "slurm" in panel.schedulers_offered and panel.scheduler.value == "local"
    row = next(c for c in panel.children[0].children if panel.scheduler in getattr(c, "children", ()))
    assert panel.scheduler_note in row.children and panel.scheduler_note.value == ""  # sinfo answered: no note
    fields = panel.scheduler_fields["slurm"]
    # one field per option the SLURM scheduler declares, in its order
    assert list(fields) == ["nodes", "gpus_per_node", "cpus_per_node", "partition", "time_limit", "account", "requeue",
                            "resume_on_timeout", "sbatch"]
    box = next(c for c in panel.children[0].children if "tm-slurm-fields" in c._dom_classes)
    assert box.layout.display == "none" and panel.script_preview.layout.display == "none"
    panel.recipe.value = "lora_finetune"
    panel.config.value = "tiny/lora"
    panel.overrides.value = "max_steps_per_epoch=4\nmetric_logger.name=my run"
    assert panel.command_preview.value.startswith("PYTHONUNBUFFERED=1 ")  # local: the torchrun line
    panel.scheduler.value = "slurm"
    assert box.layout.display is None and panel.script_preview.layout.display is None
    assert fields["partition"].options == ("debug", "gpu")  # sinfo's, the default's * removed, the default first
    fields["nodes"].value = 2
    fields["cpus_per_node"].value = 4
    fields["partition"].value = "my-part"  # free text, not only sinfo's choices
    fields["time_limit"].value = "2:00:00"
    fields["account"].value = "proj1"
    fields["sbatch"].value = "--qos=high\n\n--exclusive\n"
    assert panel.scheduler_options() == {"scheduler": "slurm", "nodes": 2, "cpus_per_node": 4,
                                         "partition": "my-part", "time_limit": "2:00:00", "account": "proj1",
                                         "sbatch": ["--qos=high", "--exclusive"]}
    fields["requeue"].value = True  # issue 21's options come from the same rows
    fields["resume_on_timeout"].value = 2
    assert panel.scheduler_options()["requeue"] is True and panel.scheduler_options()["resume_on_timeout"] == 2
    fields["requeue"].value = False
    fields["resume_on_timeout"].value = 0
    assert not panel.launch_button.disabled, panel.error.value
    plan = tune_magic.launch(["lora_finetune", "--config", "tiny/lora", "max_steps_per_epoch=4",
                              "metric_logger.name=my run"], cwd=tmp_path, dry_run=True, **panel.scheduler_options())
    assert panel.command_preview.value == plan.command_line().replace(plan.job_id, "<job-id>")
    assert panel.script_preview.value == plan.batch_script.replace(plan.job_id, "<job-id>")
    # this test's home is under /tmp: the preview warns of it, with the same <job-id> as the preview
    warned = [html.unescape(w) for w in re.findall(r"<div class='tm-warning'[^>]*>(.*?)</div>", panel.error.value)]
    # (and of this run's own Python when the clone and its venv are under /tmp too)
    expected = 2 + len(own_python_warnings(plan, os.environ))
    assert warned == [w.replace(plan.job_id, "<job-id>") for w in plan.warnings] and len(warned) == expected, warned
    assert warned[0].startswith(f"output_dir {os.environ['TUNE_MAGIC_HOME']}/runs/tiny_lora/<job-id> "), warned
    line = panel.command_preview.value
    assert line.startswith("sbatch --parsable ") and line.endswith("/jobs/<job-id>/job.sbatch"), line
    head = panel.script_preview.value.splitlines()
    for part in ("--job-name=tune_magic-<job-id>", "--nodes=2", "--cpus-per-task=4", "--partition=my-part",
                 "--time=2:00:00", "--account=proj1", "--qos=high", "--exclusive"):
        assert f"#SBATCH {part}" in head, head
    assert panel.script_preview.value.startswith("#!/bin/bash\n") and "'metric_logger.name=my run'" in panel.script_preview.value
    # a bad time: the reason inline, Launch disabled
    fields["time_limit"].value = "2h"
    assert panel.launch_button.disabled and "2h" in panel.error.value and panel.script_preview.value == ""
    fields["time_limit"].value = "120"
    assert not panel.launch_button.disabled
    # back to local: the SLURM fields hide and the torchrun line returns
    panel.scheduler.value = "local"
    assert box.layout.display == "none" and panel.command_preview.value.startswith("PYTHONUNBUFFERED=1 ")


def test_FAKE_sbatch_choosing_local_when_the_default_scheduler_is_slurm_launches_locally(tmp_path, fake_slurm_clients,
                                                                                           monkeypatch):
    """The panel passes the scheduler chosen whenever it is not the one a launch uses anyway: with
    TUNE_MAGIC_SCHEDULER=slurm, choosing local must not give {} (which would submit to SLURM)."""
    monkeypatch.setenv("TUNE_MAGIC_SCHEDULER", "slurm")
    panel = Panel(cwd=tmp_path)
    assert panel.scheduler.value == "slurm" and panel.scheduler_options() == {}
    panel.scheduler.value = "local"
    assert panel.scheduler_options() == {"scheduler": "local"}
    panel.recipe.value, panel.config.value = "lora_finetune", "tiny/lora"
    assert panel.command_preview.value.startswith("PYTHONUNBUFFERED=1 ") and "lora_finetune.py --config" in panel.command_preview.value
    assert panel.script_preview.value == ""


def test_FAKE_sbatch_launch_passes_the_slurm_fields_to_launch(tmp_path, fake_slurm_clients, monkeypatch):
    from tune_magic.ui import panel as panel_mod

    calls = []
    real = panel_mod.launch

    def spy(args, **kw):
        calls.append((list(args), kw))
        return real(args, **{**kw, "dry_run": True})  # what would be submitted, submitted nowhere

    monkeypatch.setattr(panel_mod, "launch", spy)
    panel = Panel(cwd=tmp_path)
    panel.recipe.value = "lora_finetune"
    panel.config.value = "tiny/lora"
    panel.scheduler.value = "slurm"
    fields = panel.scheduler_fields["slurm"]
    fields["nodes"].value = 3
    fields["gpus_per_node"].value = 8
    fields["partition"].value = "gpu"
    panel.name.value = "big one"
    calls.clear()
    panel.launch_button.click()
    (args, kw), = calls
    assert args == ["lora_finetune", "--config", "tiny/lora"]
    assert kw == {"name": "big one", "gpus": None, "cwd": tmp_path, "scheduler": "slurm", "nodes": 3,
                  "gpus_per_node": 8, "partition": "gpu"}
    assert "dry run" in panel.error.value and panel.launched == []


@pytest.mark.parametrize("script, expected", [
    ('printf "debug*\\ngpu\\n"', ["debug", "gpu"]),
    ('printf "a\\nb*\\n"', ["b", "a"]),
    ('echo "sinfo: error: Could not establish a configuration source" >&2; exit 1', []),
    ("sleep 5", []),  # longer than SINFO_TIMEOUT_S (0.5 s here)
])
def test_FAKE_sinfo_partitions(tmp_path, monkeypatch, script, expected):
    from tune_magic.schedulers.slurm import options as sinfo

    (tmp_path / "sinfo").write_text(f"#!/bin/sh\n{script}\n")
    (tmp_path / "sinfo").chmod(0o755)
    monkeypatch.setattr(sinfo, "SINFO_TIMEOUT_S", 0.5)
    assert sinfo.partitions({"PATH": str(tmp_path)}) == expected
    assert sinfo.partitions({"PATH": str(tmp_path / "nowhere")}) == []


def test_a_scheduler_whose_controller_does_not_answer_is_offered_with_a_note_next_to_it(tmp_path, monkeypatch):
    """The real sinfo and sbatch of this machine, with a config whose controller port nobody listens on."""
    import shutil
    import socket

    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        pytest.skip("SLURM's client tools are not installed (scripts/test installs them with TUNE_MAGIC_INSTALL_SLURM=1)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nobody answers there
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=nowhere\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={port}\n"
                    "AuthType=auth/none\nMessageTimeout=1\nTCPTimeout=1\nNodeName=n1 CPUs=1 State=UNKNOWN\n"
                    "PartitionName=debug Nodes=n1 Default=YES\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.delenv("TUNE_MAGIC_SCHEDULER", raising=False)
    panel = Panel(cwd=tmp_path)
    assert "slurm" in panel.schedulers_offered  # offered: sbatch is there (a launch would say what sbatch says)
    row = next(c for c in panel.children[0].children if panel.scheduler in getattr(c, "children", ()))
    assert panel.scheduler_note in row.children  # next to the choice
    note = re.sub(r"<[^>]+>", "", panel.scheduler_note.value)
    assert note == ("slurm: sbatch is here, but no SLURM controller answers (slurm_load_partitions: Unable to contact "
                    "slurm controller (connect failure)): a job sent to slurm would not start"), note


def test_the_endpoint_field_is_for_the_local_scheduler_only_and_the_preview_has_the_rows_it_needs(
        tmp_path, fake_slurm_clients):
    from tune_magic.ui.panel import preview_rows

    panel = Panel(cwd=tmp_path)
    panel.recipe.value = "lora_finetune"
    panel.config.value = "tiny/lora"
    panel.endpoint.value = "node0:29400"
    assert panel.endpoint.layout.display is None and panel.args()[:2] == ["--rdzv-endpoint", "node0:29400"]
    local = panel.command_preview.value
    assert panel.command_preview.rows == preview_rows(local) >= len(local) // 56 + 2
    assert panel.command_preview.layout.height is None  # no fixed height to cut the last line off
    panel.scheduler.value = "slurm"
    assert panel.endpoint.layout.display == "none"  # the scheduler picks the rendezvous
    assert "--rdzv-endpoint" not in panel.args() and "node0" not in panel.script_preview.value
    panel.scheduler.value = "local"
    assert panel.endpoint.layout.display is None and panel.command_preview.value == local
    assert [preview_rows(t) for t in ("", "x" * 56, "x" * 57, "a\nb\nc\nd", "x" * 10_000)] == [3, 3, 3, 5, 24]
    # wrapped at spaces: a word that does not fit starts a new row
    assert [preview_rows(t) for t in ("a " * 28, "x" * 50 + " " + "y" * 50, "x" * 50 + " " + "y" * 120)] == [3, 3, 5]
