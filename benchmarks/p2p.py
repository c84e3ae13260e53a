"""Point-to-point on a gradzip group against Gloo: a ring, in the same run.

    torchrun --standalone --nproc-per-node 4 benchmarks/p2p.py
    torchrun --standalone --nproc-per-node 4 benchmarks/p2p.py --sizes 4096,1048576 --repeats 50

Each rank isends a message to the next rank and irecvs one from the previous, then waits
on its send before its receive (the order that hung checked p2p once). Methods, each a
process group over the same ranks: "gloo" (Gloo's own send/recv), "gradzip" (checked:
a header per message, receives driven by the group's receive threads) and "gradzip
unchecked" (validate=False: forwarded to Gloo as is). For each size the repetitions go
round the methods in turn, so drift in the machine's load hits all alike. A step's time is
the slowest rank's, after a barrier; the table gives the median, the bandwidth (message
bytes over that time), the ratio to Gloo, and the floor: the message's bytes over the
copy bandwidth each rank gets while all ranks copy at once, measured in the same run
(loopback TCP copies every byte at least twice, so no method reaches it). Rank 0 prints
the table and writes JSON.
"""
import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

import gradzip

METHODS = ("gloo", "gradzip", "gradzip unchecked")


def ring_step(group, send, receive, rank, world):
    dist.barrier(group=group)
    start = time.perf_counter()
    works = [dist.isend(send, (rank + 1) % world, group=group), dist.irecv(receive, (rank - 1) % world, group=group)]
    for work in works:
        work.wait()
    return time.perf_counter() - start


def copy_bandwidth(nbytes, timer_group):
    """Bytes/s one rank copies while every rank copies at once (the median of 5)."""
    src, dst = torch.empty(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    times = []
    for _ in range(5):
        dist.barrier(group=timer_group)
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4096,1048576,67108864", help="message bytes, comma-separated")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", default="benchmarks/results/p2p.json")
    args = parser.parse_args()

    gradzip.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": dist.group.WORLD,
              "gradzip": dist.new_group(backend="gradzip"),
              "gradzip unchecked": dist.new_group(backend="gradzip", pg_options=gradzip.Options(validate=False))}
    timer = dist.new_group(backend="gloo")
    rows = []
    for nbytes in (int(s) for s in args.sizes.split(",")):
        send = torch.full((nbytes // 4,), float(rank))
        receives = {m: torch.empty(nbytes // 4) for m in METHODS}
        times = {m: [] for m in METHODS}
        repeats = max(5, args.repeats if nbytes <= 1 << 20 else args.repeats // 3)
        for step in range(repeats + 2):  # two warm-up rounds
            for method in METHODS:
                elapsed = torch.tensor([ring_step(groups[method], send, receives[method], rank, world)])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=timer)
                if step >= 2:
                    times[method].append(elapsed.item())
        for method in METHODS:
            assert torch.equal(receives[method], torch.full_like(receives[method], float((rank - 1) % world))), method
        floor = nbytes / copy_bandwidth(max(nbytes, 1 << 20), timer)
        gloo = statistics.median(times["gloo"])
        for method in METHODS:
            median = statistics.median(times[method])
            rows.append({"bytes": nbytes, "method": method, "median_s": median, "min_s": min(times[method]),
                         "bandwidth_gbs": nbytes / median / 1e9, "time_over_gloo": median / gloo,
                         "floor_s": floor, "repeats": repeats})
    if rank == 0:
        print(f"ring, {world} ranks, send waited before receive; {platform.node()}, torch {torch.__version__}")
        print(f"{'bytes':>10} {'method':<18} {'median us':>10} {'min us':>9} {'GB/s':>7} "
              f"{'time/gloo':>9} {'floor us':>9}")
        for row in rows:
            print(f"{row['bytes']:>10} {row['method']:<18} {row['median_s'] * 1e6:>10.1f} {row['min_s'] * 1e6:>9.1f} "
                  f"{row['bandwidth_gbs']:>7.2f} {row['time_over_gloo']:>9.2f} {row['floor_s'] * 1e6:>9.1f}")
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"world": world, "rows": rows}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
