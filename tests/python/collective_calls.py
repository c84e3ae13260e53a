"""Every collective torch.distributed offers, called the way applications call them, for
tests that compare one group's results with another's (test_host_staging.py: the staged
transport against Gloo; test_gpu_ranks.py: CUDA tensors on a shared GPU against CPU ones)."""
import torch
import torch.distributed as dist


def collectives(rank, world, group, device="cpu"):
    """Every collective torch.distributed offers, on `group`, with `device` tensors whose
    values do not depend on the device: what each returned (moved to the host)."""
    g = torch.Generator().manual_seed(rank)
    out = {}

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device)

    t = randn(1000)
    dist.broadcast(t, src=world - 1, group=group)
    out["broadcast"] = t
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT):
        t = randn(257)
        dist.all_reduce(t, op=op, group=group)
        out[f"all_reduce {op}"] = t
    base = randn(6, 4)
    t, c = base.clone().t(), base.t().contiguous()  # the same values, not contiguous and contiguous
    dist.all_reduce(t, group=group)
    dist.all_reduce(c, group=group)
    out["all_reduce of a transposed tensor"] = t
    out["all_reduce of its contiguous copy"] = c
    t = torch.arange(10, dtype=torch.int64, device=device) * (rank + 1)
    dist.all_reduce(t, group=group)
    out["all_reduce int64"] = t
    t = randn(33)
    dist.reduce(t, dst=0, group=group)
    out["reduce (root)"] = t if rank == 0 else torch.zeros(0)
    gathered = [torch.empty(5, device=device) for _ in range(world)]
    dist.all_gather(gathered, randn(5), group=group)
    out["all_gather"] = torch.cat(gathered)
    flat = torch.empty(world * 7, device=device)
    dist.all_gather_into_tensor(flat, randn(7), group=group)
    out["all_gather_into_tensor"] = flat
    inplace = torch.zeros(world * 3, device=device)  # FSDP's way: the input is this rank's piece of the output
    inplace[rank * 3:(rank + 1) * 3] = randn(3)
    dist.all_gather_into_tensor(inplace, inplace[rank * 3:(rank + 1) * 3], group=group)
    out["all_gather_into_tensor in place"] = inplace
    rows = [torch.empty(4, device=device) for _ in range(world)] if rank == 0 else None
    dist.gather(randn(4), rows, dst=0, group=group)
    out["gather"] = torch.cat(rows) if rank == 0 else torch.zeros(0)
    piece = torch.empty(6, device=device)
    dist.scatter(piece, [randn(6) for _ in range(world)] if rank == 1 else None, src=1, group=group)
    out["scatter"] = piece
    mine = torch.empty(5, device=device)
    dist.reduce_scatter_tensor(mine, randn(world * 5), group=group)
    out["reduce_scatter_tensor"] = mine
    split_in = [r + 1 for r in range(world)]  # rank r gets r + 1 rows from everyone
    split_out = [rank + 1] * world
    received = torch.empty(sum(split_out), 2, device=device)
    dist.all_to_all_single(received, randn(sum(split_in), 2), split_out, split_in, group=group)
    out["all_to_all_single, uneven"] = received
    pieces = [torch.empty(3, device=device) for _ in range(world)]
    dist.all_to_all(pieces, [randn(3) for _ in range(world)], group=group)
    out["all_to_all"] = torch.cat(pieces)
    t = randn(100)
    future = dist.all_reduce(t, group=group, async_op=True).get_future()
    out["all_reduce's future"] = future.wait()[0].clone()
    out["all_reduce's tensor after its future"] = t
    t = randn(100)
    work = dist.all_reduce(t, group=group, async_op=True)
    while not work.is_completed():
        pass
    if t.is_cpu:  # read before wait(): is_completed() copied it back
        out["all_reduce polled"] = t.clone()
    work.wait()
    if not t.is_cpu:  # wait() orders a GPU result on the caller's stream
        out["all_reduce polled"] = t.clone()
    dist.barrier(group=group)
    return {what: t.cpu() for what, t in out.items()}
