"""The demo CNN's final test accuracy over seeds, for specs at a door: a markdown table
with each seed's accuracy, the mean, the mean's distance from the first row's, and the
bytes each rank sent in the last epoch (fewer than dense fp32 by how many times).

    .venv/bin/python benchmarks/accuracy.py allreduce "stc:density=0.01" "hook stc:density=0.01" \\
        --seeds 0 1 2

A spec prefixed with "hook " runs at the DDP comm hook with the model (layer-aware
compression); otherwise at the backend. Each run is examples/train_fashion_mnist.py under
torchrun (4 ranks, 3 epochs unless --epochs says otherwise), one after another.
"""
import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(spec, door, seed, epochs, ranks, lr, momentum):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--standalone", f"--nproc-per-node={ranks}", os.path.join(ROOT, "examples/train_fashion_mnist.py"),
           "--epochs", str(epochs), "--seed", str(seed), "--spec", spec, "--door", door]
    if lr is not None:
        cmd += ["--lr", str(lr)]
    if momentum is not None:
        cmd += ["--momentum", str(momentum)]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    accuracy = float(re.search(r"final test accuracy: ([\d.]+)%", out.stdout).group(1))
    last_epoch = [line for line in out.stdout.splitlines() if line.startswith("epoch ")][-1]
    sent = re.search(r"sent per rank \[([\d.]+)", last_epoch).group(1)
    fewer = re.search(r"\(([\d.]+)x fewer", last_epoch).group(1)
    return accuracy, float(sent), float(fewer), time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", help='specs; "hook <spec>" for the DDP hook with the model')
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--lr", type=float, default=None, help="the demo's learning rate (default: its own)")
    parser.add_argument("--momentum", type=float, default=None, help="the demo's SGD momentum (default: its own)")
    args = parser.parse_args()
    print(f"| door | spec | {' | '.join(f'seed {s}' for s in args.seeds)} | mean | vs first row | "
          "sent per rank, last epoch | fewer bytes than dense |")
    print("|---|---|" + "---|" * len(args.seeds) + "---|---|---|---|")
    first = None
    for entry in args.specs:
        door, spec = ("hook", entry[5:]) if entry.startswith("hook ") else ("backend", entry)
        results = [run(spec, door, seed, args.epochs, args.ranks, args.lr, args.momentum) for seed in args.seeds]
        mean = sum(r[0] for r in results) / len(results)
        first = mean if first is None else first
        print(f"| {door} | `{spec}` | {' | '.join(f'{r[0]:.2f}%' for r in results)} | {mean:.2f}% | "
              f"{mean - first:+.2f} | {results[0][1]:.2f} MB | {results[0][2]:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
