"""Row 6: K concurrent 2-process toy jobs through tune_magic (each gets ``--standalone``, an
OS-chosen rendezvous port) vs the same K jobs with one fixed ``--master_port``.

For each K and trial, K jobs are launched back to back with ``tune_magic.launch`` and waited for.
Counted: jobs that succeeded, rendezvous collisions (a failure whose ``job.error`` or log mentions
``EADDRINUSE``/address in use, or two concurrent jobs reporting the same endpoint), and per-job
wall time (the supervisor's ``ended_at - started_at``). Anchor: the same K jobs, each given
``--master_port P`` with P a free port chosen for the trial (tune_magic keeps a user's port as is).
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.common import (REPO, free_port, leftovers, log, median, row, row_main, spread, stop_all,
                          toy_args)

KEY, NUMBER = "concurrency", "6"
METRIC = "Concurrency: K concurrent 2-process jobs, all succeed, no rendezvous collision"
_ADDR = ("EADDRINUSE", "address already in use", "Address already in use")


def _addr_in_use(job) -> tuple[bool, bool]:
    """(EADDRINUSE in job.error, EADDRINUSE anywhere in the job's log)."""
    err = job.error or ""
    text = Path(job.log_path).read_text(errors="replace") if Path(job.log_path).exists() else ""
    return any(a in err for a in _ADDR), any(a in text for a in _ADDR)


def batch(k: int, fixed_port: int | None, jobs_all: list) -> dict:
    import tune_magic

    torchrun = f"--master_port {fixed_port}" if fixed_port else ""
    args = toy_args("steps=3", "step_s=0.2", torchrun=torchrun)
    t0 = time.perf_counter()
    # force: tune_magic refuses a fixed port a running job uses; the anchor shows what happens without that
    jobs = [tune_magic.launch(args, cwd=REPO, name=f"k{k}-{i}", force=bool(fixed_port)) for i in range(k)]
    jobs_all += jobs
    for job in jobs:
        job.wait(timeout=600)
    batch_wall = time.perf_counter() - t0
    out = {"k": k, "fixed_port": fixed_port, "batch_wall_s": batch_wall, "jobs": []}
    for job in jobs:
        in_error, in_log = _addr_in_use(job)
        out["jobs"].append({"id": job.id, "status": job.status, "wall_s": job.ended_at - job.started_at,
                            "endpoint": job.rendezvous_endpoint, "error": job.error,
                            "eaddrinuse_in_error": in_error, "eaddrinuse_in_log": in_log})
    eps = [j["endpoint"] for j in out["jobs"] if j["endpoint"]]
    out["succeeded"] = sum(j["status"] == "succeeded" for j in out["jobs"])
    out["failed"] = sum(j["status"] == "failed" for j in out["jobs"])
    out["eaddrinuse_in_error"] = sum(j["eaddrinuse_in_error"] for j in out["jobs"])
    out["eaddrinuse_in_log"] = sum(j["eaddrinuse_in_log"] for j in out["jobs"])
    out["duplicate_endpoints"] = len(eps) - len(set(eps))
    return out


def run(quick: bool) -> list[dict]:
    ks = (1, 2) if quick else (1, 2, 4)
    trials = 1 if quick else 3
    jobs: list = []
    ours: dict[int, list] = {k: [] for k in ks}
    fixed: dict[int, list] = {k: [] for k in ks}
    try:
        for trial in range(trials):
            for k in ks:
                b = batch(k, None, jobs)
                ours[k].append(b)
                log(f"trial {trial} K={k} tune_magic: {b['succeeded']}/{k} ok, walls "
                    f"{[round(j['wall_s'], 2) for j in b['jobs']]}, endpoints {[j['endpoint'] for j in b['jobs']]}")
                if k > 1 or not quick:
                    f = batch(k, free_port(), jobs)
                    fixed[k].append(f)
                    log(f"trial {trial} K={k} fixed port {f['fixed_port']}: {f['succeeded']}/{k} ok, "
                        f"EADDRINUSE in error {f['eaddrinuse_in_error']}, in log {f['eaddrinuse_in_log']}, "
                        f"errors {[j['error'] for j in f['jobs']]}")
    finally:
        stop_all(jobs)
    left = leftovers([j.id for j in jobs])

    def tally(batches):
        n = sum(b["k"] for b in batches)
        ok = sum(b["succeeded"] for b in batches)
        return n, ok

    n_all = sum(tally(ours[k])[0] for k in ks)
    ok_all = sum(tally(ours[k])[1] for k in ks)
    collisions = sum(b["eaddrinuse_in_log"] + b["duplicate_endpoints"] for k in ks for b in ours[k])
    walls = {k: [j["wall_s"] for b in ours[k] for j in b["jobs"]] for k in ks}
    per_k = ", ".join(f"K={k}: {tally(ours[k])[1]}/{tally(ours[k])[0]}" for k in ks)
    anchor_k = [k for k in ks if fixed[k]]
    anchor = ", ".join(f"K={k}: {tally(fixed[k])[1]}/{tally(fixed[k])[0]} ok, "
                       f"{sum(b['eaddrinuse_in_error'] for b in fixed[k])} EADDRINUSE in job.error"
                       for k in anchor_k)
    a_fail = {k: sum(b["failed"] for b in fixed[k]) for k in anchor_k}
    a_addr = {k: sum(b["eaddrinuse_in_error"] for b in fixed[k]) for k in anchor_k}
    a_addr_log = {k: sum(b["eaddrinuse_in_log"] for b in fixed[k]) for k in anchor_k}
    met = ok_all == n_all and collisions == 0
    anchor_as_expected = all(a_fail[k] == (k - 1) * len(fixed[k]) for k in anchor_k)
    note = (f"Anchor failures per K {a_fail}; with EADDRINUSE in job.error {a_addr}, in the log {a_addr_log}"
            f"{'' if anchor_as_expected else ' (not all-but-one: see data)'}. Leftover processes: {len(left)}.")
    if any(a_addr[k] < a_fail[k] for k in anchor_k):
        note += " Some fixed-port failures had EADDRINUSE in the log but not in job.error (see data)."
    wall_text = "; ".join(f"K={k}: {median(walls[k]):.2f} s" for k in ks)
    a_walls = {k: [j["wall_s"] for b in fixed[k] for j in b["jobs"] if j["status"] == "succeeded"] for k in anchor_k}
    rows = [
        row(KEY, NUMBER + "a", METRIC,
            project=f"{ok_all}/{n_all} succeeded ({per_k}); {collisions} collisions",
            anchor=f"fixed `--master_port`: {anchor}",
            ratio_text=(f"success {ok_all / n_all:.0%} vs "
                        f"{sum(tally(fixed[k])[1] for k in anchor_k) / max(1, sum(tally(fixed[k])[0] for k in anchor_k)):.0%}"),
            goal="all succeed, 0 collisions", met=met,
            how=f"toy recipe (3 steps × 0.2 s), K in {list(ks)}, {trials} trial(s) each, launched back to back",
            spread_text=f"{trials} trial(s) per K", note=note,
            data={"ours": ours, "fixed": fixed}),
        row(KEY, NUMBER + "b", "Concurrency: per-job wall time vs K (2 cores shared by all jobs)",
            project=wall_text + " (medians)",
            anchor="; ".join(f"K={k}: {median(a_walls[k]):.2f} s (the one job that got the port)"
                             for k in anchor_k if a_walls[k]) or "—",
            ratio_text=(f"K={ks[-1]}/K=1: {median(walls[ks[-1]]) / median(walls[1]):.2f}"),
            goal="— (report; expected to grow with K on 2 cores)", met=None,
            how="supervisor's `ended_at - started_at` of every job",
            spread_text="; ".join(f"K={k}: {spread(walls[k], digits=2)}" for k in ks),
            note="Every 2-process job imports torch in 3 processes (agent + 2 workers); on 2 cores K jobs share "
                 "the CPU, so the time per job grows about linearly with K (CPU-bound start-up, not waiting).",
            data={"walls": walls}),
    ]
    return rows


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
