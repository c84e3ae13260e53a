"""all_reduce (or, with --op reduce_scatter, FSDP's reduce_scatter_tensor) across nodes:
the flat exchange against the hierarchical one, with Gloo dense as the baseline, on a
two-level network, and the cost model's predictions (all_reduce only).

    sudo benchmarks/netns.sh --ranks 4 --nodes 2 --rate 1gbit -- .venv/bin/python benchmarks/hierarchy.py
    GRADZIP_NODE_SIZE=2 torchrun --standalone --nproc-per-node 4 benchmarks/hierarchy.py --quick
    python benchmarks/hierarchy.py --predict 64x8 --rate 100gbit     # the model alone, no ranks

For each spec, two gradzip groups over the same ranks, `hierarchy=off` (flat) and
`hierarchy=auto` (hierarchical), and a Gloo group. A call's time is the slowest rank's
after a barrier, the median over the repetitions, the methods taken in turn. Bytes
across nodes per call: what the nodes' shaped interfaces (eth0 in netns.sh's
namespaces) sent, read from /sys/class/net/eth0/statistics/tx_bytes by each node's
local rank 0, summed over the nodes; without such an interface, the model's count.

The cost model (node_egress_bytes, predict_seconds), its assumptions named:
- every node has one full-duplex link of `rate` to the others; inside a node the links
  cost nothing but memory traffic;
- Gloo's all-reduce and all-gather are rings over the ranks in rank order (nodes hold
  consecutive ranks), so a node's link carries one rank's ring traffic; its all-to-all
  sends each rank's chunk straight to every other rank;
- the L lanes of a hierarchical exchange share their node's link;
- the codec's time is its encode and decodes (one per payload the rank receives)
  measured here with every rank encoding and decoding at once, the slowest rank's: the
  ranks share the cores and the memory, as they do in the exchange (4 ranks on 2 cores
  each get half a core);
- memory traffic outside the codec (memory_bytes) goes at the copy bandwidth a rank gets
  while every rank copies: with error feedback the finiteness check reads x; the
  hierarchical exchange's node stages write x (plus the residual, then cleared) as the
  rank's row, sum its shard of the L rows and copy the result out;
- nothing overlaps but two-phase's rounds: time = wire + codec.
"""
import argparse
import json
import os
import re
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

import gradzip
from gradzip import tensor_codec
from gradzip._extension import _C

SPECS = ["fp16", "qsgd:bits=4", "stc:density=0.01", "sign", "topk:density=0.01"]
DEFAULT_NUMEL = 25_000_000


