"""A test-only recipe: real torchrun workers with a gloo process group, no model.

It writes the same log lines as torchtune 0.6.1's recipes (the DiskLogger file, and on stderr the
tqdm bar ``{epoch}|{global step}|Loss: {loss}:  40%|████      | 2/5 [00:00<00:01,  2.50it/s]``
redrawn with ``\\r``) so the job machinery can be tested fast, and it can crash on purpose on one
rank. Config keys (YAML via --config, then key=value overrides):
output_dir, steps (steps per epoch), epochs (default 1), step_s (seconds per step), crash_rank
(that rank raises RuntimeError(crash_message) at global step crash_step, default 2: after step 1
was logged; 1: before any step), crash_message, lines_per_step, start_loss,
checkpoint_s (after each epoch, rank 0 prints lora_finetune_distributed's ``Saving checkpoint.
This may take some time. Retrieving full model state dict...`` log line, every rank sleeps this
many seconds, then rank 0 prints ``Saving checkpoint took N secs``; default 0: no such lines),
warning (each rank issues this text as a ``UserWarning`` at start, as every rank of a real job
prints the same library warnings), long_line_chars (rank 0 prints one log line of that many
characters, without spaces, at start),
ignore_sigterm (each rank ignores SIGTERM, as a hung rank would), spawn_sleep (each rank starts a
``sleep`` child in its own session, as DataLoader workers are), and write_times_file (optional, default off: a file to which rank 0 appends ``step,time.time()``
right after each DiskLogger write and the crashing rank appends ``crash,time.time()`` right before
it raises; the benchmarks time metric and failure latency from it). handled_rank: that rank
raises and handles an exception at step 1, printing its traceback (``traceback.print_exc()``), and
goes on; exit_rank (with exit_code, default 3) / kill_rank: that rank calls ``sys.exit`` / sends
itself SIGKILL after global step end_step (default 3).
Each step's loss is start_loss / global step, so tests know the values without parsing them back.
"""

import os
import signal
import subprocess
import sys
import time
import traceback
import warnings

from omegaconf import OmegaConf

# torchtune's logger (torchtune.utils.get_logger with logging's default format), as the recipes print
LOG_PREFIX = "INFO:torchtune.utils._logging:"


def _stamp(path, what):
    with open(path, "a") as f:
        f.write(f"{what},{time.time()!r}\n")


def _clock(seconds):
    """tqdm's time format: mm:ss, or h:mm:ss from an hour."""
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def _bar(desc, n, total, elapsed):
    """One tqdm redraw in tqdm's default format (tqdm 4.x, ascii=False, ncols unset)."""
    rate = n / elapsed if elapsed > 0 else 0.0
    remaining = (total - n) / rate if rate else 0.0
    filled = n * 10 // total
    rate_text = f"{rate:5.2f}it/s" if rate >= 1 or not rate else f"{1 / rate:5.2f}s/it"
    return (f"{desc}: {n * 100 // total:3d}%|{'█' * filled}{' ' * (10 - filled)}| {n}/{total} "
            f"[{_clock(elapsed)}<{_clock(remaining)}, {rate_text}]")


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
    if cfg.get("warning"):
        warnings.warn(str(cfg.warning), UserWarning)
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    out = cfg.output_dir
    if rank == 0:
        os.makedirs(f"{out}/logs", exist_ok=True)
        OmegaConf.save(cfg, f"{out}/resolved_config.yaml", resolve=True)  # as the real recipes do
        log_path = f"{out}/logs/log_{int(time.time())}.txt"
        print(f"{LOG_PREFIX}Writing logs to {log_path}", file=sys.stderr, flush=True)
        if int(cfg.get("long_line_chars", 0)):
            print("long line: " + "x" * int(cfg.long_line_chars), flush=True)
        log = open(log_path, "a")
    steps, epochs = int(cfg.steps), int(cfg.get("epochs", 1))
    checkpoint_s = float(cfg.get("checkpoint_s", 0))
    for epoch in range(1, epochs + 1):
        started = time.monotonic()
        for n in range(1, steps + 1):
            step = (epoch - 1) * steps + n
            if cfg.get("crash_rank") is not None and rank == int(cfg.crash_rank) and step == int(cfg.get("crash_step", 2)):
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
                bar = _bar(f"{epoch}|{step}|Loss: {loss}", n, steps, time.monotonic() - started)
                print("\r" + bar, end="", file=sys.stderr, flush=True)
                log.write(f"Step {step} | loss:{loss} lr:0.001 tokens_per_second_per_gpu:100.0 \n")
                log.flush()
                if times:
                    _stamp(times, step)
            if step == int(cfg.get("end_step", 3)):
                if cfg.get("exit_rank") is not None and rank == int(cfg.exit_rank):
                    sys.exit(int(cfg.get("exit_code", 3)))
                if cfg.get("kill_rank") is not None and rank == int(cfg.kill_rank):
                    os.kill(os.getpid(), signal.SIGKILL)
        if checkpoint_s > 0:
            if rank == 0:  # glued to the bar, as torchtune's log line is (tqdm leaves the line open)
                print(f"{LOG_PREFIX}Saving checkpoint. This may take some time. Retrieving full model state dict...",
                      file=sys.stderr, flush=True)
            time.sleep(checkpoint_s)
            if rank == 0:
                print(f"{LOG_PREFIX}Saving checkpoint took {checkpoint_s:.2f} secs", file=sys.stderr, flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print("\ntoy recipe done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
