"""A test-only recipe: real torchrun workers with a gloo process group, no model.

It writes the same log lines as torchtune 0.6.1's recipes (the DiskLogger file and the tqdm
description ``{epoch}|{step}|Loss: {loss}``) so the job machinery can be tested fast, and it can
crash on purpose on one rank. Config keys (YAML via --config, then key=value overrides):
output_dir, steps, step_s (seconds per step), crash_rank, crash_message, lines_per_step, start_loss,
ignore_sigterm (each rank ignores SIGTERM, as a hung rank would), spawn_sleep (each rank starts a
``sleep`` child in its own session, as DataLoader workers are), and write_times_file (optional, default off: a file to which rank 0 appends ``step,time.time()``
right after each DiskLogger write and the crashing rank appends ``crash,time.time()`` right before
it raises; the benchmarks time metric and failure latency from it). handled_rank: that rank
raises and handles an exception at step 1, printing its traceback (``traceback.print_exc()``), and
goes on; exit_rank (with exit_code, default 3) / kill_rank: that rank calls ``sys.exit`` / sends
itself SIGKILL after step end_step (default 3).
Each step's loss is start_loss / step, so tests know the values without parsing them back.
"""

import os
import signal
import subprocess
import sys
import time
import traceback

from omegaconf import OmegaConf


def _stamp(path, what):
    with open(path, "a") as f:
        f.write(f"{what},{time.time()!r}\n")


def main(argv):
    i = argv.index("--config")
    cfg = OmegaConf.merge(OmegaConf.load(argv[i + 1]), OmegaConf.from_dotlist(argv[:i] + argv[i + 2:]))
    times = cfg.get("write_times_file")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if cfg.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if cfg.get("spawn_sleep"):
        subprocess.Popen(["sleep", "600"])  # stays in this rank's session, like a DataLoader worker
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    out = cfg.output_dir
    if rank == 0:
        os.makedirs(f"{out}/logs", exist_ok=True)
        OmegaConf.save(cfg, f"{out}/resolved_config.yaml", resolve=True)  # as the real recipes do
        log_path = f"{out}/logs/log_{int(time.time())}.txt"
        print(f"INFO:torchtune.utils._logging:Writing logs to {log_path}", file=sys.stderr, flush=True)
        log = open(log_path, "a")
    for step in range(1, int(cfg.steps) + 1):
        if cfg.get("crash_rank") is not None and rank == int(cfg.crash_rank) and step == 2:
            if times:
                _stamp(times, "crash")
            raise RuntimeError(cfg.get("crash_message", "toy recipe crashed on purpose"))
        if cfg.get("handled_rank") is not None and rank == int(cfg.handled_rank) and step == 1:
            try:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB (handled)")
            except RuntimeError:
                traceback.print_exc()
        time.sleep(float(cfg.step_s))
        loss = float(cfg.get("start_loss", 10.0)) / step
        if rank == 0:
            for k in range(int(cfg.get("lines_per_step", 0))):
                print(f"INFO step {step} filler line {k}", flush=True)
            print(f"\r1|{step}|Loss: {loss}: {step * 100 // int(cfg.steps)}%|", end="", file=sys.stderr, flush=True)
            log.write(f"Step {step} | loss:{loss} lr:0.001 tokens_per_second_per_gpu:100.0 \n")
            log.flush()
            if times:
                _stamp(times, step)
        if step == int(cfg.get("end_step", 3)):
            if cfg.get("exit_rank") is not None and rank == int(cfg.exit_rank):
                sys.exit(int(cfg.get("exit_code", 3)))
            if cfg.get("kill_rank") is not None and rank == int(cfg.kill_rank):
                os.kill(os.getpid(), signal.SIGKILL)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print("\ntoy recipe done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
