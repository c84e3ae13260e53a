"""Run by test_by_name.py under torchrun: a user's script that never imports gradzip and
only names the backend (BACKEND, default "gradzip"). Each rank prints one line."""
import os
import sys

import torch
import torch.distributed as dist

loaded_with_torch = "gradzip" in sys.modules
dist.init_process_group(os.environ.get("BACKEND", "gradzip"))
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.linspace(-1, 1, 4096) * (rank + 1)
dist.all_reduce(x)  # the aggregation GRADZIP_AGGREGATION names
total = torch.tensor([float(rank)])
dist.all_reduce(total)  # a second, to see that calls go on
y = torch.full((3,), float(rank))
dist.broadcast(y, src=world - 1)  # every other collective is exact
stats = sys.modules["gradzip"].stats()  # the package the first group loaded
print(f"rank {rank} backend {dist.get_backend()} loaded-with-torch {loaded_with_torch} "
      f"broadcast {y[0].item():g} sent {stats['bytes_sent']} dense {stats['dense_bytes']} "
      f"checksum {float(x.double().abs().sum()):.9g};", flush=True)
dist.destroy_process_group()
