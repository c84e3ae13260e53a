"""A rank that ends right after waiting for its last compressed all-reduce (no cleanup):
the aggregation's worker must not be the thread that lets go of the caller's tensors
while the interpreter shuts down. Run by test_async.py with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set."""
import torch
import torch.distributed as dist

import gradzip
from gradzip import _C
from gradzip._transport import transport_of

dist.init_process_group("gloo")
transport = transport_of(dist.group.WORLD, torch.device("cpu"))
n, count = 1 << 20, 12
pieces = [(f"p{i}", n // count + (i < n % count)) for i in range(count)]
aggregation = _C.Aggregation(gradzip.Spec("topk:density=0.01,exchange=oneshot"))
x = torch.randn(n)
for _ in range(6):
    aggregation.submit_pieces(x.clone(), pieces, dist.ReduceOp.AVG, transport).wait()
print("finished", flush=True)
