"""all_reduce of a gradient: Gloo dense against gradzip's aggregations, in the same run.

    torchrun --standalone --nproc-per-node 4 benchmarks/collectives.py
    mpirun -np 4 python benchmarks/collectives.py --transports gloo,mpi
    sudo benchmarks/netns.sh --ranks 4 --rate 1gbit -- .venv/bin/python benchmarks/collectives.py

Every method is its own process group over the same ranks: "gloo" (dense, Gloo's own
all-reduce) and a gradzip group per spec ("allreduce" is gradzip's exact path, with the
collective check that is on by default; "allreduce unchecked" the same with
validate=False: their ratio is the check's cost; --unchecked adds "SPEC unchecked" for
every spec; --control adds "gloo control", a second Gloo group timed like the first: the
gap between two identical groups is the run's noise). For each size the calls go round
the methods in turn, each round starting one method further on, so drift in the
machine's load hits all alike and no method always follows the same one. A call's time
is the slowest rank's, after a barrier; the table gives the median over the repetitions,
the bytes each rank sent per call (gradzip.stats(); for Gloo, the 2(P-1)/P x 4n bytes of
a ring all-reduce), the exchange gradzip chose (auto: the fewest wire bytes) and the
speedup over Gloo. With --transports gloo,mpi (under mpirun), "mpi" is
the MPI transport's own exact all-reduce (gradzip.mpi, unchecked) and every spec also
runs over MPI ("SPEC @mpi").

Floors: a method's link time is its wire bytes over the link rate (--link-rate, or the
rate netns.sh shaped; none on loopback), its memory time its memory traffic over the
copy bandwidth each rank gets while all ranks copy at once, both measured or set in the
same run. "floor" is their sum, the time if nothing overlapped; the exchanges' pipelined
rounds overlap the wire with the codec's passes, so a method can come in under it
(time/floor below 1). "overlapped" is the larger of the two, which no overlap can beat,
and time/overl. how far a method is from it. Memory traffic of a compressed all-reduce:
memory_bytes() below (encode, the payloads written and read, the sums zeroed and added
into). Rank 0 prints the table and writes JSON (floor_s, overlapped_floor_s).
"""
import argparse
import json
import math
import os
import platform
import re
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

import gradzip

SPECS = ["allreduce", "fp16", "topk:density=0.01", "topk:density=0.01,values=fp16", "stc:density=0.01", "sign",
         "qsgd:bits=4", "qsgd:bits=8"]
DEFAULT_NUMEL = 25_000_000  # fp32 gradient of ResNet-50
UNCHECKED = "allreduce unchecked"
MPI_DENSE = "mpi"
CONTROL = "gloo control"
GLOO = ("gloo", CONTROL, MPI_DENSE)  # not gradzip groups
DENSE = GLOO + ("allreduce", UNCHECKED)


