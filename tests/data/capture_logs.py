"""Re-capture the real torchrun logs in tests/data (see README.md there).

    .venv/bin/python tests/data/capture_logs.py            # every scenario
    .venv/bin/python tests/data/capture_logs.py sigkill    # some

Each scenario runs capture_worker.py for real (torchrun, or alone for one-process jobs) with
stdout and stderr appended to one file, as tune_magic's supervisor does, and saves that file as
tests/data/<name>.log. Scenarios with ``--log-dir`` also copy torchrun's per-rank files to
tests/data/<name>/ (the same layout: ``<run id>/attempt_0/<local rank>/{stdout,stderr}.log``).
Absolute paths inside the logs are the ones of the machine that captured them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent
WORKER = str(DATA / "capture_worker.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
BUSY_PORT = 29511


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two(*extra: str) -> list[str]:
    return [*TORCHRUN, "--standalone", "--nproc-per-node", "2", *extra]


def scenarios(tmp: Path) -> dict[str, dict]:
    ranks = str(tmp / "ranks")
    logs = f"log_dir={tmp / 'metric_logs'}"
    return {
        "pre_init_import_error": {"argv": [*two(), WORKER, "import_error", "rank=1"]},
        "pre_init_missing_file": {"argv": [*two(), WORKER, "missing_file"]},
        "pre_init_config_error": {"argv": [*two(), WORKER, "config_error", "rank=0"]},
        "bare_exception": {"argv": [*two(), WORKER, "bare_exception", "rank=1", "message=x"]},
        "one_process_raise": {"argv": [sys.executable, WORKER, "raise", "rank=0"]},
        "one_process_bare_exception": {"argv": [sys.executable, WORKER, "bare_exception", "rank=0", "message=x"]},
        # a handled exception's traceback (print_exc) followed by more progress, then the process
        # ends some other way; and the same traceback as the last thing before exit 3
        "one_process_survived_exit3": {"argv": [sys.executable, WORKER, "survived", "end=exit3"]},
        "one_process_survived_sigkill": {"argv": [sys.executable, WORKER, "survived", "end=sigkill"]},
        "one_process_print_exc_exit3": {"argv": [sys.executable, WORKER, "survived", "end=exit3", "steps=0"]},
        "survived_rank1_exit3": {"argv": [*two(), WORKER, "survived", "end_rank=1", "end=exit3"]},
        "rank1_print_exc_exit3": {"argv": [*two(), WORKER, "survived", "printer=1", "end_rank=1", "end=exit3",
                                           "steps=0"]},
        "sigkill": {"argv": [*two(), WORKER, "sigkill", "rank=1"]},
        # torchrun looks at its workers every 2 s: rank 0 has raised (its peer is gone) by then,
        # and the report's root cause is rank 0, not the killed rank 1
        "sigkill_slow_monitor": {"argv": [*two("--monitor-interval", "2"), WORKER, "sigkill", "rank=1"]},
        "gloo_timeout": {"argv": [*two(), WORKER, "gloo_timeout", "rank=1", "timeout=3"]},
        "rendezvous_timeout": {"argv": [
            *TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"localhost:{free_port()}", "--rdzv-id", "capture",
            "--rdzv-conf", "join_timeout=5", WORKER, "raise"]},
        "eaddrinuse": {"argv": [*TORCHRUN, "--nproc-per-node", "2", "--master-port", "{busy_port}", WORKER, "raise"],
                       "busy_port": True},
        "record_error_file": {"argv": [*two("--log-dir", ranks), WORKER, "record", "rank=1"], "ranks": ranks},
        "tee3_raise": {"argv": [*two("--tee", "3", "--log-dir", ranks), WORKER, "raise", "rank=1"], "ranks": ranks},
        "redirects3_raise": {"argv": [*two("--redirects", "3", "--log-dir", ranks), WORKER, "raise", "rank=1"],
                             "ranks": ranks},
        "tee3_metrics": {"argv": [*two("--tee", "3", "--log-dir", ranks), WORKER, "metrics", logs, "steps=8"],
                         "ranks": ranks},
        "tee3_filter0_metrics": {"argv": [*two("--tee", "3", "--local-ranks-filter", "0", "--log-dir", ranks),
                                          WORKER, "metrics", logs, "steps=8"], "ranks": ranks},
        "filter0_metrics": {"argv": [*two("--local-ranks-filter", "0"), WORKER, "metrics", logs, "steps=8"]},
        "redirects3_metrics": {"argv": [*two("--redirects", "3", "--log-dir", ranks), WORKER, "metrics", logs,
                                        "steps=8"], "ranks": ranks},
        # two agents (two "nodes" of a static rendezvous) appending to one file, as srun does;
        # rank 0 (node 0) raises, rank 1 (node 1) is killed by SIGKILL, in both orders
        "two_agents_raise_first": {"agents": {"delay0": "0.5", "delay1": "3"}},
        "two_agents_signal_first": {"agents": {"delay0": "3", "delay1": "0.5"}},
        # rank 1 killed by SIGKILL; rank 0 then raises only because its peer is gone
        "two_agents_peer_killed": {"agents": {"delay1": "0.5"}, "mode": "two_agents_peer"},
        # ranks 0 (node 0) and 2 (node 1) raise in one whole second, rank 0 first; node 0's report
        # comes second in the log (its rank 1 is slow to stop)
        "two_agents_both_raise": {"agents": {}, "mode": "two_agents_both", "nproc": ("2", "1")},
    }


def run(name: str, spec: dict, tmp: Path) -> int:
    out = DATA / f"{name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    holder = None
    with open(out, "wb") as log:
        if "agents" in spec:
            port = str(free_port())
            procs = []
            for node in (0, 1):
                nproc = spec.get("nproc", ("1", "1"))[node]
                argv = [*TORCHRUN, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", nproc,
                        "--master-addr", "127.0.0.1", "--master-port", port, WORKER, spec.get("mode", "two_agents"),
                        *(f"{k}={v}" for k, v in spec["agents"].items())]
                procs.append(subprocess.Popen(argv, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT))
            return max(p.wait(timeout=120) for p in procs)
        argv = list(spec["argv"])
        if spec.get("busy_port"):
            holder = socket.socket()
            holder.bind(("127.0.0.1", BUSY_PORT))  # fixed, so the expected line names a known port
            holder.listen()
            argv = [str(holder.getsockname()[1]) if a == "{busy_port}" else a for a in argv]
        try:
            return subprocess.run(argv, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=120).returncode
        finally:
            if holder is not None:
                holder.close()


def main(names: list[str]) -> int:
    for name in names or list(scenarios(Path("/"))):
        with tempfile.TemporaryDirectory(prefix="tm_capture_") as t:
            tmp = Path(t)
            spec = scenarios(tmp)[name]
            started = time.time()
            code = run(name, spec, tmp)
            print(f"{name}: exit {code} in {time.time() - started:.1f} s")
            if "ranks" in spec:
                dest = DATA / name
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(spec["ranks"], dest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
