"""Row 10: 10 launches started at once all return, the last within 1.5 × (10 × one launch's CPU
time ÷ the usable cores): no launch waits on another longer than sharing the CPU needs.

The job: the test-only toy recipe, one process (no ``--nproc_per_node``), ``steps=2``.
- 10a: 10 ``tune-magic run`` processes (the console script) started back to back with ``Popen``,
  each timed from before the first start to its exit (``os.wait4``). One launch's CPU time: the
  ``tune-magic run`` process's own user + system seconds (``os.wait4``'s rusage) when it runs
  alone, median of N sequential runs in the same row run.
- 10b: in one fresh ``python -c`` process, 10 threads released by a barrier each call
  ``tune_magic.launch()``, timed from the barrier to each return. One launch's CPU time: that
  process's own CPU (``getrusage(RUSAGE_SELF)``, all threads) for one ``launch()`` made alone after
  a warm-up launch, median of N.
Goal, each: every launch returns and the last ≤ 1.5 × 10 × one launch's CPU time ÷ usable cores,
where one launch's CPU time is that of every process the launch runs until it returns — the
launcher and the job's supervisor and exit wrapper (read with psutil at the return), measured for
one launch alone in the same row run. (The launcher's own CPU alone would leave out the two
processes each launch must start on the same cores; it is reported too.) Also recorded, to tell
waiting from CPU sharing: each job's whole CPU (launcher,
supervisor, wrapper and the recipe process, collected with ``getrusage(RUSAGE_CHILDREN)`` once
everything has exited: the measuring process is a child subreaper, so orphans are reaped by it),
the burst's total CPU and how long after that CPU ÷ cores the last launch returned, and how busy
the whole machine was during the burst (``/proc/stat``; other work there slows a CPU-bound burst).
The tool cache is filled by a warm-up launch first (row 8 measures a launch without it). Every
job is waited for (they end after 2 steps) or stopped; processes mentioning their ids are checked.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bench.common import REPO, fmt, leftovers, log, median, row, row_main, spread

KEY, NUMBER = "concurrent_launch", "10"
METRIC = "10 launches at once all return"
K, FACTOR = 10, 1.5
TOY_RECIPE = REPO / "tests" / "recipes" / "toy_recipe.py"
TOY_CONFIG = REPO / "tests" / "recipes" / "toy.yaml"
ARGS = [str(TOY_RECIPE), "--config", str(TOY_CONFIG), "steps=2"]
CLI = Path(sys.executable).with_name("tune-magic")


# -- CPU accounting (the thread child imports these too) -----------------------------------------


def subreaper() -> None:
    """Become a child subreaper (PR_SET_CHILD_SUBREAPER): orphans of our children are reparented
    to us, so their CPU reaches RUSAGE_CHILDREN when we reap them."""
    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def self_cpu() -> float:
    """This process's user + system CPU seconds (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def children_cpu() -> float:
    """User + system CPU seconds of every reaped descendant (and theirs)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def reap_all(timeout: float = 60.0) -> bool:
    """Reap every child until none is left (the jobs' supervisors, wrappers, orphans)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            time.sleep(0.02)
    return False


def tree_cpu(pid: int) -> float:
    """CPU seconds so far of process ``pid`` and its live descendants (0 when gone)."""
    import psutil
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


THREADS = textwrap.dedent("""
    import json, sys, threading, time
    import tune_magic
    from bench.rows.concurrent_launch import busy_ticks, children_cpu, reap_all, self_cpu, subreaper, tree_cpu

    subreaper()
    args, k, n, m = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    ids = []

    def finish(job):
        if job.wait(timeout=120) != "succeeded":
            raise SystemExit(f"job {job.id} {job.status}: {job.tail(10)}")

    finish(tune_magic.launch(args, name="warm-up"))  # imports, page cache: the threads find them warm too
    reap_all()
    alone, alone_tree, alone_total = [], [], []
    for i in range(n):
        c, ch = self_cpu(), children_cpu()
        job = tune_magic.launch(args, name=f"alone-{i}")
        mine = self_cpu() - c
        alone.append(mine)
        alone_tree.append(mine + tree_cpu(job.record.supervisor.pid))
        ids.append(job.id)
        finish(job)
        reap_all()
        alone_total.append(self_cpu() - c + children_cpu() - ch)

    def burst(b):
        barrier = threading.Barrier(k + 1)
        returned, errors, jobs = [None] * k, [], [None] * k

        def go(i):
            barrier.wait()
            try:
                jobs[i] = tune_magic.launch(args, name=f"burst{b}-{i}")
            except BaseException as exc:
                errors.append(repr(exc))
            returned[i] = time.perf_counter()

        threads = [threading.Thread(target=go, args=(i,)) for i in range(k)]
        [t.start() for t in threads]
        c, ch, b0 = self_cpu(), children_cpu(), busy_ticks()
        barrier.wait()
        t0 = time.perf_counter()
        [t.join(300) for t in threads]
        b1 = busy_ticks()
        launcher_cpu = self_cpu() - c
        done = [j for j in jobs if j is not None]
        ids.extend(j.id for j in done)
        statuses = [j.wait(timeout=120) for j in done]
        reaped = reap_all()
        return {"returns_s": [None if r is None else r - t0 for r in returned], "errors": errors,
                "launcher_cpu_s": launcher_cpu, "total_cpu_s": self_cpu() - c + children_cpu() - ch,
                "machine_busy": (b1[0] - b0[0]) / max(1, b1[1] - b0[1]), "all_reaped": reaped, "statuses": statuses}

    bursts = [burst(b) for b in range(m)]
    print(json.dumps({"alone_cpu_s": alone, "alone_tree_cpu_s": alone_tree, "alone_total_cpu_s": alone_total,
                      "bursts": bursts, "ids": ids}))
""")


def _env() -> dict:
    env = dict(os.environ)
    env.pop("TUNE_MAGIC_DRY_RUN", None)
    return env


def _cli_run(name: str) -> subprocess.Popen:
    return subprocess.Popen([str(CLI), "run", "--name", name, *ARGS], cwd=REPO, env=_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _job_id(proc: subprocess.Popen) -> str:
    out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    proc.stdout.close()
    proc.stderr.close()
    if proc.returncode != 0:
        raise RuntimeError(f"tune-magic run exited {proc.returncode}: {err[-800:]}")
    return out.strip().splitlines()[-1]


def _finish(ids: list[str]) -> list[str]:
    """Wait for the jobs to end (2 steps each); stop any still running. Returns their statuses."""
    import tune_magic

    out = []
    for job_id in ids:
        job = tune_magic.get_job(job_id)
        try:
            out.append(str(job.wait(timeout=120)))
        except TimeoutError:
            out.append(f"stopped by the row: {job.stop(grace_s=5)}")
    return out


def _cli_burst(b: int, ids: list[str]) -> dict:
    ch, b0 = children_cpu(), busy_ticks()
    t0 = time.perf_counter()
    procs = [_cli_run(f"burst{b}-{i}") for i in range(K)]
    pending = {p.pid: p for p in procs}
    returns, launcher_cpu = [], 0.0
    while pending:  # any child: a burst job's supervisor may be reparented here and end meanwhile
        pid, status, usage = os.wait4(-1, 0)
        at = time.perf_counter()
        proc = pending.pop(pid, None)
        if proc is not None:
            proc.returncode = os.waitstatus_to_exitcode(status)
            returns.append(at - t0)
            launcher_cpu += usage.ru_utime + usage.ru_stime
    b1 = busy_ticks()
    errors, burst_ids = [], []
    for p in procs:
        try:
            burst_ids.append(_job_id(p))
        except RuntimeError as exc:
            errors.append(str(exc))
    ids += burst_ids
    statuses = _finish(burst_ids)
    reaped = reap_all()
    return {"returns_s": sorted(returns), "errors": errors, "launcher_cpu_s": launcher_cpu,
            "total_cpu_s": children_cpu() - ch, "machine_busy": (b1[0] - b0[0]) / max(1, b1[1] - b0[1]),
            "all_reaped": reaped, "statuses": statuses}


def cli_bursts(n_alone: int, m: int) -> dict:
    import tune_magic

    subreaper()  # the supervisors outlive `tune-magic run`: reparented here, reaped here
    ids: list[str] = []
    warm = _cli_run("warm-up")  # fills the tool cache and the page cache
    warm.wait()
    ids.append(_job_id(warm))
    _finish(ids[-1:])
    reap_all()
    alone, alone_tree, alone_total = [], [], []
    for i in range(n_alone):
        ch = children_cpu()
        proc = _cli_run(f"alone-{i}")
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        ids.append(_job_id(proc))
        mine = usage.ru_utime + usage.ru_stime
        alone.append(mine)
        alone_tree.append(mine + tree_cpu(tune_magic.get_job(ids[-1]).record.supervisor.pid))
        _finish(ids[-1:])
        reap_all()
        alone_total.append(children_cpu() - ch)
        log(f"alone {i}: tune-magic run {mine:.3f} s CPU, with the supervisor and wrapper at return "
            f"{alone_tree[-1]:.3f} s, whole job {alone_total[-1]:.3f} s")
    bursts = [_cli_burst(b, ids) for b in range(m)]
    return {"alone_cpu_s": alone, "alone_tree_cpu_s": alone_tree, "alone_total_cpu_s": alone_total,
            "bursts": bursts, "ids": ids}


def thread_bursts(n_alone: int, m: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", THREADS, " ".join(ARGS), str(K), str(n_alone), str(m)], cwd=REPO,
                          env=_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"thread child exited {proc.returncode}: {proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _row(suffix: str, what: str, got: dict, cores: int, how: str, anchor_what: str, left: list) -> dict:
    cpu1, tree1, total1 = (median(got[k]) for k in ("alone_cpu_s", "alone_tree_cpu_s", "alone_total_cpu_s"))
    bursts = got["bursts"]
    lasts = [max(r for r in b["returns_s"] if r is not None) if any(r is not None for r in b["returns_s"]) else None
             for b in bursts]
    all_returned = all(len([r for r in b["returns_s"] if r is not None]) == K and not b["errors"] for b in bursts)
    last = median([x for x in lasts if x is not None]) if all(x is not None for x in lasts) else None
    bound = FACTOR * K * tree1 / cores
    own_bound, total_bound = FACTOR * K * cpu1 / cores, FACTOR * K * total1 / cores
    met = all_returned and last is not None and last <= bound
    statuses = [s for b in bursts for s in b["statuses"]]
    errors = [e for b in bursts for e in b["errors"]]
    burst_total = median([b["total_cpu_s"] for b in bursts])

    def of(x: float) -> str:
        return "—" if last is None else f"{last / x:.3f}"

    note = (f"{sum(len([r for r in b['returns_s'] if r is not None]) for b in bursts)}/{K * len(bursts)} returned"
            f"{'' if not errors else ', errors: ' + '; '.join(errors)[:300]}; last return per burst "
            f"{', '.join(fmt(x) for x in lasts)}. One launch alone: with the job's supervisor and exit wrapper until it "
            f"returned {fmt(tree1)} (the goal's figure); the launcher's own CPU {fmt(cpu1)} (a bound counted with that "
            f"alone: {own_bound:.3f} s, last/bound {of(own_bound)}); the whole job (launcher, supervisor, wrapper, recipe "
            f"process) {fmt(total1)} (bound {total_bound:.3f} s, last/bound {of(total_bound)}). A burst's processes "
            f"used {fmt(burst_total)} CPU in all (median; ÷ {cores} cores = {burst_total / cores:.3f} s), its "
            f"launchers {fmt(median([b['launcher_cpu_s'] for b in bursts]))}: the last return came "
            f"{'—' if last is None else f'{last - burst_total / cores:+.3f} s'} after that CPU ÷ cores (waiting "
            f"beyond sharing the CPU, if positive); the whole machine was "
            f"{median([b['machine_busy'] for b in bursts]) * 100:.0f}% busy during the bursts (median). Jobs that "
            f"then succeeded: {statuses.count('succeeded')}/{len(statuses)}; every process reaped: "
            f"{all(b['all_reaped'] for b in bursts)}; leftover processes: {len(left)}.")
    returns = [r for b in bursts for r in b["returns_s"] if r is not None]
    return row(KEY, NUMBER + suffix, what,
               project=f"last returned at {fmt(last)}" + (" (median of bursts)" if len(bursts) > 1 else ""),
               anchor=f"one launch {fmt(tree1)} CPU ({anchor_what}, its supervisor and exit wrapper); bound 1.5 × {K} × "
                      f"{tree1:.3f} s ÷ {cores} cores = {bound:.3f} s",
               ratio_text="—" if last is None else f"{last / bound:.3f} of the bound",
               goal=f"all return, last ≤ 1.5 × {K} × one launch's CPU ÷ {cores} cores", met=met, how=how,
               spread_text=f"returns {spread(returns)}; one launch's CPU {spread(got['alone_tree_cpu_s'])}",
               note=note, data=got)


def run(quick: bool) -> list[dict]:
    n_alone, m = (3, 1) if quick else (5, 3)
    cores = len(os.sched_getaffinity(0))
    cli = cli_bursts(n_alone, m)
    log(f"cli bursts: returns {[[round(r, 3) for r in b['returns_s']] for b in cli['bursts']]}")
    thr = thread_bursts(n_alone, m)
    log(f"thread bursts: returns {[[None if r is None else round(r, 3) for r in b['returns_s']] for b in thr['bursts']]}")
    left = leftovers(cli["ids"] + thr["ids"])
    burst_how = f"{m} burst{'s' if m > 1 else ''}, the median of their last returns"
    return [
        _row("a", f"{K} `tune-magic run` started at once all return", cli, cores,
             f"{K} console-script processes started back to back (`Popen`), each timed to its exit (`os.wait4`); toy "
             f"recipe, 1 process, 2 steps; tool cache warm; {burst_how}; one launch's CPU: median of {n_alone} runs alone",
             "`tune-magic run` alone, its own user+sys from `os.wait4`", left),
        _row("b", f"{K} `launch()` calls from threads in one process all return", thr, cores,
             f"one fresh process: a warm-up launch, {n_alone} launches alone, then {K} threads released by a barrier "
             f"each call `launch()`, timed from the barrier to each return; {burst_how}",
             "`launch()` alone, the process's `getrusage(RUSAGE_SELF)` user+sys", left),
    ]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
