"""A tiny torch.distributed job for the SLURM smoke test: one gloo all_reduce across nodes.

Each rank prints ``rank R/W node N host H master M sum S``: N its SLURM node, H its host name,
M the MASTER_ADDR torchrun gave it, S the sum of all ranks (0+1+...+(W-1)).
"""

import os
import socket

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
node, master = os.environ.get("SLURMD_NODENAME"), os.environ["MASTER_ADDR"]
print(f"rank {rank}/{world} node {node} host {socket.gethostname()} master {master} sum {int(t.item())}", flush=True)
dist.destroy_process_group()
