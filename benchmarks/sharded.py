"""Compression for sharded and low-communication training on Fashion-MNIST: FSDP2's
reduce-scatter and DiLoCo's outer steps, exact against compressed.

    .venv/bin/python benchmarks/sharded.py                 # 4 ranks, 3 epochs
    .venv/bin/python benchmarks/sharded.py --quick         # 2 ranks, a few steps, no exact rows (tests)

Each row is one launch of examples/train_fsdp.py or examples/train_diloco.py under
torchrun (same seed, same shards, same epochs). FSDP rows: final test accuracy, its
difference to exact FSDP, the bytes each rank sent in reduce-scatters and how many times
fewer than the exact reduce-scatter's. DiLoCo rows (H local AdamW steps, then the outer
step): accuracy against uncompressed DiLoCo, the bytes each rank sent in outer steps and
how many times fewer than DDP's dense fp32 all-reduce of every step for the same samples.
Prints two tables and writes JSON.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")

# examples/train_fsdp.py gives compress() the optimizer: the STC and top-k rows run with
# its momentum folded in (their spec reads `...,momentum=0.9`).
FSDP_SPECS = ["allreduce", "qsgd:bits=4", "qsgd:bits=8", "stc:density=0.01", "stc:density=0.05", "topk:density=0.01"]
DILOCO_SPECS = ["allreduce", "qsgd:bits=8,norm=max,ef=1", "qsgd:bits=4,norm=max,ef=1", "qsgd:bits=4,ef=1",
                "qsgd:bits=4", "stc:density=0.01", "sign"]
QUICK_FSDP, QUICK_DILOCO = ["stc:density=0.01"], ["qsgd:bits=4,norm=max,ef=1"]


def launch(script, spec, ranks, extra):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", str(ranks), str(ROOT / script),
                           "--spec", spec, *extra], env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{script} --spec {spec} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    print(done.stdout.strip().splitlines()[-2], flush=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--local-steps", type=int, default=20, help="DiLoCo's H")
    parser.add_argument("--quick", action="store_true", help="2 ranks, 1 epoch of 30 steps, one compressed spec each")
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/sharded.json"))
    args = parser.parse_args()
    fsdp_specs, diloco_specs = (QUICK_FSDP, QUICK_DILOCO) if args.quick else (FSDP_SPECS, DILOCO_SPECS)
    ranks = 2 if args.quick else args.ranks
    extra = ["--epochs", "1", "--max-steps", "30"] if args.quick else ["--epochs", str(args.epochs)]

    fsdp = [launch("examples/train_fsdp.py", spec, ranks, extra) for spec in fsdp_specs]
    diloco = [launch("examples/train_diloco.py", spec, ranks, extra + ["--local-steps", str(args.local_steps)])
              for spec in diloco_specs]

    # The exact reduce-scatter sends what a dense fp32 ring does: every row's dense_bytes.
    exact = fsdp[0] if fsdp[0]["spec"] == "allreduce" else None
    print(f"\nFSDP2 reduce-scatter, {ranks} ranks, {extra}")
    print("| spec | accuracy | vs exact (points) | sent per rank (MB) | fewer bytes than exact | time (s) |")
    print("|---|---|---|---|---|---|")
    for row in fsdp:
        row["points_vs_exact"] = 100 * (row["accuracy"] - exact["accuracy"]) if exact else None
        row["fewer_bytes_than_exact"] = row["dense_bytes"] / max(row["bytes_sent"], 1)
        points = f"{row['points_vs_exact']:+.2f}" if exact else "—"
        print(f"| {row['spec']} | {row['accuracy']:.2%} | {points} | "
              f"{row['bytes_sent'] / 1e6:.2f} | {row['fewer_bytes_than_exact']:.1f}x | {row['seconds']:.1f} |")
    base = diloco[0] if diloco[0]["spec"] == "allreduce" else None
    print(f"\nDiLoCo outer steps, {ranks} ranks, H={args.local_steps}, {extra}")
    print("| spec | accuracy | vs uncompressed DiLoCo (points) | sent per rank (MB) | fewer bytes than DDP dense "
          "| time (s) |")
    print("|---|---|---|---|---|---|")
    for row in diloco:
        row["points_vs_uncompressed"] = 100 * (row["accuracy"] - base["accuracy"]) if base else None
        row["fewer_bytes_than_ddp"] = row["ddp_dense_bytes"] / max(row["bytes_sent"], 1)
        points = f"{row['points_vs_uncompressed']:+.2f}" if base else "—"
        print(f"| {row['spec']} | {row['accuracy']:.2%} | {points} | "
              f"{row['bytes_sent'] / 1e6:.2f} | {row['fewer_bytes_than_ddp']:.0f}x | {row['seconds']:.1f} |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"ranks": ranks, "args": extra, "local_steps": args.local_steps,
                                           "fsdp": fsdp, "diloco": diloco}, indent=1))


if __name__ == "__main__":
    main()
