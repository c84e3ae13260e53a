"""Polar lossy source coding of signs against the rate–distortion bound.

    python benchmarks/polar.py            # rates 0.25 / 0.5 / 0.75, blocks 2^10..2^16, lists 1 and 4
    python benchmarks/polar.py --quick

The source is the signs of Gaussian values (Bernoulli(1/2)); distortion is the fraction of
signs the decoded tensor gets wrong, the bound D = h2^{-1}(1 − R) the least any code of rate
R can reach. Encode speed in Msigns/s (one thread). Prints a table and writes JSON.
"""
import argparse
import json
import time
from pathlib import Path

import torch

import gradzip


def bound(rate: float) -> float:
    low, high = 0.0, 0.5  # h2 is increasing on [0, 1/2]
    for _ in range(60):
        mid = (low + high) / 2
        h2 = -mid * torch.log2(torch.tensor(mid, dtype=torch.float64)) - (1 - mid) * torch.log2(
            torch.tensor(1 - mid, dtype=torch.float64))
        low, high = (mid, high) if h2.item() < 1 - rate else (low, mid)
    return low


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default="benchmarks/results/polar.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    blocks = [1024, 4096] if args.quick else [1024, 4096, 16384, 65536]
    elements = 1 << (16 if args.quick else 20)
    x = torch.randn(elements, generator=torch.Generator().manual_seed(0))
    rows = []
    header = f"{'rate':>5} | {'block':>6} | {'list':>4} | {'distortion':>10} | {'bound':>6} | {'D/bound':>7} | {'Msigns/s':>8}"
    print(header)
    print("-" * len(header))
    for rate in (0.25, 0.5, 0.75):
        for block in blocks:
            for list_size in (1, 4):
                if list_size > 1 and block > 4096:
                    continue  # list encoding at long blocks: minutes
                spec = f"polar:rate={rate},block={block},list={list_size}"
                start = time.perf_counter()
                data = gradzip.codec.encode(x, spec)
                seconds = time.perf_counter() - start
                y = gradzip.codec.decode(data, like=x)
                distortion = (torch.signbit(x) != torch.signbit(y)).double().mean().item()
                row = {"rate": rate, "block": block, "list": list_size, "distortion": distortion,
                       "bound": bound(rate), "msigns_per_s": elements / seconds / 1e6}
                rows.append(row)
                print(f"{rate:>5} | {block:>6} | {list_size:>4} | {distortion:>10.4f} | {row['bound']:>6.4f} | "
                      f"{distortion / row['bound']:>7.3f} | {row['msigns_per_s']:>8.1f}", flush=True)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
