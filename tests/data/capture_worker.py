"""The tiny training script behind the captured logs in tests/data (see capture_logs.py).

Run by torchrun (or alone, for one-process jobs) as ``capture_worker.py MODE [key=value ...]``.
Each MODE makes one kind of failure or one kind of log output happen for real; nothing here
imitates a message: every line in the captured logs was printed by Python, torch, torchrun,
torchtune or tqdm themselves. Keys: ``rank`` (the rank that misbehaves, default 1), ``delay``
(seconds before it does), ``cgroup`` (oom mode: the cgroup directory the rank moves into).
"""

import datetime
import os
import sys
import time


def opts():
    return dict(a.split("=", 1) for a in sys.argv[2:])


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def init(timeout_s: float = 60.0):
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return dist


def main(mode: str) -> None:
    o = opts()
    bad = int(o.get("rank", 1))
    delay = float(o.get("delay", 0))
    if mode == "import_error":
        # a rank failing at import time, before init_process_group: no [rankN]: prefix yet
        if rank() == bad:
            import tune_magic_no_such_module  # noqa: F401
        init().barrier()
    elif mode == "missing_file":
        # every rank opens the same missing data file before init_process_group
        with open("/nonexistent/tune_magic/train.json") as f:
            f.read()
    elif mode == "config_error":
        from omegaconf import OmegaConf

        cfg = OmegaConf.create({"batch_size": 2})
        OmegaConf.set_struct(cfg, True)
        if rank() == bad:
            print(cfg.batch_sizee)  # a typo'd config key
        init().barrier()
    elif mode == "bare_exception":
        if rank() == bad:
            raise Exception(o.get("message", "x"))
        if world() > 1:
            init().barrier()
    elif mode == "raise":
        dist = init() if world() > 1 else None
        if rank() == bad:
            time.sleep(delay)
            raise ValueError(o.get("message", "learning rate must be positive, got -1"))
        if dist:
            dist.barrier()
    elif mode == "record":
        from torch.distributed.elastic.multiprocessing.errors import record

        @record
        def train():
            dist = init()
            if rank() == bad:
                raise RuntimeError("boom inside @record")
            dist.barrier()

        train()
    elif mode == "sigkill":
        import signal

        dist = init()
        if rank() == bad:
            time.sleep(delay)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()
    elif mode == "gloo_timeout":
        import torch

        dist = init(timeout_s=float(o.get("timeout", 3)))
        if rank() == bad:
            time.sleep(60)  # stalls; the agent ends it once the other rank fails
        dist.all_reduce(torch.ones(1))
    elif mode == "two_agents":
        # rank 0 raises after `delay0` s, rank 1 is killed by SIGKILL after `delay1` s; neither
        # waits for the other, so each agent reports its own rank's end first-hand.
        import signal

        init()
        if rank() == 0:
            time.sleep(float(o["delay0"]))
            raise ValueError("rank zero raised on purpose")
        time.sleep(float(o["delay1"]))
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "two_agents_both":
        # node 0 runs ranks 0 and 1, node 1 runs rank 2. Ranks 0 and 2 raise in the same whole second,
        # rank 0 first (at .2, rank 2 at .5); rank 1 takes 2 s to stop when its agent tells it to, so
        # node 0's report is printed after node 1's although its rank failed first.
        import math
        import signal

        import torch

        dist = init()
        start = torch.tensor([float(math.ceil(time.time()) + 1)])
        dist.all_reduce(start, op=dist.ReduceOp.MAX)  # one whole second for every rank
        if rank() == 1:
            signal.signal(signal.SIGTERM, lambda *_: (time.sleep(2), os._exit(143)))
            time.sleep(60)
        time.sleep(max(0.0, start.item() + (0.2 if rank() == 0 else 0.5) - time.time()))
        raise ValueError(f"rank {rank()} raised on purpose")
    elif mode == "two_agents_peer":
        # rank 1 is killed by SIGKILL; rank 0, waiting in a barrier, raises because its peer is gone
        import signal

        dist = init()
        if rank() == 1:
            time.sleep(float(o.get("delay1", 0.5)))
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()
    elif mode == "oom":
        dist = init()
        if rank() == bad:
            with open(os.path.join(o["cgroup"], "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            blocks = []
            for _ in range(int(o.get("mib", 1024))):
                blocks.append(bytearray(1 << 20))  # zero-filled, so every page is touched
            print("allocated without being killed", flush=True)
        else:
            time.sleep(60)  # not in a collective: torchrun ends it after rank 1's death
        dist.barrier()
    elif mode == "survived":
        survived(o)
    elif mode == "metrics":
        metrics(o)
    else:
        raise SystemExit(f"unknown mode {mode}")


def survived(o) -> None:
    """Rank ``printer`` (default 0) handles an exception the way a recipe's ``try/except`` may
    (``traceback.print_exc()``) and goes on; rank 0 prints ``steps`` steps of the recipes' tqdm
    bar (default 5); after a barrier rank ``end_rank`` (default 0) ends by ``end``: ``exit3``
    (``sys.exit(3)``) or ``sigkill``. Meanwhile rank 0 goes on with its bar (when ``steps`` > 0)
    or sleeps, until torchrun ends it."""
    import signal
    import traceback

    from tqdm import tqdm

    printer, end_rank, end = int(o.get("printer", 0)), int(o.get("end_rank", 0)), o.get("end", "exit3")
    steps = int(o.get("steps", 5))
    dist = init() if world() > 1 else None
    if rank() == printer:
        try:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB (handled)")
        except RuntimeError:
            traceback.print_exc()
    pbar = tqdm(total=1000, mininterval=0) if rank() == 0 and steps > 0 else None
    step = 0

    def one_step() -> None:
        nonlocal step
        step += 1
        if pbar is not None:
            pbar.update(1)
            pbar.set_description(f"1|{step}|Loss: {10.0 / step}")
        time.sleep(0.05)

    while rank() == 0 and step < steps:
        one_step()
    if dist:
        dist.barrier()  # what the others print before rank `end_rank` ends is in the log
    if rank() == end_rank:
        if end == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(3)
    for _ in range(600):  # 30 s at most; torchrun ends it long before
        one_step()


def metrics(o) -> None:
    """Print what a torchtune 0.6.1 recipe prints: StdoutLogger lines, DiskLogger's
    'Writing logs to', the tqdm bar with the recipes' description, plus JSON lines."""
    import json

    from tqdm import tqdm
    from torchtune.training.metric_logging import DiskLogger, StdoutLogger

    steps = int(o.get("steps", 3))
    dist = init() if world() > 1 else None
    if rank() == 0:
        disk = DiskLogger(log_dir=o["log_dir"])
        stdout = StdoutLogger()
        pbar = tqdm(total=steps)
        for step in range(1, steps + 1):
            loss = 10.0 / step
            metrics_ = {"loss": loss, "lr": 2e-05, "tokens_per_second_per_gpu": 100.0 + step}
            stdout.log_dict(metrics_, step=step)
            disk.log_dict(metrics_, step=step)
            print(json.dumps({"step": step, "grad_norm": 0.5 * step}), flush=True)
            pbar.update(1)
            pbar.set_description(f"1|{step}|Loss: {loss}")
            time.sleep(0.05)
        pbar.close()
        disk.close()
    if dist:
        dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
