"""A test-only recipe: real torchrun workers with a gloo process group, no model.

It writes the same log lines as torchtune 0.6.1's recipes (the DiskLogger file, and on stderr the
tqdm bar ``{epoch}|{global step}|Loss: {loss}:  40%|████      | 2/5 [00:00<00:01,  2.50it/s]``
redrawn with ``\\r``) so the job machinery can be tested fast, and it can crash on purpose on one
rank. Config keys (YAML via --config, then key=value overrides):
output_dir, steps (steps per epoch), epochs (default 1), step_s (seconds per step), crash_rank
(that rank raises RuntimeError(crash_message) at global step crash_step, default 2: after step 1
was logged; 1: before any step; a list such as [0,1]: each of those ranks does, as a config error
every rank meets), crash_message, lines_per_step, start_loss,
checkpoint_s (after each epoch, rank 0 prints lora_finetune_distributed's ``Saving checkpoint.
This may take some time. Retrieving full model state dict...`` log line, every rank sleeps this
many seconds, then rank 0 prints ``Saving checkpoint took N secs``; default 0: no such lines),
warning (each rank issues this text as a ``UserWarning`` at start, as every rank of a real job
prints the same library warnings), long_line_chars (rank 0 prints one log line of that many
characters, without spaces, at start),
ignore_sigterm (each rank ignores SIGTERM, as a hung rank would), sigterm_exit (each rank catches
SIGTERM, prints ``toy recipe: SIGTERM, saved and exiting`` and exits with this code, as recipes that
save and exit cleanly do; default null: SIGTERM's default action), linger_s (after its last step and
save, rank 0 prints ``toy recipe done`` and every rank waits this many seconds before exiting, as a
recipe uploading its results would), spawn_sleep (each rank starts a
``sleep`` child in its own session, as DataLoader workers are), and write_times_file (optional, default off: a file to which rank 0 appends ``step,time.time()``
right after each DiskLogger write and the crashing rank appends ``crash,time.time()`` right before
it raises; the benchmarks time metric and failure latency from it). handled_rank: that rank
raises and handles an exception at step 1, printing its traceback (``traceback.print_exc()``), and
goes on; exit_rank (with exit_code, default 3) / kill_rank: that rank calls ``sys.exit`` / sends
itself SIGKILL after global step end_step (default 3).
Each step's loss is start_loss / global step, so tests know the values without parsing them back.

Checkpoints and resume, in torchtune 0.6.1's full fine-tune layout (so tune_magic's resume
pre-flight reads a toy job as it reads a real one; the module declares ``TUNE_MAGIC_RESUME``):
save_checkpoints (default false): after each epoch K (0-based) rank 0 writes
``epoch_K/model-00001-of-00001.safetensors`` (one tensor, ``global_step``) and its
``model.safetensors.index.json``, and after each non-final epoch ``recipe_state/recipe_state.pt``
(torch.save of ``seed``, ``epochs_run``, ``total_epochs``, ``max_steps_per_epoch`` (= steps),
``optimizer`` and ``dataloader``, both empty); with it, all ranks also meet at a barrier after
every step (as a real recipe's all-reduce makes them), so no rank saves alone after another
crashed. resume_from_checkpoint (default false): continue from ``checkpointer.recipe_checkpoint`` (default
``recipe_state/recipe_state.pt``) and the first of ``checkpointer.checkpoint_files``, both relative
to output_dir, at the next epoch, global step and loss going on as in an uninterrupted run.
fail_resume (default false): with resume_from_checkpoint, every rank logs full_finetune_distributed's
(torchtune 0.6.1) ``Failed to load distributed checkpoint: ... Training will start from the base
checkpoint.`` warning and trains from the first epoch instead, as that recipe does when its async
checkpoint does not load (a failed resume).
crash_once_file: with crash_rank, the crash happens only while this file does not exist; the
crashing rank creates it right before raising, so a rerun or resume of the same job goes on.
torch is imported only when world size > 1 or one of those two is on. A crash once after the
first checkpoint, for example: ``epochs=3 steps=2 save_checkpoints=true crash_rank=1 crash_step=3
crash_once_file=/tmp/x`` (step 3 is epoch 2's first); the resumed run passes step 3.
"""

import json
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
# tune_magic's resume pre-flight reads this (tune_magic.checkpoints.preflight): full fine-tune layout and keys
TUNE_MAGIC_RESUME = "full"
SHARD = "model-00001-of-00001.safetensors"
RECIPE_STATE = "recipe_state/recipe_state.pt"


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


