"""End-to-end all_reduce of one CUDA tensor per rank: gradzip's compressed specs against
plain NCCL and NCCL on an fp16 copy (what PyTorch's fp16 comm hook does), in one run.

    torchrun --standalone --nproc-per-node <GPUs> benchmarks/cuda_allreduce.py [--numel N]
    torchrun --nproc-per-node 2 benchmarks/cuda_allreduce.py --device cpu --quick   # the script's own check

Needs one GPU per rank (NCCL does not share a GPU between ranks), so at least two;
`--device cpu` runs the same rows on CPU tensors with Gloo as the baseline.
Each row: the median time of an all_reduce (CUDA synchronized, warm-up first), NCCL's
time over it ("x nccl"), the bytes each rank sent (gradzip.stats()), and the floor: those
bytes at the per-rank bandwidth NCCL's own ring all-reduce reached in this run (it sends
2(P-1)/P × 4n bytes). Rank 0 prints the table and writes JSON to benchmarks/results/.
"""
import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

import gradzip

# The last two: CUDA tensors take one two-phase round unless the spec asks (docs/cuda.md),
# so the table shows what rounds would buy.
SPECS = ["fp16", "topk:density=0.01", "stc:density=0.01", "sign", "qsgd:bits=4", "qsgd:bits=8",
         "qsgd:bits=4,exchange=twophase", "qsgd:bits=4,exchange=twophase,rounds=4"]


def synchronize():
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    synchronize()
    times = []
    for _ in range(reps):
        dist.barrier()
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--numel", type=int, default=25_000_000)
    parser.add_argument("--repetitions", type=int, default=10)
    parser.add_argument("--specs", default=";".join(SPECS), help="';'-separated (or ',' when no spec has commas)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="100k elements, 3 repetitions")
    parser.add_argument("--json", default=str(Path(__file__).resolve().parent / "results" / "cuda_allreduce.json"))
    args = parser.parse_args()
    if args.quick:
        args.numel, args.repetitions = 100_000, 3
    specs = args.specs.split(";") if ";" in args.specs else args.specs.split(",")
    on_gpu = args.device == "cuda"
    local_rank = int(os.environ["LOCAL_RANK"])
    if on_gpu:
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")
    baseline = dist.get_backend()
    rank, world = dist.get_rank(), dist.get_world_size()
    n = args.numel
    x = torch.randn(n, generator=torch.Generator().manual_seed(rank)).to(args.device)
    t = torch.empty_like(x)

    def dense():
        t.copy_(x)
        dist.all_reduce(t)

    def fp16():
        half = x.half()
        dist.all_reduce(half)
        t.copy_(half)

    nccl_s = timed(dense, args.repetitions)  # the baseline: NCCL, or Gloo with --device cpu
    nccl_bytes = 2 * (world - 1) / world * 4 * n
    bandwidth = nccl_bytes / nccl_s
    rows = [dict(method=baseline, seconds=nccl_s, bytes_sent=nccl_bytes, floor_seconds=nccl_s),
            dict(method=f"{baseline} fp16 copy", seconds=timed(fp16, args.repetitions), bytes_sent=nccl_bytes / 2,
                 floor_seconds=nccl_s / 2)]
    for spec in specs:
        group = dist.new_group(backend="gradzip", pg_options=gradzip.Options(aggregation=spec))
        dist.barrier()

        def compressed(group=group):
            t.copy_(x)
            dist.all_reduce(t, group=group)

        for _ in range(3):
            compressed()
        gradzip.reset_stats(group)
        seconds = timed(compressed, args.repetitions, warmup=0)
        sent = gradzip.stats(group)["bytes_sent"] / args.repetitions
        rows.append(dict(method=f"gradzip {spec}", seconds=seconds, bytes_sent=sent, floor_seconds=sent / bandwidth))
    if rank == 0:
        device = torch.cuda.get_device_name() if on_gpu else "CPU"
        print(f"all_reduce of {n} fp32 on {world} x {device}; {baseline}'s ring at {bandwidth / 1e9:.1f} GB/s per rank")
        print(f"{'method':32s} {'ms':>9s} {'x ' + baseline:>7s} {'MB sent':>9s} {'floor ms':>9s} {'time/floor':>10s}")
        for r in rows:
            r["speedup_vs_baseline"] = nccl_s / r["seconds"]
            print(f"{r['method']:32s} {1e3 * r['seconds']:9.3f} {r['speedup_vs_baseline']:7.2f} "
                  f"{r['bytes_sent'] / 1e6:9.2f} {1e3 * r['floor_seconds']:9.3f} "
                  f"{r['seconds'] / r['floor_seconds']:10.2f}")
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(device=device, baseline=baseline, world=world, numel=n, rows=rows), indent=1))
        print(f"wrote {path}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
