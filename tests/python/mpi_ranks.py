"""Scenarios that test_mpi.py runs under mpirun: `python mpi_ranks.py SCENARIO`.

Each rank prints "rank R ok" when the scenario passes on it and raises otherwise.

conformance   every collective over the MPI transport against the same call over Gloo,
              on the same inputs, every dtype Gloo takes; bitwise where Gloo's result
              does not depend on its summation order (two ranks, or exact sums),
              otherwise against the rank-ordered float reference the transport promises
ddp           DDP over gradzip-on-MPI bitwise equal to DDP over Gloo (two ranks)
compressed    compressed aggregations (both exchanges), gossip and CHOCO over MPI: bitwise
              equal to the same over Gloo
hierarchical  the hierarchical exchange over MPI sub-communicators: Gloo's bits
staged        the host staging of GPU tensors (here CPU ones) over the MPI transport: the
              MPI transport's own bits, p2p included
no_store      gradzip.init_process_group() under mpirun with no MASTER_ADDR: MPI, no store
adopted       MPI initialized before gradzip (as mpi4py does): adopted, and left for its
              owner to finalize
funneled      MPI initialized with MPI_THREAD_FUNNELED: a clear refusal
errors        bad calls give errors that name the problem, and the group stays usable
stopped_rank  rank 1 stops itself; the others get a timeout error naming the call
killed_rank   rank 1 kills itself; mpirun ends the job
"""
import os
import re
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import gradzip
import p2p_patterns

REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
              "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG, "band": dist.ReduceOp.BAND,
              "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8,
          torch.uint8, torch.bool]


def init(transport="mpi", **kwargs):
    """The world as a gradzip group over `transport`, with a real store so Gloo groups can be made."""
    gradzip.init_process_group("gradzip", init_method="env://",
                               pg_options=gradzip.Options(transport=transport), **kwargs)
    return dist.get_rank(), dist.get_world_size()


def same_bits(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    if a.dtype == torch.bool:
        assert torch.equal(a, b), f"{what}: {a} vs {b}"
        return
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    assert torch.equal(a.contiguous().view(width), b.contiguous().view(width)), f"{what}: {a} vs {b}"


def sample(rank, dtype, n, exact, seed=0):
    """Inputs of `dtype`: small integers when `exact` (every sum order gives the same bits)."""
    g = torch.Generator().manual_seed(1000 * seed + 17 * rank + n)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) < 0.5
    if dtype.is_floating_point:
        if exact:
            return torch.randint(-8, 9, (n,), generator=g).to(dtype)
        return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    low, high = (0, 4) if dtype == torch.uint8 else (-3, 4)
    return torch.randint(low, high, (n,), generator=g).to(dtype)


def valid_ops(dtype):
    ops = ["sum", "product", "min", "max"]
    if dtype.is_floating_point:
        ops.append("avg")
    else:
        ops += ["band", "bor", "bxor"]
    if dtype == torch.bool:
        ops = ["sum", "min", "max", "band", "bor", "bxor"]  # Gloo has no bool product
    return ops


def rank_ordered(parts, op):
    """The transport's promise: parts[0] op parts[1] op ..., in the dtype, rank order."""
    out = parts[0].clone()
    for p in parts[1:]:
        out = {"sum": torch.add, "avg": torch.add, "product": torch.mul, "min": torch.minimum,
               "max": torch.maximum}[op](out, p).to(out.dtype)
    return out / len(parts) if op == "avg" else out


def check_all_reduce(rank, size, gloo):
    exact = size > 2
    for dtype in DTYPES:
        for op in valid_ops(dtype):
            for n in (0, 1, size - 1, 1000, 4099):
                x = sample(rank, dtype, n, exact)
                if op == "product" and dtype.is_floating_point:
                    x = x.clamp(-2, 2)
                ours, theirs = x.clone(), x.clone()
                dist.all_reduce(ours, op=REDUCE_OPS[op])
                dist.all_reduce(theirs, op=REDUCE_OPS[op], group=gloo)
                same_bits(ours, theirs, f"all_reduce {op} {dtype} n={n}")
    # Sums of arbitrary floats on more ranks: Gloo's ring adds in another order; the
    # transport adds in rank order, so it equals that reference bit for bit.
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = sample(rank, dtype, 3001, exact=False, seed=1)
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x, group=gloo)
        for op in ("sum", "avg"):
            ours = x.clone()
            dist.all_reduce(ours, op=REDUCE_OPS[op])
            same_bits(ours, rank_ordered(parts, op), f"all_reduce {op} {dtype}, rank-ordered reference")
            theirs = x.clone()
            dist.all_reduce(theirs, op=REDUCE_OPS[op], group=gloo)
            tolerance = 8 * size * torch.finfo(dtype).eps  # a few roundings, in another order
            torch.testing.assert_close(ours.double(), theirs.double(), rtol=tolerance, atol=tolerance)
    # Non-contiguous, and 0-dimensional.
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4).mul(rank + 1).t()
    ours, theirs = m.clone().t().t(), m.clone()
    assert not ours.is_contiguous()
    dist.all_reduce(ours)
    dist.all_reduce(theirs, group=gloo)
    same_bits(ours, theirs, "all_reduce of a transposed tensor")
    s = torch.tensor(float(rank))
    dist.all_reduce(s)
    assert s.item() == sum(range(size))


