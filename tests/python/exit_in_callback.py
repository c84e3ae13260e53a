"""A rank that ends (no cleanup) while a Python callback on a call's future still runs on
one of gradzip's threads: the interpreter's exit must wait for it (gradzip's atexit
handler, csrc/work/exit_gate.h) instead of ending that thread mid-callback, which aborted
the process. Run by test_async.py with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set
and the call as the argument: "recv" (a checked receive's thread) or "all_reduce" (the
aggregation's worker)."""
import sys
import threading
import time

import torch
import torch.distributed as dist

import gradzip

gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation="topk:density=0.1"))
rank, call = dist.get_rank(), sys.argv[1]
started = threading.Event()


def slow(future):
    started.set()
    time.sleep(1.0)
    print("callback finished", flush=True)
    return future.value()


t = torch.ones(1000)
if call == "recv":
    if rank == 0:
        dist.send(t, 1)
    else:
        dist.irecv(t, 0).get_future().then(slow)
else:
    dist.all_reduce(t, async_op=True).get_future().then(slow)
if call == "all_reduce" or rank == 1:
    assert started.wait(60), "the callback never ran"
print("exiting", flush=True)
