"""Every collective on a gradzip process group gives, bitwise, what Gloo gives.

Each rank runs the same collective twice, on the gradzip default group and on a Gloo
group, from identical random inputs, and compares every tensor it ends with, byte for
byte. Where Gloo refuses a call, gradzip must refuse it too.
"""
import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64]
SIZES = [0, 1, 7, 1023]
LARGE = 4 * 1024 * 1024
LARGE_DTYPES = [torch.float32, torch.bfloat16]


def random_tensor(numel, dtype, seed, low=-3, high=4):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=g, dtype=torch.float32).to(dtype)
    return torch.randint(low, high, (numel,), generator=g, dtype=dtype)


def bitwise_equal(a, b):
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(bitwise_equal, a, b))
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def cases(rank, world):
    """(name, fn(group, seed) -> tensors the rank ends with, dtypes, sizes)."""
    def t(n, dtype, seed, **kw):
        return random_tensor(n, dtype, seed * 131 + rank, **kw)

    def all_reduce(op):
        def run(group, n, dtype, seed):
            x = t(n, dtype, seed, low=-2, high=3)
            dist.all_reduce(x, op=op, group=group)
            return [x]
        return run

    def all_reduce_noncontiguous(group, n, dtype, seed):
        base = t(2 * n, dtype, seed).view(n, 2)
        dist.all_reduce(base[:, 1], group=group)  # a strided view: written through to base
        return [base]

    def all_reduce_async(group, n, dtype, seed):
        x = t(n, dtype, seed)
        work = dist.all_reduce(x, group=group, async_op=True)
        value = work.get_future().wait()
        work.wait()
        assert work.is_completed() and isinstance(value, list), type(value)
        return [x] + value

    def all_reduce_coalesced(group, n, dtype, seed):
        xs = [t(n, dtype, seed), t(n + 3, dtype, seed + 1)]
        dist.all_reduce_coalesced(xs, group=group)
        return xs

    def broadcast(group, n, dtype, seed):
        x = t(n, dtype, seed)
        dist.broadcast(x, src=world - 1, group=group)
        return [x]

    def broadcast_noncontiguous(group, n, dtype, seed):
        base = t(3 * n, dtype, seed).view(n, 3)
        dist.broadcast(base[:, 2], src=0, group=group)
        return [base]

    def reduce(op):
        def run(group, n, dtype, seed):
            x = t(n, dtype, seed)
            dist.reduce(x, dst=world // 2, op=op, group=group)
            return [x]
        return run

    def all_gather(group, n, dtype, seed):
        out = [torch.zeros(n, dtype=dtype) for _ in range(world)]
        dist.all_gather(out, t(n, dtype, seed), group=group)
        return out

    def all_gather_async(group, n, dtype, seed):
        out = [torch.zeros(n, dtype=dtype) for _ in range(world)]
        work = dist.all_gather(out, t(n, dtype, seed), group=group, async_op=True)
        value = work.get_future().wait()
        assert isinstance(value, list), type(value)
        return out + [v for item in value for v in (item if isinstance(item, list) else [item])]

    def all_gather_into_tensor(group, n, dtype, seed):
        out = torch.zeros(n * world, dtype=dtype)
        dist.all_gather_into_tensor(out, t(n, dtype, seed), group=group)
        return [out]

    def all_gather_into_tensor_coalesced(group, n, dtype, seed):
        outs = [torch.zeros(n * world, dtype=dtype), torch.zeros((n + 1) * world, dtype=dtype)]
        ins = [t(n, dtype, seed), t(n + 1, dtype, seed + 1)]
        with dist._coalescing_manager(group=group):
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i, group=group)
        return outs

    def gather(group, n, dtype, seed):
        root = 1 % world
        out = [torch.zeros(n, dtype=dtype) for _ in range(world)] if rank == root else None
        dist.gather(t(n, dtype, seed), gather_list=out, dst=root, group=group)
        return out or []

    def gather_single(group, n, dtype, seed):
        """dist.gather_single (torch 2.14), which Gloo lacks: on the Gloo group the list
        gather, concatenated, is the reference."""
        root = (world - 1) // 2
        out = torch.zeros(n * world, dtype=dtype) if rank == root else None
        if dist.get_backend(group) == "gloo":
            parts = [torch.zeros(n, dtype=dtype) for _ in range(world)] if rank == root else None
            dist.gather(t(n, dtype, seed), gather_list=parts, dst=root, group=group)
            return [torch.cat(parts)] if rank == root else []
        dist.gather_single(t(n, dtype, seed), out, dst=root, group=group)
        return [out] if rank == root else []

    def all_gather_single(group, n, dtype, seed):
        out = torch.zeros(n * world, dtype=dtype)
        dist.all_gather_single(out, t(n, dtype, seed), group=group)
        return [out]

    def reduce_scatter_single(group, n, dtype, seed):
        out = torch.zeros(n, dtype=dtype)
        dist.reduce_scatter_single(out, t(n * world, dtype, seed), group=group)
        return [out]

    def scatter(group, n, dtype, seed):
        out = torch.zeros(n, dtype=dtype)
        parts = [t(n, dtype, seed + r) for r in range(world)] if rank == 0 else None
        dist.scatter(out, scatter_list=parts, src=0, group=group)
        return [out]

    def reduce_scatter(group, n, dtype, seed):
        out = torch.zeros(n, dtype=dtype)
        dist.reduce_scatter(out, [t(n, dtype, seed + r) for r in range(world)], group=group)
        return [out]

    def reduce_scatter_tensor(group, n, dtype, seed):
        out = torch.zeros(n, dtype=dtype)
        dist.reduce_scatter_tensor(out, t(n * world, dtype, seed), group=group)
        return [out]

    def all_to_all(group, n, dtype, seed):
        outs = [torch.zeros(n, dtype=dtype) for r in range(world)]  # Gloo wants equal parts
        dist.all_to_all(outs, [t(n, dtype, seed + r) for r in range(world)], group=group)
        return outs

    def all_to_all_single(group, n, dtype, seed):
        out = torch.zeros(n * world, dtype=dtype)
        dist.all_to_all_single(out, t(n * world, dtype, seed), group=group)
        return [out]

    def all_to_all_single_splits(group, n, dtype, seed):
        send = [(rank + r) % 3 + n for r in range(world)]  # rows to each rank
        recv = [(r + rank) % 3 + n for r in range(world)]
        x = t(sum(send) * 2, dtype, seed).view(-1, 2)
        out = torch.zeros(sum(recv), 2, dtype=dtype)
        dist.all_to_all_single(out, x, recv, send, group=group)
        return [out]

    def send_recv(group, n, dtype, seed):
        if world == 1:
            return []
        out = torch.zeros(n, dtype=dtype)
        right, left = (rank + 1) % world, (rank - 1) % world
        if rank % 2 == 0:
            dist.send(t(n, dtype, seed), dst=right, group=group)
            dist.recv(out, src=left, group=group)
        else:
            dist.recv(out, src=left, group=group)
            dist.send(t(n, dtype, seed), dst=right, group=group)
        return [out]

    def recv_any_source(group, n, dtype, seed):
        if world == 1 or n == 0:  # Gloo matches an empty any-source recv to the next message: skip
            return []
        out = torch.zeros(n, dtype=dtype)
        if rank == 0:
            sources = sorted(dist.recv(out, group=group) for _ in range(world - 1))
            assert sources == list(range(1, world)), sources
        else:
            dist.send(torch.full((n,), rank, dtype=dtype), dst=0, group=group)
        return [out] if rank != 0 else []

    def barrier(group, n, dtype, seed):
        dist.barrier(group=group)
        return []

    R = dist.ReduceOp
    return [
        ("all_reduce_sum", all_reduce(R.SUM), FLOATS + INTS),
        ("all_reduce_avg", all_reduce(R.AVG), FLOATS),
        ("all_reduce_product", all_reduce(R.PRODUCT), FLOATS + INTS),
        ("all_reduce_min", all_reduce(R.MIN), FLOATS + INTS),
        ("all_reduce_max", all_reduce(R.MAX), FLOATS + INTS),
        ("all_reduce_band", all_reduce(R.BAND), INTS),
        ("all_reduce_bor", all_reduce(R.BOR), INTS),
        ("all_reduce_bxor", all_reduce(R.BXOR), INTS),
        ("all_reduce_noncontiguous", all_reduce_noncontiguous, FLOATS + INTS),
        ("all_reduce_async", all_reduce_async, FLOATS + INTS),
        ("all_reduce_coalesced", all_reduce_coalesced, FLOATS + INTS),
        ("broadcast", broadcast, FLOATS + INTS),
        ("broadcast_noncontiguous", broadcast_noncontiguous, FLOATS + INTS),
        ("reduce_sum", reduce(R.SUM), FLOATS + INTS),
        ("reduce_max", reduce(R.MAX), FLOATS + INTS),
        ("all_gather", all_gather, FLOATS + INTS),
        ("all_gather_async", all_gather_async, FLOATS + INTS),
        ("all_gather_into_tensor", all_gather_into_tensor, FLOATS + INTS),
        ("all_gather_into_tensor_coalesced", all_gather_into_tensor_coalesced, FLOATS + INTS),
        ("gather", gather, FLOATS + INTS),
        *([("gather_single", gather_single, FLOATS + INTS)] if hasattr(dist, "gather_single") else []),  # torch 2.14
        ("all_gather_single", all_gather_single, FLOATS + INTS),
        ("reduce_scatter_single", reduce_scatter_single, FLOATS + INTS),
        ("scatter", scatter, FLOATS + INTS),
        ("reduce_scatter", reduce_scatter, FLOATS + INTS),
        ("reduce_scatter_tensor", reduce_scatter_tensor, FLOATS + INTS),
        ("all_to_all", all_to_all, FLOATS + INTS),
        ("all_to_all_single", all_to_all_single, FLOATS + INTS),
        ("all_to_all_single_splits", all_to_all_single_splits, FLOATS + INTS),
        ("send_recv", send_recv, FLOATS + INTS),
        ("recv_any_source", recv_any_source, [torch.float32, torch.int64]),
        ("barrier", barrier, [torch.float32]),
    ]


