"""Record real squeue output from the test cluster into tests/data/slurm/ (run by hand, as root).

    .venv/bin/python tests/slurm/record_squeue.py [--with-timeout]

Starts a private two-node cluster (tests/slurmcluster.py) and records, for the parser tests:

- ``squeue_<ver>_live.json`` / ``.txt``: ``squeue --jobs=A,B,C --json`` and the plain
  ``--format`` fallback while job A runs on both nodes, B (two nodes) is PENDING for Resources
  and C is PENDING for Priority.
- ``squeue_<ver>_ended.json`` / ``.txt``: the same for ended jobs still within MinJobAge:
  COMPLETED, FAILED (exit 3), CANCELLED, NODE_FAIL (its node set DOWN under it), and with
  ``--with-timeout`` also TIMEOUT (``--time=1``: adds about 90 s).
- ``squeue_<ver>_unknown_id.txt``: what squeue says for a job id it does not know, alone and
  next to a known one.

<ver> is the installed SLURM version (e.g. 22.05). Everything is recorded verbatim.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))

from slurmcluster import start_cluster  # noqa: E402
from tune_magic.schedulers.slurm.status import squeue_argv  # noqa: E402

OUT = HERE.parent / "data" / "slurm"


def main() -> None:
    with_timeout = "--with-timeout" in sys.argv
    OUT.mkdir(parents=True, exist_ok=True)
    c = start_cluster("netns")
    try:
        ver = c.client(["sinfo", "--version"]).stdout.split()[1]
        ver = ".".join(ver.split(".")[:2])

        def sbatch(*args: str) -> str:
            done = c.client(["sbatch", "--parsable", f"--output={c.shared_dir}/%j.out", *args])
            return done.stdout.strip().split(";")[0]

        def squeue(ids: list[str], name: str) -> None:
            js = c.client(squeue_argv(ids))
            (OUT / f"squeue_{ver}_{name}.json").write_text(json.dumps(json.loads(js.stdout), indent=1) + "\n")
            txt = c.client(squeue_argv(ids, json_output=False))
            (OUT / f"squeue_{ver}_{name}.txt").write_text(txt.stdout)

        def wait_state(job: str, want: str, timeout: float = 150) -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                st = c.client(["squeue", f"--jobs={job}", "--noheader", "--states=all", "--format=%T"], check=False)
                if st.stdout.strip() == want:
                    return
                time.sleep(0.3)
            raise SystemExit(f"job {job} not {want} after {timeout} s")

        a = sbatch("--nodes=2", "--exclusive", "--job-name=tune_magic-20261201-000000-aaaaaa", "--wrap=sleep 300")
        wait_state(a, "RUNNING")
        b = sbatch("--nodes=2", "--job-name=tune_magic-20261201-000001-bbbbbb", "--time=2:00:00", "--wrap=true")
        cc = sbatch("--nodes=1", "--job-name=tune_magic-20261201-000002-cccccc", "--wrap=true")
        time.sleep(3)  # one scheduling pass, so each pending job has its reason
        squeue([a, b, cc], "live")
        c.client(["scancel", a, b, cc])

        ok = sbatch("--nodes=2", "--job-name=completed", "--wrap=srun true")
        bad = sbatch("--nodes=2", "--job-name=failed", "--wrap=exit 3")
        cancelled = sbatch("--nodes=2", "--job-name=cancelled", "--wrap=sleep 300")
        for job, state in ((ok, "COMPLETED"), (bad, "FAILED")):
            wait_state(job, state)
        wait_state(cancelled, "RUNNING")
        c.client(["scancel", cancelled])
        wait_state(cancelled, "CANCELLED")
        nodefail = sbatch("--nodes=2", "--no-requeue", "--job-name=node_fail", "--wrap=sleep 300")
        wait_state(nodefail, "RUNNING")
        node = c.node_names[1]
        c.client(["scontrol", "update", f"nodename={node}", "state=down", "reason=recorded NODE_FAIL"])
        wait_state(nodefail, "NODE_FAIL")
        # (a requeueable job would go back to PENDING instead; with ReturnToService=2 the node is
        # back as soon as its slurmd registers again, so a failing resume is fine)
        c.client(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        ended = [ok, bad, cancelled, nodefail]
        if with_timeout:
            timeout = sbatch("--nodes=1", "--time=1", "--job-name=timeout", "--wrap=sleep 300")
            wait_state(timeout, "TIMEOUT", timeout=200)
            ended.append(timeout)
        time.sleep(1)
        squeue(ended, "ended")

        lines = []
        for ids in (["999999"], ["999999", ok]):
            for argv in (squeue_argv(ids), squeue_argv(ids, json_output=False)):
                done = c.client(argv, check=False)
                out = done.stdout
                if "--json" in argv and out.strip():
                    out = f"<JSON with job ids {[j['job_id'] for j in json.loads(out)['jobs']]}>"
                lines.append(f"$ {' '.join(argv)}\nexit {done.returncode}\nstdout: {out!r}\nstderr: {done.stderr!r}\n")
        (OUT / f"squeue_{ver}_unknown_id.txt").write_text("".join(lines))
        print(f"recorded SLURM {ver} into {OUT}")
    finally:
        c.stop()


if __name__ == "__main__":
    main()
