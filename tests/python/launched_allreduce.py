"""Run by test_launch.py under torchrun, mpirun and a simulated srun: each rank prints one line."""
import os

import torch
import torch.distributed as dist

import gradzip

gradzip.init_process_group("gradzip")
x = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(x)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} local {os.environ['LOCAL_RANK']} "
      f"backend {dist.get_backend()} sum {x[0].item():g}", flush=True)
dist.destroy_process_group()