LARGE_CASES = {"all_reduce_sum", "all_reduce_async", "broadcast", "all_gather_into_tensor",
               "reduce_scatter_tensor", "all_to_all_single", "send_recv"}


def compare_every_collective(rank, world):
    import gradzip
    gradzip.init_process_group("gradzip")
    gloo = dist.new_group(backend="gloo")
    gradzip_group = dist.group.WORLD
    checked, mismatches, both_refused = 0, [], []
    for seed, (name, fn, dtypes) in enumerate(cases(rank, world)):
        for dtype in dtypes:
            sizes = SIZES + ([LARGE] if name in LARGE_CASES and dtype in LARGE_DTYPES else [])
            for n in sizes:
                label = f"{name} {dtype} n={n}"
                outcome = {}
                for group_name, group in (("gloo", gloo), ("gradzip", gradzip_group)):
                    try:
                        outcome[group_name] = fn(group, n, dtype, seed * 7919 + n)
                    except Exception as error:  # compared below: both must refuse
                        outcome[group_name] = error
                gl, gz = outcome["gloo"], outcome["gradzip"]
                if isinstance(gl, Exception) or isinstance(gz, Exception):
                    if not (isinstance(gl, Exception) and isinstance(gz, Exception)):
                        mismatches.append(f"{label}: gloo gave {gl!r:.200}, gradzip gave {gz!r:.200}")
                    else:
                        both_refused.append(f"{label}: {gl!r:.300}")
                elif not bitwise_equal(gl, gz):
                    mismatches.append(f"{label}: results differ")
                checked += 1
    return checked, mismatches, both_refused


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.torch_range), 3, 4])
def test_every_collective_matches_gloo_bitwise(world):
    results = run_ranks(compare_every_collective, world, timeout=600)
    for rank, (checked, mismatches, both_refused) in enumerate(results):
        assert checked > 500, checked
        assert not mismatches, f"rank {rank}:\n" + "\n".join(mismatches)
        # Gloo supports every case listed here at these sizes; a refusal is a test bug.
        assert not both_refused, f"rank {rank}: both refused:\n" + "\n".join(both_refused[:20])