def rate_bits(text):
    """bits/s from a rate such as 1gbit, 100mbit, or None."""
    match = re.search(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", text or "")
    if not match:
        return None
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


def with_key(spec, key):
    return f"{spec},{key}" if ":" in spec else f"{spec}:{key}"


def node_egress_bytes(spec, numel, nodes, per_node):
    """Bytes one node's link sends for one all-reduce, by method (the model above)."""
    ranks = nodes * per_node
    flat = gradzip.exchange_plan(spec, numel, ranks)
    if flat["choice"] == "twophase":
        step = flat["twophase"] / (2 * (ranks - 1))  # one slot of a chunk
        flat_bytes = per_node * (ranks - per_node) * step + (ranks - 1) * step
    else:
        flat_bytes = flat[flat["choice"]]
    shard = -(-numel // per_node)
    lane = gradzip.exchange_plan(spec, shard, nodes, link_shared_by=per_node)
    return {"gloo": flat["dense"], "flat": flat_bytes, "hierarchical": per_node * lane[lane["choice"]],
            "flat_scheme": flat["choice"], "lane_scheme": lane["choice"]}


def codec_seconds(spec, numel, repetitions=3):
    """(encode, one decode-add) of `numel` elements on this rank, into kept buffers as the
    exchange does, median of a few."""
    x, total = torch.randn(numel), torch.zeros(numel)
    out = torch.empty(tensor_codec.max_payload_bytes(spec, numel), dtype=torch.uint8)
    state = tensor_codec.State()
    encodes, decodes = [], []
    for _ in range(repetitions):
        start = time.perf_counter()
        payload = tensor_codec.encode(x, spec, state, out=out)
        encodes.append(time.perf_counter() - start)
        start = time.perf_counter()
        _C.decode_add(payload, total)
        decodes.append(time.perf_counter() - start)
    return statistics.median(encodes), statistics.median(decodes)


def exchange_seconds(plan, wire, encode, decode, ranks):
    """One compressed exchange: one-shot encodes, sends, then decodes the P payloads;
    two-phase encodes the P chunks and its owned chunk again and decodes twice, in
    rounds that overlap the codec with the wire."""
    if plan["choice"] == "twophase":
        codec = encode * (1 + 1 / ranks) + 2 * decode
        return max(wire, codec) + min(wire, codec) / plan["rounds"]
    return wire + encode + ranks * decode


def memory_bytes(spec, numel, per_node, hierarchical):
    """Bytes one rank reads and writes outside the codec in an all-reduce of n fp32: with
    error feedback the finiteness check (x read); hierarchical, the node's shared-memory
    stages: the row (x read, written; with error feedback the residual read and cleared),
    the shard's sum of the L rows (one copied, L - 1 added), the result copied out."""
    ef = gradzip.Spec(spec).uses_error_feedback
    x = 4 * numel
    check = x if ef else 0
    if not hierarchical:
        return check
    row = 4 * x if ef else 2 * x
    shard = (3 * per_node - 1) * x / per_node
    return check + row + shard + 2 * x


def predict_seconds(spec, numel, nodes, per_node, rate, codec, copy_bandwidth):
    """Seconds per all-reduce by method (the model above); codec(spec, n): (encode, one
    decode) seconds; copy_bandwidth: a rank's bytes read and written per second."""
    egress = node_egress_bytes(spec, numel, nodes, per_node)
    ranks = nodes * per_node
    shard = -(-numel // per_node)
    flat = exchange_seconds(gradzip.exchange_plan(spec, numel, ranks), 8 * egress["flat"] / rate,
                            *codec(spec, numel), ranks)
    lane_plan = gradzip.exchange_plan(spec, shard, nodes, link_shared_by=per_node)
    lane = exchange_seconds(lane_plan, 8 * egress["hierarchical"] / rate, *codec(spec, shard), nodes)
    memory = {h: memory_bytes(spec, numel, per_node, h) / copy_bandwidth for h in (False, True)}
    return {"gloo": 8 * egress["gloo"] / rate, "flat": memory[False] + flat, "hierarchical": memory[True] + lane}


def codec_seconds_together(sizes, group):
    """codec_seconds of each (spec, n) in `sizes`, every rank of `group` measuring at once;
    the slowest rank's (encode, decode)."""
    mine = {}
    for spec, numel in sizes:
        dist.barrier(group=group)
        mine[spec, numel] = codec_seconds(spec, numel)
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    return {key: tuple(max(g[key][i] for g in gathered) for i in range(2)) for key in mine}


def copy_bandwidth(numel, seconds=1.0):
    """Bytes read and written per second by one thread copying for about `seconds` (long
    enough for the ranks' copies to overlap when they all run at once)."""
    x, y = torch.randn(numel), torch.empty(numel)
    y.copy_(x)  # the pages, touched
    copies, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        y.copy_(x)
        copies += 1
    return 8 * numel * copies / (time.perf_counter() - start)


def tx_bytes():
    """What this node's shaped link has sent, inside netns.sh's namespaces; else None."""
    path = Path("/sys/class/net/eth0/statistics/tx_bytes")
    return int(path.read_text()) if "netns" in os.environ.get("GRADZIP_NETWORK", "") and path.exists() else None


def time_call(fn, group):
    dist.barrier(group=group)
    start = time.perf_counter()
    fn()
    dist.barrier(group=group)
    return time.perf_counter() - start


def run(args):
    torch.set_num_threads(1)  # the ranks share the cores; the model's codec times are one thread's
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ.get("GRADZIP_NODE_SIZE") or os.environ.get("LOCAL_WORLD_SIZE") or world)
    nodes = world // per_node
    if nodes < 2 or per_node < 2:
        raise SystemExit(f"hierarchy.py: {nodes} nodes of {per_node} ranks: needs several of each "
                         "(netns.sh --nodes, or GRADZIP_NODE_SIZE)")
    gloo = dist.new_group(backend="gloo")
    rate = rate_bits(args.rate or os.environ.get("GRADZIP_NETWORK"))
    scatter = args.op == "reduce_scatter"
    rows = []
    for numel in args.numel:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        out = torch.empty(numel // world)  # reduce_scatter: the input is `world` such chunks
        if scatter:
            x = x[:out.numel() * world]
        for spec in args.specs:
            spec = with_key(spec, "reduce_scatter=compressed") if scatter else spec
            groups = {"flat": dist.new_group(backend="gradzip",
                                             pg_options=gradzip.Options(aggregation=with_key(spec, "hierarchy=off"))),
                      "hierarchical": dist.new_group(backend="gradzip",
                                                     pg_options=gradzip.Options(aggregation=spec))}
            levels = groups["hierarchical"]._get_backend(torch.device("cpu")).node_levels("cpu")
            assert levels is not None, "the hierarchical group has no node levels"
            methods = {"gloo": gloo, **groups}
            times = {m: [] for m in methods}
            sent = {m: 0 for m in methods}
            for repetition in range(args.repetitions + 1):  # the first warms up
                for method, group in methods.items():
                    y = x.clone()
                    before = tx_bytes()
                    seconds = time_call(lambda: dist.reduce_scatter_tensor(out, y, group=group) if scatter
                                        else dist.all_reduce(y, group=group), group)
                    after = tx_bytes()
                    if repetition > 0:
                        times[method].append(seconds)
                        if before is not None:
                            sent[method] += after - before
            gathered = [None] * world
            dist.all_gather_object(gathered, ({m: statistics.median(t) for m, t in times.items()}, sent), group=gloo)
            if rank == 0:
                slowest = {m: max(g[0][m] for g in gathered) for m in methods}
                local_zero = range(0, world, per_node)  # each node's local rank 0 counted its link
                link = {m: sum(gathered[r][1][m] for r in local_zero) / args.repetitions / nodes for m in methods}
                rows.append({"spec": spec, "numel": numel, "op": args.op, "seconds": slowest,
                             "link_bytes_per_node": link if tx_bytes() is not None else None,
                             "model_bytes_per_node": None if scatter else node_egress_bytes(spec, numel, nodes, per_node)})
            for group in groups.values():
                dist.destroy_process_group(group)
    # The copy bandwidth a rank gets while every rank copies, then rank 0's alone; the
    # codec's times with every rank encoding and decoding at once.
    dist.barrier(group=gloo)
    together = copy_bandwidth(min(args.numel))
    dist.barrier(group=gloo)
    bandwidth = copy_bandwidth(min(args.numel)) if rank == 0 else None
    codec_times = {} if scatter or not rate else codec_seconds_together(
        [(spec, n) for numel in args.numel for spec in args.specs for n in (numel, -(-numel // per_node))], gloo)
    if rank == 0:
        print(f"hierarchy.py: {args.op}, {nodes} nodes x {per_node} ranks, network: {os.environ.get('GRADZIP_NETWORK', 'loopback')}; "
              f"copy {bandwidth / 1e9:.1f} GB/s alone, {together / 1e9:.1f} GB/s per rank together")
        print(f"{'spec':22s} {'n':>10s} {'gloo s':>8s} {'flat s':>8s} {'hier s':>8s} {'hier/flat':>9s} "
              f"{'x gloo':>7s} {'link MB flat':>12s} {'link MB hier':>12s} {'model flat':>10s} {'model hier':>10s}")
        for row in rows:
            s = row["seconds"]
            link = row["link_bytes_per_node"] or {}
            model = row["model_bytes_per_node"] or {"flat": float("nan"), "hierarchical": float("nan")}
            if rate and not scatter:  # the model is the all-reduce's
                row["predicted_seconds"] = predict_seconds(row["spec"], row["numel"], nodes, per_node, rate,
                                                           lambda spec, n: codec_times[spec, n], together)
                row["codec_seconds"] = {n: codec_times[row["spec"], n]
                                        for n in (row["numel"], -(-row["numel"] // per_node))}
            print(f"{row['spec']:22s} {row['numel']:10d} {s['gloo']:8.3f} {s['flat']:8.3f} {s['hierarchical']:8.3f} "
                  f"{s['flat'] / s['hierarchical']:9.2f} {s['gloo'] / s['hierarchical']:7.2f} "
                  f"{link.get('flat', float('nan')) / 1e6:12.2f} {link.get('hierarchical', float('nan')) / 1e6:12.2f} "
                  f"{model['flat'] / 1e6:10.2f} {model['hierarchical'] / 1e6:10.2f}")
            if rate and not scatter:
                p = row["predicted_seconds"]
                print(f"{'  predicted':22s} {'':10s} {p['gloo']:8.3f} {p['flat']:8.3f} {p['hierarchical']:8.3f}")
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"nodes": nodes, "per_node": per_node,
                                               "network": os.environ.get("GRADZIP_NETWORK", "loopback"),
                                               "rows": rows}, indent=1))
        print(f"wrote {args.json}")
    dist.destroy_process_group()


def predict_only(args):
    """The model's wire times at a scale this machine cannot run (the codec's time there is
    the GPU's, not this machine's)."""
    nodes, per_node = (int(v) for v in args.predict.split("x"))
    rate = rate_bits(args.rate)
    if rate is None:
        raise SystemExit("hierarchy.py: --predict needs --rate (e.g. 100gbit)")
    print(f"predicted all_reduce of {args.numel[0]} fp32 over {nodes} nodes x {per_node} ranks, {args.rate} "
          f"between nodes, links inside a node free (wire time only)")
    print(f"{'spec':22s} {'gloo ms':>9s} {'flat ms':>9s} {'hier ms':>9s} {'flat/hier':>9s} {'gloo/hier':>9s}")
    rows = []
    for spec in ["allreduce"] + args.specs:
        egress = node_egress_bytes(spec if spec != "allreduce" else "fp16", args.numel[0], nodes, per_node)
        gloo = 8 * egress["gloo"] / rate
        if spec == "allreduce":
            flat = hier = gloo
        else:
            flat, hier = 8 * egress["flat"] / rate, 8 * egress["hierarchical"] / rate
        rows.append({"spec": spec, "gloo": gloo, "flat": flat, "hierarchical": hier})
        print(f"{spec:22s} {1e3 * gloo:9.2f} {1e3 * flat:9.2f} {1e3 * hier:9.2f} {flat / hier:9.2f} {gloo / hier:9.2f}")
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--numel", type=lambda s: [int(float(v)) for v in s.split(",")], default=[DEFAULT_NUMEL])
    parser.add_argument("--specs", type=lambda s: s.split(";"), default=SPECS)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--op", choices=["all_reduce", "reduce_scatter"], default="all_reduce",
                        help="the collective: all_reduce, or FSDP's reduce_scatter_tensor (reduce_scatter=compressed; "
                             "no model)")
    parser.add_argument("--quick", action="store_true", help="1M elements, 1 repetition")
    parser.add_argument("--rate", default=None, help="the link rate between nodes (default: netns.sh's)")
    parser.add_argument("--predict", default=None, help="NxL: print the model's wire times for N nodes of L ranks")
    parser.add_argument("--json", default="benchmarks/results/hierarchy.json")
    args = parser.parse_args()
    if args.quick:
        args.numel, args.repetitions = [1_000_000], 1
    if args.predict:
        predict_only(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
