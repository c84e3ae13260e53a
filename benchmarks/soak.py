"""Long runs: resident memory and open file descriptors over many all_reduces.

    torchrun --standalone --nproc-per-node 4 benchmarks/soak.py                 # 10,000 calls each
    torchrun --standalone --nproc-per-node 2 benchmarks/soak.py --calls 300     # the tests' version

For each aggregation, a gradzip process group all-reduces a gradient-sized tensor
(--numel) `--calls` times, plus, every 10th call, a tensor of a size never seen before
(the backend keys state by call sequence: keys come and go; each would keep a residual
of 4 x its size if state were never dropped). Each rank samples its
resident set (/proc/self/statm) and its open descriptors (/proc/self/fd) after a
warm-up tenth of the calls and at the end; the table gives the largest growth over the
ranks. The groups are destroyed in turn, so descriptors must return too. Rank 0 prints
the table and, with --json, writes the rows.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist

import gradzip

SPECS = ["allreduce", "topk:density=0.01", "stc:density=0.01,exchange=oneshot", "stc:density=0.01,exchange=twophase",
         "sign", "qsgd:bits=4", "gossip:topology=ring", "choco:topology=ring,compress=sign,gamma=0.5"]


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def soak(spec: str, calls: int, numel: int, rank: int) -> dict:
    group = dist.new_group(backend="gradzip", pg_options=gradzip.Options(aggregation=spec))
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    warm = max(calls // 10, 1)
    start = time.perf_counter()
    for call in range(calls):
        y = x.clone()
        dist.all_reduce(y, group=group)
        if call % 10 == 9:  # a tensor that comes once and goes
            dist.all_reduce(torch.ones(numel + call), group=group)
        if call + 1 == warm:
            dist.barrier(group=group)
            rss0, fds0 = resident_mb(), open_fds()
    dist.barrier(group=group)
    seconds = time.perf_counter() - start
    rss1, fds1 = resident_mb(), open_fds()
    assert torch.isfinite(y).all(), spec
    dist.destroy_process_group(group)
    return {"rss_growth_mb": rss1 - rss0, "fd_growth": fds1 - fds0, "rss_mb": rss1, "fds": fds1,
            "seconds": seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--numel", type=int, default=100_000)
    parser.add_argument("--specs", default=";".join(SPECS), help="';'-separated specs")
    parser.add_argument("--json", help="write the rows here (rank 0)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    gradzip.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    fds_before = open_fds()
    rows = []
    for spec in [s for s in args.specs.split(";") if s]:
        mine = soak(spec, args.calls, args.numel, rank)
        worst = torch.tensor([mine["rss_growth_mb"], mine["fd_growth"], mine["rss_mb"], mine["fds"], mine["seconds"]],
                             dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        rows.append({"spec": spec, "calls": args.calls, "rss_growth_mb": worst[0].item(),
                     "fd_growth": int(worst[1].item()), "rss_mb": worst[2].item(), "fds": int(worst[3].item()),
                     "seconds": worst[4].item()})
    fds_left = torch.tensor([open_fds() - fds_before])
    dist.all_reduce(fds_left, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"{world} ranks, {args.calls} all_reduces of {args.numel} fp32 per aggregation "
              f"(+1 of a new size every 10th); growth from the end of the first tenth to the end, "
              f"the largest over the ranks")
        print("| aggregation | resident MB at end | growth MB | open fds at end | fd growth | seconds |")
        print("|---|---|---|---|---|---|")
        for row in rows:
            print(f"| `{row['spec']}` | {row['rss_mb']:.1f} | {row['rss_growth_mb']:+.2f} | {row['fds']} | "
                  f"{row['fd_growth']:+d} | {row['seconds']:.1f} |")
        print(f"descriptors left open after every group was destroyed: {fds_left.item():+d}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"world_size": world, "rows": rows, "fds_left": fds_left.item()}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