def subgroup_matches_gloo(rank, world):
    import gradzip
    gradzip.init_process_group("gradzip")
    members = list(range(world - 1))  # every rank but the last
    gradzip_sub = dist.new_group(members)  # the default backend: gradzip
    gloo_sub = dist.new_group(members, backend="gloo")
    if rank not in members:
        return None
    assert dist.get_backend(gradzip_sub) == "gradzip"
    results = []
    for group in (gloo_sub, gradzip_sub):
        x = random_tensor(1023, torch.float32, rank)
        dist.all_reduce(x, group=group)
        out = [torch.zeros(5, dtype=torch.int64) for _ in members]
        dist.all_gather(out, torch.full((5,), rank, dtype=torch.int64), group=group)
        y = random_tensor(17, torch.float64, rank)
        dist.broadcast(y, src=members[-1], group=group)
        results.append([x, y] + out)
    assert bitwise_equal(results[0], results[1])
    assert dist.get_world_size(gradzip_sub) == len(members)
    return True


def test_subgroup_matches_gloo():
    assert run_ranks(subgroup_matches_gloo, 3) == [True, True, None]


def count_bytes(rank, world):
    import gradzip
    gradzip.init_process_group("gradzip")
    gradzip.reset_stats()
    dist.all_reduce(torch.ones(1000))                       # 4000 bytes
    dist.all_reduce(torch.ones(1000, dtype=torch.float64))  # 8000 bytes
    dist.broadcast(torch.ones(10), src=0)                   # not an all_reduce: not counted
    first = gradzip.stats()
    gradzip.reset_stats()
    gloo = dist.new_group(backend="gloo")
    try:
        gradzip.stats(gloo)
        refused = None
    except ValueError as error:
        refused = str(error)
    return first, gradzip.stats(), refused