def check_other_collectives(rank, size, gloo):
    exact = size > 2
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool):
        x = sample(rank, dtype, 37, exact)
        both = []
        for group in (None, gloo):
            out = {}
            t = x.clone()
            dist.broadcast(t, src=size - 1, group=group)
            out["broadcast"] = t
            gathered = [torch.empty_like(x) for _ in range(size)]
            dist.all_gather(gathered, x, group=group)
            out["all_gather"] = torch.stack(gathered)
            flat = torch.empty(size * 37, dtype=dtype)
            dist.all_gather_into_tensor(flat, x, group=group)
            out["all_gather_into_tensor"] = flat
            if dtype != torch.bool:  # Gloo reduces no bool tensors here
                t = x.clone()
                dist.reduce(t, dst=1, group=group)
                out["reduce"] = t if rank == 1 else torch.zeros(0, dtype=dtype)
                big = sample(rank, dtype, size * 5, exact, seed=2)
                piece = torch.empty(5, dtype=dtype)
                dist.reduce_scatter_tensor(piece, big, group=group)
                out["reduce_scatter_tensor"] = piece
                piece = torch.empty(5, dtype=dtype)
                dist.reduce_scatter(piece, list(big.chunk(size)), group=group)
                out["reduce_scatter"] = piece
            into = [torch.empty_like(x) for _ in range(size)] if rank == 0 else None
            dist.gather(x, into, dst=0, group=group)
            out["gather"] = torch.stack(into) if rank == 0 else torch.zeros(0, dtype=dtype)
            t = torch.empty_like(x)
            dist.scatter(t, [x + i if dtype not in (torch.bool,) else x for i in range(size)] if rank == 2 % size
                         else None, src=2 % size, group=group)
            out["scatter"] = t
            # Uneven splits: rank r sends r + j + 1 rows to rank j.
            send = [rank + j + 1 for j in range(size)]
            receive = [j + rank + 1 for j in range(size)]
            rows = sample(rank, dtype, sum(send) * 2, exact, seed=3).reshape(-1, 2)
            got = torch.empty(sum(receive), 2, dtype=dtype)
            dist.all_to_all_single(got, rows, receive, send, group=group)
            out["all_to_all_single"] = got
            outs = [torch.empty(3, dtype=dtype) for _ in range(size)]
            dist.all_to_all(outs, [x[j:j + 3].clone() for j in range(size)], group=group)
            out["all_to_all"] = torch.stack(outs)
            both.append(out)
        for name in both[0]:
            same_bits(both[0][name], both[1][name], f"{name} {dtype}")
    # Coalesced all-gathers, as FSDP issues them.
    a, b = torch.full((3,), float(rank)), torch.arange(4, dtype=torch.float32) + rank
    outs_a, outs_b = torch.empty(3 * size), torch.empty(4 * size)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(outs_a, a)
        dist.all_gather_into_tensor(outs_b, b)
    cm.wait()
    assert torch.equal(outs_a, torch.arange(size).float().repeat_interleave(3))
    assert torch.equal(outs_b, torch.cat([torch.arange(4.0) + r for r in range(size)]))
    # Objects travel as byte tensors.
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "name": "x" * rank})
    assert objects == [{"rank": r, "name": "x" * r} for r in range(size)]
    box = [{"seed": 7}] if rank == 0 else [None]
    dist.broadcast_object_list(box, src=0)
    assert box == [{"seed": 7}]
    dist.barrier()


