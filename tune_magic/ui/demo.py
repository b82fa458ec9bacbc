"""The README's demo (``tune-magic demo``, ``scripts/demo``).

By default it executes ``notebooks/quickstart.ipynb`` in a real Jupyter kernel (nbclient), exactly as
a newcomer would run it cell by cell: two 2-process ``lora_finetune --config tiny/lora`` jobs side by
side, then a long job stopped with ``%tune_stop``. It then prints each job's name, id, status, final
loss, rendezvous port and wall time, and where the executed notebook was written.

``tune-magic demo --plans`` prints, without starting anything, the launch plans of two concurrent
``--nproc_per_node 2 lora_finetune_distributed --config llama3_2/1B_lora`` jobs on GPUs 0,1 and 2,3.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from tune_magic.job.launch import build_plan
from tune_magic.registry.ids import new_job_id

DEMO_ARGS = "--nproc_per_node 2 lora_finetune_distributed --config llama3_2/1B_lora"
#: The notebook the demo executes, in the repository's ``notebooks/`` folder.
NOTEBOOK = "quickstart.ipynb"
#: Seconds any one cell may run.
CELL_TIMEOUT_S = 600


def repo_root() -> Path:
    """The checkout this package is installed from (an editable install): the package's parent."""
    return Path(__file__).resolve().parents[2]


def find_notebook(name: str = NOTEBOOK) -> Path | None:
    """``notebooks/<name>`` in the checkout, or ``None`` when not there (e.g. a wheel install)."""
    path = repo_root() / "notebooks" / name
    return path if path.is_file() else None


def print_plans() -> int:
    """Print the two multi-GPU launch plans; return 0."""
    print(f"Two jobs from one config on one node: %%tune_run --gpus G {DEMO_ARGS}\n")
    for gpus in ("0,1", "2,3"):
        plan = build_plan(DEMO_ARGS, gpus=gpus, job_id=new_job_id())
        print(f"# job {plan.job_id} on GPUs {gpus}: rendezvous={plan.rendezvous} "
              f"(OS-chosen port), output_dir={plan.output_dir}")
        print(plan.command_line(), end="\n\n")
    return 0


def final_loss(job) -> tuple[int | None, float | None]:
    """(step, loss) of the job's last logged loss, or ``(None, None)``, from its summary (never
    the whole log)."""
    s = job.summary()
    return s.step, s.loss


def summary(jobs: Sequence) -> str:
    """A plain-text table of ``jobs``: name, id, status, steps, final loss, rendezvous port, wall time."""
    rows = [("NAME", "ID", "STATUS", "STEP", "FINAL LOSS", "PORT", "WALL")]
    for job in jobs:
        step, loss = final_loss(job)
        endpoint = job.rendezvous_endpoint
        rows.append((job.name, job.id, job.status.label, "-" if step is None else str(step),
                     "-" if loss is None else f"{loss:.4f}",
                     endpoint.rsplit(":", 1)[-1] if endpoint else "-", f"{job.elapsed_s:.1f} s"))
    from tune_magic.ui.textfmt import table

    return "\n".join(table(rows))


def run_notebook(src: Path, out: Path, workdir: Path, *, timeout: int = CELL_TIMEOUT_S,
                 progress=None, kernel_log: Path | None = None):
    """Execute the notebook ``src`` in a fresh ``python3`` kernel whose working directory is
    ``workdir``; write the executed notebook to ``out`` (also when a cell fails).

    Returns:
        The executed notebook.

    Raises:
        nbclient.exceptions.CellExecutionError: a cell failed (``out`` has the outputs so far).
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(src, as_version=4)
    start = time.monotonic()

    def on_cell(cell, **_):  # nbclient passes cell_index= and more by keyword
        if progress is not None and cell.cell_type == "code" and cell.source.strip():
            progress(f"  [{time.monotonic() - start:5.1f} s] {cell.source.strip().splitlines()[0][:100]}")

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(workdir)}}, on_cell_execute=on_cell)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = open(kernel_log, "w") if kernel_log is not None else None  # the kernel's own stderr (log noise)
    try:
        client.execute(**({"stderr": log} if log else {}))
    finally:
        if log is not None:
            log.close()
        nbformat.write(nb, out)
    return nb


def run_demo(out: Path | None = None, notebook: Path | None = None) -> int:
    """Execute the quickstart notebook and print the summary; return the exit status."""
    src = notebook or find_notebook()
    if src is None or not src.is_file():
        where = notebook or repo_root() / "notebooks" / NOTEBOOK
        print(f"tune-magic demo: error: {where} not found. The demo runs the quickstart notebook of a "
              f"tune_magic checkout (pip install -e . from the repository, then scripts/demo); "
              f"tune-magic demo --plans works anywhere.", file=sys.stderr)
        return 2
    missing = [m for m in ("nbclient", "nbformat") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"tune-magic demo: error: {missing[0]} is not installed; pip install 'tune_magic[test]' "
              f"(or nbclient nbformat ipykernel)", file=sys.stderr)
        return 2
    from nbclient.exceptions import CellExecutionError

    from tune_magic.job import jobs
    from tune_magic.paths import home

    if out is None:  # the checkout's test-artifacts/ is git-ignored
        out = repo_root() / "test-artifacts" / f"{src.stem}.executed.ipynb"
    out = out.absolute()
    root = home() / "demo"
    root.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=root))
    print(f"Running {src.name} in a Jupyter kernel (working directory {workdir}); about a minute or two.",
          flush=True)

    def ours():
        return [j for j in jobs() if j.record.cwd == str(workdir)]

    start = time.monotonic()
    status = 0
    try:
        run_notebook(src, out, workdir, progress=lambda s: print(s, flush=True),
                     kernel_log=workdir / "kernel.log")
    except CellExecutionError as exc:
        status = 1
        print(f"\ntune-magic demo: a cell failed:\n{str(exc).strip()[-2000:]}", file=sys.stderr)
    except KeyboardInterrupt:
        status = 130
        print("\ntune-magic demo: interrupted", file=sys.stderr)
    finally:
        for job in ours():  # a failed or interrupted run leaves nothing running
            if job.status.is_live:
                print(f"stopping job {job.id}: {job.stop(grace_s=5)}", file=sys.stderr)
    wall = time.monotonic() - start
    listed = ours()
    print(f"\n{src.name} ran in {wall:.0f} s; its {len(listed)} jobs:\n")
    if listed:
        print(summary(listed))
    print(f"\nExecuted notebook: {out}")
    return status


def main(argv: Sequence[str] = ()) -> int:
    """``tune-magic demo [--plans] [--out PATH] [--notebook PATH]``; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="tune-magic demo",
        description="Run notebooks/quickstart.ipynb in a Jupyter kernel (two 2-process LoRA jobs side by "
                    "side on CPU, then a long job stopped) and summarise its jobs.")
    parser.add_argument("--plans", action="store_true",
                        help="only print the launch plans of two concurrent 2-GPU jobs on GPUs 0,1 and 2,3")
    parser.add_argument("--out", type=Path,
                        help="where to write the executed notebook (default: test-artifacts/quickstart.executed.ipynb "
                             "in the checkout)")
    parser.add_argument("--notebook", type=Path, help=argparse.SUPPRESS)
    ns = parser.parse_args(list(argv))
    if ns.plans:
        return print_plans()
    return run_demo(ns.out, ns.notebook)