def test_stats_count_the_ring_bytes_of_each_all_reduce():
    world = 4
    for first, after_reset, refused in run_ranks(count_bytes, world):
        ring = 2 * (world - 1) / world
        assert first == {"calls": 2, "bytes_sent": ring * 12000, "bytes_received": ring * 12000,
                         "dense_bytes": ring * 8000}
        assert after_reset == {"calls": 0, "bytes_sent": 0, "bytes_received": 0, "dense_bytes": 0}
        assert "not 'gradzip'" in refused


def receives_in_flight(rank, world):
    """Several receives from one rank with one tag, outstanding at once, waited for in
    reverse: each gets its own message (the checked header and data stay paired)."""
    import gradzip

    gradzip.init_process_group("gradzip")  # validate on: checked send/recv
    messages = [torch.arange(5.0), torch.arange(3, dtype=torch.int64) + 10, torch.full((1 << 18,), 2.5)]
    if rank == 0:
        for w in [dist.isend(m, 1, tag=0) for m in messages]:
            w.wait()
        return None
    into = [torch.empty_like(m) for m in messages]
    works = [dist.irecv(t, 0, tag=0) for t in into]
    for w in reversed(works):
        w.wait()
    return [torch.equal(a, b) for a, b in zip(into, messages)]


def test_receives_in_flight_from_one_rank_with_one_tag_keep_their_messages():
    assert run_ranks(receives_in_flight, 2)[1] == [True, True, True]
