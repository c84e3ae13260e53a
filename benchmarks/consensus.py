"""Consensus speed of gossip and CHOCO against the topology's spectral-gap prediction.

    torchrun --standalone --nproc-per-node 8 benchmarks/consensus.py
    mpirun -np 8 python benchmarks/consensus.py

Every rank starts from its own random vector and repeatedly applies one aggregation
(gradzip.Aggregation(spec)) with no training in between. The distance to consensus
||X_t - mean|| is gathered after every step. The table gives, per spec, the measured
contraction per step (geometric mean over the steps, and over the last 10, both before
the distance falls under 1e-9 of the start: float64 vectors; choco's copies are fp32) next to the
prediction rho = 1 - spectral gap (per step; for onepeer, 0 after log2 n steps; for choco,
the rho of its uncompressed graph, which compression can only slow), and the steps to
shrink the distance 1000 times. Rank 0 prints it and writes JSON.
"""
import argparse
import json
import os
import platform
from pathlib import Path

import torch
import torch.distributed as dist

import gradzip

SPECS = ["gossip:topology=ring", "gossip:topology=torus", "gossip:topology=exp", "gossip:topology=onepeer",
         "gossip:topology=complete", "choco:topology=exp,compress=sign,block=64,gamma=0.8",
         "choco:topology=exp,compress=topk,density=0.1,gamma=0.2"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--numel", type=int, default=10000)
    parser.add_argument("--specs", default=";".join(SPECS), help="specs separated by ';'")
    parser.add_argument("--quick", action="store_true", help="12 steps of 1000 elements (seconds)")
    parser.add_argument("--json", default="benchmarks/results/consensus.json")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.numel = 12, 1000
    torch.set_num_threads(1)
    gradzip.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for spec in [s for s in args.specs.split(";") if s]:
        try:
            agg = gradzip.Aggregation(spec)
            name = gradzip.canonical_spec(spec)
            topology = gradzip.Topology(spec.split("topology=")[1].split(",")[0], world)
        except ValueError as e:  # e.g. a torus or onepeer that this world size cannot take
            if rank == 0:
                print(f"skipped {spec}: {e}")
            continue
        x = torch.randn(args.numel, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
        distances = []
        for step in range(args.steps + 1):
            mean = x.clone()
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
            squared = (x - mean).double().pow(2).sum()
            dist.all_reduce(squared)
            distances.append(squared.sqrt().item())
            if step < args.steps:
                agg(x)
        rho = topology.consensus_rate() ** (1 / topology.period)
        # Rates over the steps before rounding's floor (1e-9 of the start) is reached.
        above = [t for t, d in enumerate(distances) if d > 1e-9 * distances[0]]
        end = max(1, above[-1])
        overall = (distances[end] / distances[0]) ** (1 / end)
        window = min(10, end)
        last = (distances[end] / distances[end - window]) ** (1 / window)
        shrunk = next((t for t, d in enumerate(distances) if d <= distances[0] / 1000), None)
        rows.append({"spec": name, "predicted_rate": rho, "measured_rate": overall, "measured_rate_last10": last,
                     "steps_to_1e-3": shrunk, "spectral_gap": topology.spectral_gap(), "distances": distances})
    if rank == 0:
        print(f"consensus, {world} ranks, {args.numel} float64 per rank, {args.steps} steps; {platform.node()}")
        header = f"{'spec':<56} | {'gap':>6} | {'rho (pred.)':>11} | {'measured':>8} | {'last 10':>8} | " \
                 f"{'steps to 1e-3':>13}"
        print(header)
        print("-" * len(header))
        for r in rows:
            print(f"{r['spec']:<56} | {r['spectral_gap']:>6.3f} | {r['predicted_rate']:>11.4f} | "
                  f"{r['measured_rate']:>8.4f} | {r['measured_rate_last10']:>8.4f} | "
                  f"{r['steps_to_1e-3'] if r['steps_to_1e-3'] is not None else '-':>13}")
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"world_size": world, "host": platform.node(), "cores": os.cpu_count(),
                                   "steps": args.steps, "rows": rows}, indent=2))
        print(f"wrote {out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
