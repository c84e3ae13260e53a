"""What decoding costs a receiver, per codec: time per element of a payload its peer made
honestly, and of the most expensive payload a hostile peer can make for the same
element count (docs/wire-format.md, "Decoder cost").

    python benchmarks/decoder_cost.py            # n = 2^16 and 2^20
    python benchmarks/decoder_cost.py --quick    # n = 2^16, fewer repetitions

For every codec: the payload's bytes, the median decode time (gradzip.codec.decode's
decoder, adding into a preallocated sum, one thread) and that time per element. For
polar, whose decoder designs a frozen set per (block, free bits) it has not seen, also
the smallest payload of a shape this process has not designed (a block of 2^16 with a
few free bits, a few dozen bytes): the worst a peer can make a gradzip.codec.decode call
spend, the design's cost. (An honest payload's first decode costs the same design; this
process encoded the others, which designed their sets already, as a receiver's steady
state has.) An aggregation's
decoder refuses any shape but its spec's, before designing (tests/cpp/codec_test.cpp).
Prints a table and writes JSON.
"""
import argparse
import json
import platform
import statistics
import struct
import time
from pathlib import Path

import torch

from gradzip import _C

SPECS = ["identity", "fp16", "bf16", "topk:density=0.01", "topk:density=0.01,values=fp16", "randomk:density=0.01",
         "stc:density=0.01", "sign", "qsgd:bits=4", "uniform:threshold=0", "sz", "zfp", "polar"]


def median_ms(fn, repetitions):
    fn()
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def timed_ms(fn):
    start = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - start)


def polar_payload(n, block, free):
    """A valid polar payload of n elements: its header and fields, zero scales and bits."""
    blocks = (n + block - 1) // block
    bits = (blocks - 1) * free
    last = n - (blocks - 1) * block
    size = 1 << max(0, (last - 1).bit_length())
    bits += free if last == block else -(-free * size // block)
    header = _C.encode(torch.zeros(0), "polar", None, 0, 0, 0)[0]  # a 16-byte header to patch
    head = bytearray(bytes(header)[:16])
    head[8:16] = struct.pack("<Q", n)
    return bytes(head) + struct.pack("<II", block, free) + bytes(4 * blocks) + bytes(-(-bits // 8))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default="benchmarks/results/decoder_cost.json")
    args = parser.parse_args()
    sizes = [1 << 16] if args.quick else [1 << 16, 1 << 20]
    if args.quick:
        args.repetitions = 2
    torch.set_num_threads(1)
    rows = []
    print(f"{'codec':<32} | {'n':>8} | {'payload':>10} | {'decode':>9} | {'ns/element':>10}")
    print("-" * 83)
    for n in sizes:
        x = torch.randn(n, generator=torch.Generator().manual_seed(0))
        total = torch.zeros(n)
        cases = []
        for spec in SPECS:
            payload = bytes(_C.encode(x, spec, None, 0, 0, 0)[0])
            cases.append((spec, payload, median_ms(lambda: _C.decode_add(payload, total), args.repetitions)))
        block = min(n, 1 << 16)
        hostile = []
        for i in range(args.repetitions):  # free-bit counts this process has not designed yet
            payload = polar_payload(n, block, 1 + sizes.index(n) * args.repetitions + i)
            hostile.append(timed_ms(lambda: _C.decode_add(payload, total)))
        cases.append((f"polar, hostile, block {block}", payload, statistics.median(hostile)))
        for spec, payload, ms in cases:
            rows.append({"codec": spec, "numel": n, "payload_bytes": len(payload), "decode_ms": ms,
                         "ns_per_element": 1e6 * ms / n})
            print(f"{spec:<32} | {n:>8} | {len(payload):>8} B | {ms:>6.2f} ms | {1e6 * ms / n:>10.1f}", flush=True)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": platform.node(), "torch": torch.__version__, "rows": rows}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
