"""all_reduce time of gradzip (exact aggregation) against Gloo, measured in the same run.

    torchrun --standalone --nproc-per-node 4 benchmarks/collectives.py
    mpirun -np 4 python benchmarks/collectives.py

Three process groups share the ranks: Gloo, gradzip with its collective check (the
default) and gradzip with validate=False. For each size the calls alternate between
the groups, so drift in the machine's load hits all three alike. A call's time is the
slowest rank's; the table gives the median over the repetitions, and each gradzip
column's ratio to Gloo. Rank 0 prints the table and writes JSON.
"""
import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

import gradzip

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
QUICK_SIZES = [4 << 10, 1 << 20]


def repetitions(nbytes, quick):
    if quick:
        return 3
    return 40 if nbytes <= 1 << 20 else 15 if nbytes <= 16 << 20 else 5


def time_call(fn, group):
    dist.barrier(group=group)
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def human(nbytes):
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:g} {unit}"
        nbytes /= 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two sizes, three repetitions (seconds)")
    parser.add_argument("--json", default="benchmarks/results/collectives.json")
    args = parser.parse_args()

    torch.set_num_threads(1)
    gradzip.init_process_group("gradzip")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {
        "gloo": dist.new_group(backend="gloo"),
        "gradzip": dist.group.WORLD,
        "gradzip (validate=False)": dist.new_group(backend="gradzip", pg_options=gradzip.Options(validate=False)),
    }
    rows = []
    for nbytes in (QUICK_SIZES if args.quick else SIZES):
        tensor = torch.ones(nbytes // 4)
        samples = {name: [] for name in groups}
        for rep in range(repetitions(nbytes, args.quick) + 1):
            for name, group in groups.items():
                elapsed = time_call(lambda: dist.all_reduce(tensor, group=group), group)
                slowest = torch.tensor([elapsed], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=groups["gloo"])
                if rep > 0:  # the first round warms up connections and caches
                    samples[name].append(slowest.item())
        medians = {name: statistics.median(s) for name, s in samples.items()}
        rows.append({"bytes": nbytes, "repetitions": len(samples["gloo"]),
                     "median_s": medians,
                     "ratio_to_gloo": {name: medians[name] / medians["gloo"] for name in groups}})

    if rank == 0:
        names = list(groups)
        header = f"{'size':>8} | " + " | ".join(f"{n:>24}" for n in names) + " | " + \
            " | ".join(f"{n + ' / gloo':>34}" for n in names[1:])
        print(f"all_reduce, {world} ranks, fp32, median of the slowest rank's time per call "
              f"({platform.node()}, {os.cpu_count()} cores)")
        print(header)
        print("-" * len(header))
        for row in rows:
            times = " | ".join(f"{row['median_s'][n] * 1e3:>21.3f} ms" for n in names)
            ratios = " | ".join(f"{row['ratio_to_gloo'][n]:>34.3f}" for n in names[1:])
            print(f"{human(row['bytes']):>8} | {times} | {ratios}")
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"world_size": world, "host": platform.node(), "cores": os.cpu_count(),
                                   "torch": torch.__version__, "rows": rows}, indent=2))
        print(f"wrote {out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