def check_point_to_point(rank, size, gloo):
    # Every pattern of p2p_patterns, posted and waited for in every order, as on Gloo.
    for name, make in p2p_patterns.PATTERNS.items():
        for n in (0, 1000, 1 << 18):
            for post in p2p_patterns.POST_ORDERS:
                for wait in p2p_patterns.WAIT_ORDERS:
                    what = f"{name}, {n} elements, posted {post}, waited {wait}"
                    got = [p2p_patterns.exchange(group, *make(rank, size, n), post, wait)
                           for group in (dist.group.WORLD, gloo)]
                    p2p_patterns.check(rank, make(rank, size, n)[1], got[0], what)
                    for ours, theirs in zip(*got):
                        same_bits(ours, theirs, what)
    peer_next, peer_prev = (rank + 1) % size, (rank - 1) % size
    # Both directions at once (each rank sends before it receives): posted without blocking.
    big = torch.full((1 << 20,), float(rank))
    got = torch.empty(1 << 20)
    sends = [dist.isend(big, peer_next, tag=5), dist.isend(torch.full((3,), rank + 0.5), peer_next, tag=9)]
    small = torch.empty(3)
    receives = [dist.irecv(small, peer_prev, tag=9), dist.irecv(got, peer_prev, tag=5)]
    for w in sends + receives:
        w.wait()
    assert torch.equal(got, torch.full((1 << 20,), float(peer_prev)))
    assert torch.equal(small, torch.full((3,), peer_prev + 0.5))
    # A non-contiguous receive, and a receive from any source.
    if rank == 0:
        into = torch.zeros(4, 3).t()
        work = dist.irecv(into)
        work.wait()
        assert torch.equal(into, torch.arange(12.0).reshape(3, 4))
        assert work._source_rank() == size - 1
    elif rank == size - 1:
        dist.send(torch.arange(12.0).reshape(3, 4), 0)
    # Receives from one rank with one tag, outstanding at once, waited for in reverse.
    messages = [torch.arange(5.0), torch.arange(3, dtype=torch.int64), torch.full((1 << 18,), 2.5)]
    if rank == 0:
        for w in [dist.isend(m, 1, tag=4) for m in messages]:
            w.wait()
    elif rank == 1:
        into = [torch.empty_like(m) for m in messages]
        for w in reversed([dist.irecv(t, 0, tag=4) for t in into]):
            w.wait()
        assert all(torch.equal(a, b) for a, b in zip(into, messages))
    # Futures complete on their own, without wait().
    value = torch.tensor([float(rank)])
    fut = dist.all_reduce(value, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    assert fut.wait().item() == 2 * sum(range(size))


def check_subgroup(rank, size):
    members = [0, size - 1]
    sub = dist.new_group(members, backend="gradzip", pg_options=gradzip.Options(transport="mpi"))
    if rank in members:
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=sub)
        assert t.item() == 1 + size
        dist.barrier(group=sub)
    dist.barrier()


def conformance():
    rank, size = init()
    assert type(gradzip._transport.transport_of(None, torch.device("cpu"))).__name__ == "MpiBackend"
    gloo = dist.new_group(backend="gloo")
    check_all_reduce(rank, size, gloo)
    check_other_collectives(rank, size, gloo)
    check_point_to_point(rank, size, gloo)
    check_subgroup(rank, size)
    dist.destroy_process_group()
    return rank


def train(group, seed, steps=6):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(steps):
        x, y = torch.randn(32, 20, generator=g), torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def ddp():
    rank, size = init()
    gloo = dist.new_group(backend="gloo")
    ours, theirs = train(None, seed=3), train(gloo, seed=3)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        same_bits(a, b, f"DDP parameter {i}")
    dist.destroy_process_group()
    return rank


def compressed():
    """The same aggregations over MPI and over Gloo give the same bits."""
    rank, size = init()
    specs = ["topk:density=0.05,exchange=oneshot", "topk:density=0.05,exchange=twophase",
             "stc:density=0.02,exchange=twophase", "sign", "qsgd:bits=4,exchange=twophase", "fp16"]
    for spec in specs:
        results = []
        for transport in ("mpi", "gloo"):
            group = dist.new_group(backend="gradzip", pg_options=gradzip.Options(aggregation=spec, transport=transport))
            out = []
            for step in range(3):
                x = sample(rank, torch.float32, 5000, exact=False, seed=step)
                dist.all_reduce(x, group=group)
                out.append(x)
            results.append(torch.stack(out))
        same_bits(results[0], results[1], f"{spec} over MPI and over Gloo")
    for spec in ("gossip:topology=ring", "choco:topology=ring,compress=topk,density=0.1,gamma=0.5"):
        models = []
        for transport in ("mpi", "gloo"):
            group = dist.new_group(backend="gradzip", pg_options=gradzip.Options(transport=transport))
            agg = gradzip.Aggregation(spec, group=group)
            x = sample(rank, torch.float32, 2000, exact=False, seed=9)
            for _ in range(3):
                agg(x)
            models.append(x)
        same_bits(models[0], models[1], f"{spec} over MPI and over Gloo")
    dist.destroy_process_group()
    return rank


