"""The README's demo: what two concurrent multi-GPU jobs on one node would launch.

Until the notebook demo lands, it prints the launch plans of two concurrent
``--nproc_per_node 2 lora_finetune_distributed --config llama3_2/1B_lora`` jobs on GPUs 0,1 and
2,3, built exactly as a launch would build them (fresh job ids, per-job output dirs, automatic ports).
"""

from __future__ import annotations

from typing import Sequence

from .command import build_plan
from .ids import new_job_id

DEMO_ARGS = "--nproc_per_node 2 lora_finetune_distributed --config llama3_2/1B_lora"


def main(argv: Sequence[str] = ()) -> int:
    """Print both plans; return 0."""
    print(f"Two jobs from one config on one node: %%tune_run --gpus G {DEMO_ARGS}\n")
    for gpus in ("0,1", "2,3"):
        plan = build_plan(DEMO_ARGS, gpus=gpus, job_id=new_job_id())
        print(f"# job {plan.job_id} on GPUs {gpus}: rendezvous={plan.rendezvous} "
              f"(OS-chosen port), output_dir={plan.output_dir}")
        print(plan.command_line(), end="\n\n")
    return 0
