"""The magics in a real Jupyter kernel (ipykernel started by jupyter_client, as JupyterLab does).

Covers field cases 8, 10, 11, 14, 15 and 16: jobs survive an interrupt of the kernel's process
group and a kernel restart, background threads never print into cells, a job printing 300,000 lines
stays within Jupyter server's IOPub limits, and child output goes to a file, never the kernel.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

import tune_magic.job as J
from tune_magic.schedulers.local import procs

from jobhelpers import processes_mentioning, toy_args, write_fake_nvidia_smi
from kernelhelpers import IOPubCounter, Kernel
from waiting import wait_for

TIMEOUT = 240
# Jupyter server's defaults (ServerApp.iopub_msg_rate_limit / iopub_data_rate_limit, 3 s window)
IOPUB_MSG_LIMIT_PER_S = 1000
IOPUB_BYTES_LIMIT_PER_S = 1_000_000


@pytest.fixture
def kernel(tmp_path):
    write_fake_nvidia_smi(tmp_path / "fakebin", 4)  # FAKE GPUs for case 8: there is no GPU here
    k = Kernel(cwd=str(tmp_path), env={"PATH": f"{tmp_path / 'fakebin'}{os.pathsep}{os.environ['PATH']}"})
    yield k
    k.shutdown()


def launch_in(kernel: Kernel, line: str, body: str | None = None) -> str:
    code = f"%%tune_run {line}\n{body}" if body else f"%tune_run {line}"
    kernel.run(code)
    return kernel.value("_.id")


def test_interrupt_restart_and_no_prints_from_threads(kernel):
    kernel.run("%load_ext tune_magic")
    # case 8: nothing in the kernel may initialise CUDA, so make any torch.cuda call fail loudly
    kernel.run(
        "import torch\n"
        "def _boom(*a, **k):\n    raise RuntimeError('torch.cuda touched in the kernel')\n"
        "for _n in ('init', '_lazy_init', 'is_available', 'device_count', 'current_device'):\n"
        "    setattr(torch.cuda, _n, _boom)\n"
    )
    out = kernel.run(f"%tune_run --name survivor --gpus 2,3 {toy_args('steps=60', 'step_s=0.25', nproc=None)}")
    job_id = kernel.value("_.id")
    widget_views = [d for d in out.data if "application/vnd.jupyter.widget-view+json" in d]
    assert widget_views, "the card was not displayed as a widget"
    # case 16: the job's own output went to its log file, not into the cell
    assert "Writing logs to" not in out.stdout + out.stderr
    job = J.get_job(job_id)
    assert job.gpus == [2, 3]

    # case 14: while the card's thread updates it, another cell's output stays empty
    card_step = f"getattr(__import__('tune_magic.ui.cards').ui.cards.JobCard.for_job('{job_id}').snapshot, 'step', None)"
    wait_for(lambda: kernel.value(card_step) is not None, timeout=TIMEOUT, interval=0.5, what="a step on the card")
    before = kernel.value(card_step)
    quiet = kernel.run("import time; time.sleep(3); print('only this')")
    assert quiet.stdout == "only this\n" and quiet.stderr == "" and quiet.data == []
    assert kernel.value(card_step) > before  # the thread did update the card meanwhile

    # case 10: SIGINT to the kernel's process group interrupts the cell, not the job
    msg_id = kernel.kc.execute("import time; time.sleep(60)")
    time.sleep(1.5)
    kernel.interrupt_process_group()
    reply = kernel.kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["ename"] == "KeyboardInterrupt"
    time.sleep(1)
    assert job.status == "running"
    assert all(procs.alive(w) for w in job.refresh().record.workers)

    # case 11: restart the kernel; the job is still listed, followed and stoppable
    kernel.restart()
    kernel.run("%load_ext tune_magic")
    table = kernel.run("%tune_jobs")
    row = next(l for d in table.data for l in d.get("text/plain", "").splitlines() if l.startswith(job_id))
    assert row.split()[1:3] == ["survivor", "running"]
    kernel.run(f"%tune_logs {job_id}")
    first = kernel.value(f"__import__('tune_magic.ui.cards').ui.cards.JobCard.for_job('{job_id}').watcher.poll_once().step")
    time.sleep(2)
    later = kernel.value(f"__import__('tune_magic.ui.cards').ui.cards.JobCard.for_job('{job_id}').watcher.poll_once().step")
    assert later > first  # still followed after the restart
    stopped = kernel.run(f"%tune_stop {job_id}")
    assert stopped.stdout.strip() == f"{job_id} stopped"
    assert job.status == "stopped"
    wait_for(lambda: not processes_mentioning(job_id), timeout=30, interval=0.2, what=f"no process of {job_id}",
             describe=lambda: processes_mentioning(job_id))


def test_300k_lines_stay_within_iopub_limits(kernel):
    kernel.run("%load_ext tune_magic")
    counter = IOPubCounter(kernel)
    start = time.monotonic()
    job_id = launch_in(kernel, "--name chatty " + toy_args("steps=5", "step_s=0.5", "lines_per_step=60000"))
    job = J.get_job(job_id)
    assert job.wait(TIMEOUT) == "succeeded"
    card = f"__import__('tune_magic.ui.cards').ui.cards.JobCard.for_job('{job_id}')"
    wait_for(lambda: kernel.value(f"{card}.watcher.finished"), timeout=TIMEOUT, interval=0.5,
             what="the card to read the log to its end")
    time.sleep(0.5)
    end = time.monotonic()
    log_lines = sum(1 for _ in open(job.log_path, "rb"))
    assert log_lines >= 300_000
    tail = kernel.value(f"{card}.log_tail.value")
    counter.stop()
    assert "toy recipe done" in tail
    assert len(tail) < 20_000  # a bounded tail, not the log
    updates = [e for e in counter.events if start <= e[0] <= end and e[2] == "comm_msg"]
    assert len(updates) > 0
    msgs_per_s, bytes_per_s = counter.worst_window(start, end)
    assert msgs_per_s < IOPUB_MSG_LIMIT_PER_S, msgs_per_s
    assert bytes_per_s < IOPUB_BYTES_LIMIT_PER_S, bytes_per_s


def test_lora_job_card_shows_the_losses_the_recipe_logged(kernel, tiny_assets):
    kernel.run("%load_ext tune_magic")
    job_id = launch_in(kernel, "--nproc_per_node 2 lora_finetune --config tiny/lora",
                       "# a YAML body merged over tiny/lora\nmax_steps_per_epoch: 5\nseed: 7\n")
    job = J.get_job(job_id)
    assert job.wait(TIMEOUT) == "succeeded", job.tail(30)
    time.sleep(1.5)
    shown = kernel.value(f"list(__import__('tune_magic.ui.cards').ui.cards.JobCard.for_job('{job_id}').snapshot.losses)")
    logged = [float(m) for m in re.findall(r"^Step \d+ \| loss:(\S+) ", next(Path(job.record.metric_log_dir).glob("log_*.txt")).read_text(), re.M)]
    assert len(logged) == 5
    assert shown == pytest.approx(logged)


def test_empty_cell_magic_runs_as_the_line_magic_in_a_real_kernel(tmp_path):
    k = Kernel(cwd=str(tmp_path))
    try:
        k.run("%load_ext tune_magic")
        out = k.run(f"%%tune_run --dry-run {toy_args('steps=3', nproc=None)}\n")
        assert "steps=3" in out.stdout and out.error is None
        assert k.value("type(_).__name__") == "LaunchPlan"
    finally:
        k.shutdown()