def _save(out, epoch, step, epochs, steps, seed):
    """Write epoch_<epoch>/ (and the recipe state after a non-final epoch) as torchtune 0.6.1 lays them out."""
    import torch
    from safetensors.torch import save_file

    folder = os.path.join(out, f"epoch_{epoch}")
    os.makedirs(folder, exist_ok=True)
    save_file({"global_step": torch.tensor([step])}, os.path.join(folder, SHARD), metadata={"format": "pt"})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 8}, "weight_map": {"global_step": SHARD}}, f)
    if epoch + 1 < epochs:
        os.makedirs(os.path.join(out, "recipe_state"), exist_ok=True)
        torch.save({"optimizer": {"state": {}, "param_groups": []}, "seed": seed, "epochs_run": epoch + 1,
                    "total_epochs": epochs, "max_steps_per_epoch": steps, "dataloader": {}},
                   os.path.join(out, RECIPE_STATE))


def _resume(cfg, out, steps):
    """Return (epochs done, global step) from the pinned checkpoint files."""
    import torch
    from safetensors.torch import load_file

    ck = cfg.get("checkpointer") or {}
    state = torch.load(os.path.join(out, ck.get("recipe_checkpoint") or RECIPE_STATE), weights_only=True)
    files = list(ck.get("checkpoint_files") or [])
    if not files:
        raise ValueError("resume_from_checkpoint=True needs checkpointer.checkpoint_files=[epoch_K/...]")
    step = int(load_file(os.path.join(out, files[0]))["global_step"][0])
    if step != state["epochs_run"] * steps:
        raise ValueError(f"{files[0]} is at step {step}, the recipe state at epoch {state['epochs_run']}")
    return state["epochs_run"], step


def _ranks(value) -> set[int]:
    """``crash_rank``'s ranks: one rank, or a list of them (``crash_rank=[0,1]``)."""
    if OmegaConf.is_list(value):
        return {int(r) for r in value}
    return {int(value)}


def main(argv):
    i = argv.index("--config")
    cfg = OmegaConf.merge(OmegaConf.load(argv[i + 1]), OmegaConf.from_dotlist(argv[:i] + argv[i + 2:]))
    times = cfg.get("write_times_file")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if cfg.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif cfg.get("sigterm_exit") is not None:
        def saved_and_exit(_signum, _frame, code=int(cfg.sigterm_exit)):
            print("toy recipe: SIGTERM, saved and exiting", flush=True)
            os._exit(code)

        signal.signal(signal.SIGTERM, saved_and_exit)
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
    first_epoch = 1
    if cfg.get("resume_from_checkpoint") and cfg.get("fail_resume"):
        print("WARNING:torchtune.utils._logging:Failed to load distributed checkpoint: no complete dist_epoch_<K>/ "
              "found. Training will start from the base checkpoint.", file=sys.stderr, flush=True)
    elif cfg.get("resume_from_checkpoint"):
        done, _ = _resume(cfg, out, steps)
        first_epoch = done + 1
    once = cfg.get("crash_once_file")
    saving = bool(cfg.get("save_checkpoints"))
    for epoch in range(first_epoch, epochs + 1):
        started = time.monotonic()
        for n in range(1, steps + 1):
            step = (epoch - 1) * steps + n
            if (cfg.get("crash_rank") is not None and rank in _ranks(cfg.crash_rank) and step == int(cfg.get("crash_step", 2))
                    and not (once and os.path.exists(once))):
                if times:
                    _stamp(times, "crash")
                if once:
                    open(once, "w").close()
                raise RuntimeError(cfg.get("crash_message", "toy recipe crashed on purpose"))
            if cfg.get("handled_rank") is not None and rank == int(cfg.handled_rank) and step == 1:
                try:
                    raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB (handled)")
                except RuntimeError:
                    traceback.print_exc()
            time.sleep(float(cfg.step_s))
            if saving and world > 1:
                dist.barrier()  # ranks move together, as a real recipe's all-reduce makes them: none saves alone
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
        if saving:
            if rank == 0:
                _save(out, epoch - 1, epoch * steps, epochs, steps, cfg.get("seed", 0))
            if world > 1:
                dist.barrier()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print("\ntoy recipe done", flush=True)
    time.sleep(float(cfg.get("linger_s", 0)))


if __name__ == "__main__":
    main(sys.argv[1:])
