"""Encode and decode throughput of every codec on one buffer, against memcpy of the same
buffer, and top-k against torch.topk, all measured in the same run on one thread.

    python benchmarks/codecs.py                 # 25M fp32 elements (100 MB), like ResNet-50
    python benchmarks/codecs.py --quick         # 1M elements, fewer repetitions

Throughput is input bytes per second (n × 4 / time); "of memcpy" is that throughput over
memcpy's, the bandwidth floor of a pass that reads and writes the buffer once. Encode
includes error feedback (x + residual, and the residual update) where the codec's
default has it and writes into a buffer kept from call to call (as the exchange's slots
are); decode adds into a preallocated fp32 sum, as the aggregation does.

Floor: the codec's own memory traffic over memcpy's bandwidth (8n bytes in memcpy's
time), measured in the same run. Encode reads x (4n), reads and writes the residual with
error feedback (8n) and writes the payload; decode reads the payload and reads and
writes the sum where it adds (8 bytes per element it touches: k for the sparse codecs,
n for the others). "x floor" is the time over it: 1.0 is as fast as memory allows.
A single process. Prints a table and writes JSON.
"""
import argparse
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path

import torch

import gradzip
from gradzip import _C

CODECS = [
    ("identity", False), ("fp16", False), ("bf16", False),
    ("topk:density=0.01", True), ("topk:density=0.01,approx=1", True), ("topk:density=0.001", True),
    ("randomk:density=0.01", False), ("stc:density=0.01", True), ("stc:density=0.001", True),
    ("sign", True), ("sign:vote=majority", False), ("qsgd:bits=4", False), ("qsgd:bits=8", False),
]


def touched_elements(spec: str, n: int) -> int:
    """Elements a decode adds into: k for the sparse codecs, else n."""
    bound = gradzip.Spec(spec)
    if bound.name in ("topk", "stc", "randomk"):
        return min(n, math.ceil(float(bound.params["density"]) * n))
    return n


def median_time(fn, repetitions):
    fn()  # warm-up: page faults, caches
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=25_000_000)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default="benchmarks/results/codecs.json")
    args = parser.parse_args()
    if args.quick:
        args.numel, args.repetitions = 1_000_000, 2
    torch.set_num_threads(1)
    n = args.numel
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    copy = torch.empty_like(x)
    total = torch.zeros(n)  # decode adds into it, as an aggregation sums the ranks' payloads
    memcpy = median_time(lambda: copy.copy_(x), args.repetitions)
    gbps = lambda seconds: n * 4 / seconds / 1e9  # noqa: E731

    rows = []
    for spec, ef in CODECS:
        residual = torch.zeros(n) if ef else None
        payload, _ = _C.encode(x, spec, residual, 0, 0, 0)
        # Into a buffer kept from call to call, as an exchange's slots are (fresh bytes of
        # this size would time the page faults of their first touch).
        slot = torch.empty(_C.max_payload_bytes(gradzip.Spec(spec), n), dtype=torch.uint8)
        encode = median_time(lambda: _C.encode_into(x, spec, residual, 0, 0, 0, slot), args.repetitions)
        decode = median_time(lambda: _C.decode_add(payload, total), args.repetitions)
        bandwidth = 8 * n / memcpy
        encode_floor = (4 * n + (8 * n if ef else 0) + len(payload)) / bandwidth
        decode_floor = (len(payload) + 8 * touched_elements(spec, n)) / bandwidth
        rows.append({"codec": spec, "error_feedback": ef, "payload_bytes": len(payload),
                     "bits_per_element": 8 * len(payload) / n,
                     "encode_s": encode, "decode_s": decode,
                     "encode_floor_s": encode_floor, "decode_floor_s": decode_floor,
                     "encode_of_memcpy": memcpy / encode, "decode_of_memcpy": memcpy / decode})

    # The finiteness check every compressed all-reduce makes before encoding (its floor: one
    # read of x, 4n bytes), against torch's own way to ask.
    finite_check = median_time(lambda: _C.testing.all_finite(x), args.repetitions)
    torch_finite = median_time(lambda: torch.isfinite(x).all().item(), args.repetitions)

    k = max(1, n // 100)
    torch_topk = median_time(lambda: torch.topk(x.abs(), k, sorted=False), args.repetitions)
    ours = next(r for r in rows if r["codec"] == "topk:density=0.01")["encode_s"]

    print(f"codecs on {n} fp32 elements ({n * 4 / 1e6:.0f} MB), one thread, median of {args.repetitions} "
          f"({platform.node()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores)")
    print(f"memcpy: {memcpy * 1e3:.2f} ms ({gbps(memcpy):.1f} GB/s)")
    header = f"{'codec':<28} {'bits/elem':>9} {'encode ms':>10} {'floor ms':>9} {'x floor':>7} " \
             f"{'decode ms':>10} {'floor ms':>9} {'x floor':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['codec'] + (' +ef' if r['error_feedback'] else ''):<28} {r['bits_per_element']:>9.3f} "
              f"{r['encode_s'] * 1e3:>10.2f} {r['encode_floor_s'] * 1e3:>9.2f} "
              f"{r['encode_s'] / r['encode_floor_s']:>7.1f} {r['decode_s'] * 1e3:>10.2f} "
              f"{r['decode_floor_s'] * 1e3:>9.2f} {r['decode_s'] / r['decode_floor_s']:>7.1f}")
    print(f"finite check (before every compressed all-reduce): {finite_check * 1e3:.2f} ms, floor "
          f"{4 * n / (8 * n / memcpy) * 1e3:.2f} ms (one read); torch.isfinite(x).all() {torch_finite * 1e3:.2f} ms")
    print(f"top-k 1%: torch.topk(|x|, k) {torch_topk * 1e3:.1f} ms, gradzip topk encode (+ef) {ours * 1e3:.1f} ms: "
          f"{torch_topk / ours:.1f}x faster")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"numel": n, "memcpy_s": memcpy, "torch_topk_s": torch_topk,
                               "finite_check_s": finite_check, "torch_isfinite_s": torch_finite, "rows": rows,
                               "host": platform.node(), "gradzip": gradzip.__version__}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
