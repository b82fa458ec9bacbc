"""Build the 23.11 ``squeue --json`` samples from the recorded 22.05 ones (run by hand).

    .venv/bin/python tests/slurm/make_squeue_23_11.py

There is no SLURM 23.11 on this machine (Debian 12 ships 22.05), so the 23.11 samples in
tests/data/slurm/ are CONSTRUCTED: the same jobs as the recorded 22.05 samples, each field
rewritten the way SLURM 23.11's data_parser/v0.0.40 dumps it (``PARSER_ARRAY(JOB_INFO)`` and
``DUMP_FUNC(PROCESS_EXIT_CODE)`` in src/plugins/data_parser/v0.0.40/parsers.c, tag
slurm-23-11-1-1), and checked against the shape of a real 23.11.1 ``/slurm/v0.0.40/jobs``
response (DiamondLightSource/python-zocalo, tests/util/test_slurm.py):

- ``job_state``: a list, the base state first, then its flags (``["CANCELLED", "COMPLETING"]``);
- ``*_NO_VAL`` numbers and timestamps: ``{"set": bool, "infinite": bool, "number": n}``;
- ``exit_code`` / ``derived_exit_code``: ``{"status": [...], "return_code": {...},
  "signal": {"id": {...}, "name": "TERM"}}`` instead of the raw wait status.

The ended sample also gets two jobs no run here can make, marked by their names:
``constructed_completing`` (a cancelled job whose processes are still ending) and
``constructed_out_of_memory`` (OUT_OF_MEMORY needs cgroup memory enforcement).
"""

from __future__ import annotations

import copy
import json
import signal
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"

# fields of JOB_INFO dumped as UINT16/UINT32_NO_VAL, FLOAT64_NO_VAL or TIMESTAMP_NO_VAL in v0.0.40
NO_VAL_FIELDS = """
accrue_time array_job_id array_task_id array_max_tasks cores_per_socket billable_tres cpus_per_task
cpu_frequency_minimum cpu_frequency_maximum cpu_frequency_governor deadline delay_boot eligible_time
end_time het_job_id het_job_offset last_sched_evaluation max_cpus max_nodes tasks_per_core
tasks_per_tres tasks_per_node tasks_per_socket tasks_per_board cpus node_count tasks
minimum_cpus_per_node minimum_tmp_disk_per_node preempt_time preemptable_time pre_sus_time priority
resize_time sockets_per_node start_time submit_time suspend_time time_limit time_minimum
threads_per_core memory_per_cpu memory_per_node
""".split()


def no_val(value, infinite_if_none: bool = False) -> dict:
    if value is None:
        return {"set": False, "infinite": infinite_if_none, "number": 0}
    return {"set": True, "infinite": False, "number": value}


def exit_code(status) -> dict:
    """DUMP_FUNC(PROCESS_EXIT_CODE) of 23.11 for a raw wait status."""
    unset = {"set": False, "infinite": False, "number": 0}
    if status is None:
        return {"status": ["PENDING"], "return_code": unset, "signal": {"id": unset, "name": ""}}
    if status & 0x7F == 0:
        code = (status >> 8) & 0xFF
        return {"status": ["ERROR" if code else "SUCCESS"], "return_code": no_val(code),
                "signal": {"id": unset, "name": ""}}
    sig = status & 0x7F
    return {"status": ["SIGNALED"], "return_code": unset,
            "signal": {"id": no_val(sig), "name": signal.Signals(sig).name.removeprefix("SIG")}}


def convert_job(job: dict) -> dict:
    out = copy.deepcopy(job)
    out["job_state"] = [job["job_state"]]
    for name in NO_VAL_FIELDS:
        if name in out and not isinstance(out[name], dict):
            out[name] = no_val(out[name], infinite_if_none=name == "time_limit")
    out["exit_code"] = exit_code(job.get("exit_code"))
    out["derived_exit_code"] = exit_code(job.get("derived_exit_code"))
    return out


def convert(doc: dict) -> dict:
    return {
        "jobs": [convert_job(j) for j in doc["jobs"]],
        "last_backfill": no_val(None),
        "last_update": no_val(1796083200),
        "meta": {
            "plugin": {"type": "", "name": "", "data_parser": "data_parser/v0.0.40", "accounting_storage": ""},
            "client": {"source": "/dev/pts/0", "user": "root", "group": "root"},
            "command": ["squeue", "--json"],
            "slurm": {"version": {"major": "23", "micro": "1", "minor": "11"}, "release": "23.11.1", "cluster": "constructed"},
        },
        "errors": doc.get("errors", []),
        "warnings": [],
    }


def main() -> None:
    for name in ("live", "ended"):
        doc = convert(json.loads((DATA / f"squeue_22.05_{name}.json").read_text()))
        if name == "ended":
            by_name = {j["name"]: j for j in doc["jobs"]}
            completing = copy.deepcopy(by_name["cancelled"])
            completing.update(job_id=101, name="constructed_completing", job_state=["CANCELLED", "COMPLETING"])
            oom = copy.deepcopy(by_name["failed"])
            oom.update(job_id=102, name="constructed_out_of_memory", job_state=["OUT_OF_MEMORY"], state_reason="OutOfMemory")
            oom["exit_code"] = exit_code(9)  # the OOM killer's SIGKILL
            doc["jobs"] += [completing, oom]
        (DATA / f"squeue_23.11_{name}_constructed.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {DATA}/squeue_23.11_*_constructed.json")


if __name__ == "__main__":
    main()