def time_call(fn, group):
    dist.barrier(group=group)
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def link_rate_bits(text: str):
    """bits/s from a rate such as 1gbit, 100mbit (tc's units), or None."""
    match = re.search(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", text or "")
    if not match:
        return None
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


def copy_bandwidth(numel: int, group) -> float:
    """Bytes/s one rank moves in a copy (read + write) while every rank copies: the
    slowest rank's time per round, median of 5 rounds (ranks that share cores share them
    here too)."""
    src = torch.randn(numel)
    dst = torch.empty_like(src)
    rounds = []
    for _ in range(5):
        dist.barrier(group=group)
        start = time.perf_counter()
        dst.copy_(src)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        rounds.append(elapsed.item())
    return 8 * numel / statistics.median(rounds)


def memory_bytes(spec: str, numel: int, world: int, exchange: str, sent: int) -> int:
    """Bytes of memory a compressed all-reduce of numel fp32 elements must read and write:
    encode reads x (and reads and writes the residual with error feedback) and writes the
    payloads; decoding zeroes the sum, reads every payload it receives and adds it in, 8
    bytes per element it touches (the sparse codecs: their k per part; one-shot: P whole
    parts; two-phase: P pieces of n/P at the owner, then one part per element). The
    payloads' own bytes are those sent, counted once written, once read."""
    if exchange == "dense" or spec == "allreduce":
        return 0
    bound = gradzip.Spec(spec)
    ef = bound.error_feedback
    if ef is None:  # the default: on for the biased codecs
        ef = bound.name in ("topk", "stc") or (bound.name == "sign" and "majority" not in spec)
    density = float(bound.params["density"]) if bound.name in ("topk", "stc", "randomk") else 1.0
    touched = lambda elements: math.ceil(density * elements)  # noqa: E731
    chunk = numel // world
    encoded = numel + (chunk if exchange == "twophase" else 0)  # the owner re-encodes its chunk
    traffic = 4 * encoded + (8 * encoded if ef else 0) + 2 * sent
    if exchange == "twophase":
        traffic += 4 * chunk + 8 * touched(chunk) * world  # the owner's sum: zeroed, P pieces added
        traffic += 4 * numel + 8 * touched(chunk) * world  # the result: zeroed, each chunk added once
    else:
        traffic += 4 * numel + 8 * touched(numel) * world  # the result: zeroed, P parts added
    return traffic


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=lambda s: [int(float(v)) for v in s.split(",")], default=[DEFAULT_NUMEL],
                        help="fp32 elements per gradient, comma-separated for several (default 25e6)")
    parser.add_argument("--specs", default=";".join(SPECS),
                        help="gradzip specs, separated by ';' (default: %(default)s)")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--transports", default="gloo",
                        help="gloo, or gloo,mpi to run every method over the MPI transport too (under mpirun)")
    parser.add_argument("--unchecked", action="store_true",
                        help="every spec also on a group without the collective check (validate=False)")
    parser.add_argument("--control", action="store_true",
                        help="a second Gloo group timed like the first (the run's noise)")
    parser.add_argument("--quick", action="store_true", help="1M elements, 1 repetition (seconds)")
    parser.add_argument("--json", default="benchmarks/results/collectives.json")
    parser.add_argument("--link-rate", type=link_rate_bits, default=None,
                        help="the link's rate for the floor, e.g. 1gbit (default: netns.sh's, else none)")
    args = parser.parse_args()
    if args.quick:
        args.numel, args.repetitions = [1_000_000], 1

    torch.set_num_threads(1)
    gradzip.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    specs = [s for s in args.specs.split(";") if s]
    groups = {"gloo": dist.new_group(backend="gloo")}
    if args.control:
        groups[CONTROL] = dist.new_group(backend="gloo")
    for spec in specs:
        groups[spec] = dist.new_group(backend="gradzip", pg_options=gradzip.Options(aggregation=spec,
                                                                                      transport="gloo"))
        if spec == "allreduce" or args.unchecked:
            groups[f"{spec} unchecked"] = dist.new_group(backend="gradzip", pg_options=gradzip.Options(
                aggregation=spec, validate=False, transport="gloo"))
    if "mpi" in args.transports.split(","):
        groups[MPI_DENSE] = dist.new_group(backend="gradzip", pg_options=gradzip.Options(
            aggregation="allreduce", validate=False, transport="mpi"))
        for spec in specs:
            if spec != "allreduce":
                groups[f"{spec} @mpi"] = dist.new_group(backend="gradzip", pg_options=gradzip.Options(
                    aggregation=spec, transport="mpi"))
    network = os.environ.get("GRADZIP_NETWORK", "loopback")
    link = args.link_rate or link_rate_bits(network)

    rows = []
    for numel in args.numel:
        bandwidth = copy_bandwidth(numel, groups["gloo"])
        slowest_bw = torch.tensor([bandwidth], dtype=torch.float64)
        dist.all_reduce(slowest_bw, op=dist.ReduceOp.MIN, group=groups["gloo"])
        bandwidth = slowest_bw.item()
        gradient = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        samples = {name: [] for name in groups}
        sent = {}
        names = list(groups)
        for rep in range(args.repetitions + 1):  # the first round warms up connections and caches
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                group = groups[name]
                if name not in GLOO:
                    gradzip.reset_stats(group)
                tensor = gradient.clone()
                elapsed = time_call(lambda: dist.all_reduce(tensor, op=dist.ReduceOp.AVG, group=group), group)
                slowest = torch.tensor([elapsed], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=groups["gloo"])
                if rep > 0:
                    samples[name].append(slowest.item())
                sent[name] = (2 * (world - 1) * numel * 4 // world if name in GLOO
                              else gradzip.stats(group)["bytes_sent"])
        medians = {name: statistics.median(s) for name, s in samples.items()}
        for name in groups:
            spec = name.removesuffix(" @mpi").removesuffix(" unchecked")
            exchange = "dense" if name in DENSE else gradzip.exchange_plan(spec, numel, world)["choice"]
            memory = 0 if name in DENSE else memory_bytes(spec, numel, world, exchange, sent[name])
            link_time = sent[name] * 8 / link if link else 0.0
            memory_time = memory / bandwidth
            rows.append({"method": name, "numel": numel, "median_s": medians[name], "bytes_sent": sent[name],
                         "exchange": exchange, "floor_s": link_time + memory_time,
                         "overlapped_floor_s": max(link_time, memory_time), "memory_bytes": memory,
                         "copy_bandwidth": bandwidth, "link_rate_bits": link,
                         "speedup_over_gloo": medians["gloo"] / medians[name],
                         "fewer_bytes_than_gloo": sent["gloo"] / max(sent[name], 1)})

    if rank == 0:
        print(f"all_reduce (AVG) of a {', '.join(f'{n / 1e6:g}M' for n in args.numel)} fp32 gradient, {world} ranks, "
              f"{network}; median of {args.repetitions} (slowest rank per call); {platform.node()}, "
              f"{os.cpu_count()} cores; copy bandwidth per rank with all copying "
              f"{rows[0]['copy_bandwidth'] / 1e9:.2f} GB/s; link {f'{link / 1e9:g} Gbit/s' if link else 'none'}")
        header = f"{'elements':>9} | {'method':<20} | {'exchange':<8} | {'time':>10} | {'floor':>10} | " \
                 f"{'time/floor':>10} | {'overlapped':>10} | {'time/overl.':>11} | {'sent per rank':>14} | " \
                 f"{'speedup':>8} | {'fewer bytes':>11}"
        print(header)
        print("-" * len(header))
        for row in rows:
            ratio = row["median_s"] / row["floor_s"] if row["floor_s"] > 0 else float("nan")
            overlapped = row["median_s"] / row["overlapped_floor_s"] if row["overlapped_floor_s"] > 0 else float("nan")
            print(f"{row['numel'] / 1e6:>8g}M | {row['method']:<20} | {row['exchange']:<8} | "
                  f"{row['median_s'] * 1e3:>7.1f} ms | {row['floor_s'] * 1e3:>7.1f} ms | {ratio:>10.2f} | "
                  f"{row['overlapped_floor_s'] * 1e3:>7.1f} ms | {overlapped:>11.2f} | "
                  f"{row['bytes_sent'] / 1e6:>11.2f} MB | {row['speedup_over_gloo']:>7.2f}x | "
                  f"{row['fewer_bytes_than_gloo']:>10.1f}x")
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"world_size": world, "network": network, "host": platform.node(),
                                   "cores": os.cpu_count(), "torch": torch.__version__,
                                   "repetitions": args.repetitions, "rows": rows}, indent=2))
        print(f"wrote {out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