def staged():
    """HostStagedBackend over the MPI transport (what carries a group's CUDA tensors under
    mpirun where its ranks share a GPU), on CPU tensors: the MPI transport's own results."""
    rank, size = init()
    transport = dist.group.WORLD._get_backend(torch.device("cpu")).transport("cpu")
    staged_transport = gradzip._C.HostStagedBackend(transport)
    for backend_name, backend in (("mpi", transport), ("staged", staged_transport)):
        x = sample(rank, torch.float32, 1001, exact=False)
        backend.allreduce([x]).wait()
        gathered = [torch.empty(7) for _ in range(size)]
        backend.allgather([gathered], [sample(rank, torch.float32, 7, exact=False, seed=1)]).wait()
        b = sample(rank, torch.float64, 33, exact=False, seed=2)
        backend.broadcast([b], dist.BroadcastOptions()).wait()
        received = torch.empty(size * 3)
        backend.alltoall_base(received, sample(rank, torch.float32, size * 3, exact=False, seed=3), [], [],
                              dist.AllToAllOptions()).wait()
        ring = torch.empty(5)
        works = [backend.recv([ring], (rank - 1) % size, 4),
                 backend.send([sample(rank, torch.float32, 5, exact=False, seed=4)], (rank + 1) % size, 4)]
        for work in reversed(works):
            work.wait()
        if backend_name == "mpi":
            want = (x, torch.cat(gathered), b, received, ring)
        else:
            for got, expected, what in zip((x, torch.cat(gathered), b, received, ring), want,
                                           ("all_reduce", "all_gather", "broadcast", "all_to_all", "ring p2p")):
                same_bits(got, expected, f"{what} staged over MPI")
    dist.destroy_process_group()
    return rank


def hierarchical():
    """GRADZIP_NODE_SIZE=2: the hierarchical exchange over MPI sub-communicators gives the
    bits it gives over Gloo groups, at the backend door and through gradzip.Aggregation."""
    rank, size = init()
    cpu = torch.device("cpu")
    for spec in ("fp16", "qsgd:bits=4", "stc:density=0.1", "sign", "topk:density=0.05"):
        results = []
        for transport in ("mpi", "gloo"):
            group = dist.new_group(backend="gradzip", pg_options=gradzip.Options(aggregation=spec, transport=transport))
            assert group._get_backend(cpu).node_levels("cpu") is not None, f"{spec} over {transport}: flat"
            out = []
            for step in range(3):
                x = sample(rank, torch.float32, 5003, exact=False, seed=step)
                dist.all_reduce(x, group=group)
                out.append(x)
            agg = gradzip.Aggregation(spec, group=dist.new_group(backend="gradzip", pg_options=gradzip.Options(
                transport=transport)))
            for step in range(3):
                x = sample(rank, torch.float32, 4001, exact=False, seed=10 + step)
                agg(x)
                out.append(torch.cat([x, torch.zeros(1002)]))
            results.append(torch.stack(out))
        same_bits(results[0], results[1], f"{spec}, hierarchical over MPI and over Gloo")
        # The same bits on every rank.
        every = [torch.empty_like(results[0]) for _ in range(size)]
        dist.all_gather(every, results[0])
        for r in range(size):
            same_bits(every[r], results[0], f"{spec}: rank {r}'s result")
    dist.destroy_process_group()
    return rank


def no_store():
    assert "MASTER_ADDR" not in os.environ and "MASTER_PORT" not in os.environ
    gradzip.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "gradzip"
    assert type(gradzip._transport.transport_of(None, torch.device("cpu"))).__name__ == "MpiBackend"
    t = torch.full((5,), float(rank))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), float(sum(range(size)))))
    # The store NCCL would rendezvous through, its address carried over MPI.
    transport = gradzip._transport.transport_of(None, torch.device("cpu"))
    store = gradzip.mpi.rendezvous_store(transport, rank, size, timedelta(seconds=30))
    store.set(f"rank{rank}", str(rank * 7))
    assert [int(store.get(f"rank{r}")) for r in range(size)] == [7 * r for r in range(size)]
    dist.barrier()
    dist.destroy_process_group()
    return rank


def mpi_shared_library():
    """The MPI library gradzip's extension loaded (Open MPI's libmpi, MPICH's libmpich), by ctypes."""
    import ctypes

    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if re.search(r"/libmpi(ch)?\.so", line)}
    assert len(paths) == 1, f"expected one MPI library loaded, found {sorted(paths)}"
    return ctypes.CDLL(paths.pop(), mode=ctypes.RTLD_GLOBAL)


def init_mpi_by_hand(level):
    """MPI_Init_thread through ctypes, as mpi4py would; returns the library."""
    import ctypes

    library = mpi_shared_library()
    provided = ctypes.c_int(-1)
    assert library.MPI_Init_thread(None, None, level, ctypes.byref(provided)) == 0
    assert provided.value == level, provided.value
    return library


def adopted():
    library = init_mpi_by_hand(3)  # MPI_THREAD_MULTIPLE
    rank, size = init()
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    assert t[0].item() == sum(range(size))
    dist.destroy_process_group()
    gradzip._C.mpi_finish()  # releases gradzip's communicators; MPI stays up for its owner
    import ctypes
    finalized = ctypes.c_int(-1)
    library.MPI_Finalized(ctypes.byref(finalized))
    assert finalized.value == 0, "gradzip finalized an MPI it did not initialize"
    assert library.MPI_Finalize() == 0
    return rank


def funneled():
    init_mpi_by_hand(1)  # MPI_THREAD_FUNNELED
    expect_error(init, "MPI offers MPI_THREAD_FUNNELED", "at least MPI_THREAD_SERIALIZED")
    mpi_shared_library().MPI_Finalize()
    return gradzip.mpi.world_from_mpirun()[0]


def expect_error(fn, *fragments):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        text = str(e)
        assert all(f in text for f in fragments), f"error {text!r} lacks {fragments}"
        return
    raise AssertionError(f"no error; expected one with {fragments}")


def errors():
    rank, size = init()
    transport = gradzip._transport.transport_of(None, torch.device("cpu"))
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.AVG
    expect_error(lambda: transport.allreduce([torch.ones(3, dtype=torch.int32)], opts).wait(),
                 "averages floating-point tensors only")
    opts.reduceOp = dist.ReduceOp.BAND
    expect_error(lambda: transport.allreduce([torch.ones(3)], opts).wait(), "bitwise reductions")
    expect_error(lambda: transport.allreduce([torch.ones(3, device="meta")], dist.AllreduceOptions()).wait(),
                 "takes CPU tensors", "meta")
    expect_error(lambda: transport.send([torch.ones(3)], size, 0).wait(), "destination", "not a rank")
    expect_error(lambda: transport.send([torch.ones(3)], 0, -1).wait(), "tag -1")
    # Tags: the transport takes MPI's range (MPI_TAG_UB: Open MPI 2^31 - 1, MPICH 2^28 - 1),
    # the checked group the lower half (a message's data travels on its tag + half).
    largest = transport.largest_tag()
    assert largest >= 32767, largest
    if largest < 2**31 - 1:
        expect_error(lambda: transport.send([torch.ones(3)], 0, largest + 1).wait(), f"tag {largest + 1}",
                     f"range 0..{largest}")
    top = largest // 2
    expect_error(lambda: dist.send(torch.ones(3), (rank + 1) % size, tag=top + 1), f"takes tags 0..{top}")
    if rank == 0:
        dist.send(torch.arange(4.0), 1, tag=top)
    elif rank == 1:
        got = torch.empty(4)
        dist.recv(got, 0, tag=top)
        assert torch.equal(got, torch.arange(4.0))
    # A receive smaller than the message names both sizes; the group is still usable.
    if rank == 0:
        dist.send(torch.ones(5), 1, tag=3)
    elif rank == 1:
        expect_error(lambda: transport.recv([torch.empty(4)], 0, 3).wait(), "recv from rank 0", "truncated")
    dist.barrier()
    # Sizes that differ across ranks: the gradzip group's check names them on every rank.
    expect_error(lambda: dist.all_reduce(torch.ones(3 + rank)), "size")
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t[0].item() == size
    dist.destroy_process_group()
    return rank


def stopped_rank():
    rank, size = init(timeout=timedelta(seconds=4))
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    start = time.monotonic()
    expect_error(lambda: dist.all_reduce(torch.ones(10)), "did not finish within its timeout")
    elapsed = time.monotonic() - start
    assert elapsed < 20, f"the timeout error came after {elapsed:.0f} s"
    expect_error(lambda: dist.all_reduce(torch.ones(10)), "unusable since an earlier call failed")
    print(f"rank {rank} ok", flush=True)
    sys.stdout.flush()
    os._exit(3)  # the stopped rank never finishes: mpirun ends the job on this exit


def killed_rank():
    rank, size = init(timeout=timedelta(seconds=60))
    dist.barrier()
    if rank == 1:
        print(f"rank 1 is pid {os.getpid()}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(10))
    time.sleep(60)


if __name__ == "__main__":
    scenario = sys.argv[1]
    result = globals()[scenario]()
    print(f"rank {result} ok", flush=True)
