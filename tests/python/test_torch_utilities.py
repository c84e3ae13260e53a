"""PyTorch's own utilities on a gradzip default group give what they give on Gloo, bit for
bit: distributed checkpoints (torch.distributed.checkpoint), a 2-D DeviceMesh and its
groups, the object collectives, new_subgroups, monitored_barrier, functional collectives
(eager and under torch.compile), DTensor's redistributions, ZeroRedundancyOptimizer and
batch_isend_irecv. The same function runs on 4 ranks over each backend."""
import pytest
import torch

from ranks import run_ranks


def utilities(rank, world, backend, checkpoint_dir):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradzip
    gradzip.init_process_group(backend)
    assert dist.get_backend() == backend
    out = {}
    torch.manual_seed(0)  # the same model and inputs on every rank
    shared = torch.randn(8, 6)
    mine = torch.randn(16, generator=torch.Generator().manual_seed(rank + 1))

    # Distributed checkpoint of a DDP model: saved, loaded into another, equal.
    model = DDP(torch.nn.Linear(6, 3))
    dcp.save({"model": model.state_dict()}, checkpoint_id=f"{checkpoint_dir}/{backend}")
    other = DDP(torch.nn.Linear(6, 3))
    loaded = {"model": other.state_dict()}
    dcp.load(loaded, checkpoint_id=f"{checkpoint_dir}/{backend}")
    other.load_state_dict(loaded["model"])
    out["checkpoint"] = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))

    # A 2-D mesh: sums along each dimension.
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        x = mine.clone()
        dist.all_reduce(x, group=mesh.get_group(dim))
        out[f"mesh {dim}"] = x

    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "name": f"r{rank}"})
    broadcast = [f"from {rank}", rank]
    dist.broadcast_object_list(broadcast, src=1)
    at_zero = [None] * world if rank == 0 else None
    dist.gather_object((rank, "x" * rank), at_zero, dst=0)
    scattered = [None]
    dist.scatter_object_list(scattered, [{"to": r} for r in range(world)] if rank == 0 else None, src=0)
    out["objects"] = (gathered, broadcast, at_zero, scattered)

    subgroup, _ = dist.new_subgroups(group_size=2)
    x = mine.clone()
    dist.all_reduce(x, group=subgroup)
    out["new_subgroups"] = x
    dist.monitored_barrier()

    out["funcol all_reduce"] = funcol.all_reduce(mine, "sum", dist.group.WORLD).wait()
    out["funcol reduce_scatter"] = funcol.reduce_scatter_tensor(mine, "sum", 0, dist.group.WORLD).wait()
    compiled = torch.compile(lambda t: funcol.all_reduce(t * 2, "sum", dist.group.WORLD), backend="eager")
    out["compiled all_reduce"] = compiled(mine)

    flat = init_device_mesh("cpu", (world,))
    sharded = distribute_tensor(shared, flat, [Shard(0)])
    out["dtensor replicate"] = sharded.redistribute(flat, [Replicate()]).to_local()
    out["dtensor shard 1"] = sharded.redistribute(flat, [Shard(1)]).to_local()
    out["dtensor matmul"] = (sharded @ distribute_tensor(shared.T, flat, [Replicate()])).full_tensor()

    net = torch.nn.Linear(6, 6)
    optimizer = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.SGD, lr=0.1, momentum=0.9)
    for _ in range(2):
        optimizer.zero_grad()
        (net(shared * (rank + 1)) ** 2).sum().backward()
        for p in net.parameters():  # the gradients DDP would have averaged
            dist.all_reduce(p.grad)
        optimizer.step()
    optimizer.consolidate_state_dict(to=0)
    out["zero"] = [p.detach().clone() for p in net.parameters()]

    received = torch.empty(16)
    ops = [dist.P2POp(dist.isend, mine, (rank + 1) % world), dist.P2POp(dist.irecv, received, (rank - 1) % world)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    out["batch_isend_irecv"] = received
    return out


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_pytorch_utilities_on_a_gradzip_group_match_gloo(tmp_path):
    world = 4
    gloo = run_ranks(utilities, world, "gloo", str(tmp_path))
    ours = run_ranks(utilities, world, "gradzip", str(tmp_path))
    for rank, (theirs, mine) in enumerate(zip(gloo, ours)):
        assert set(theirs) == set(mine)
        for name in theirs:
            assert same(mine[name], theirs[name]), (rank, name, mine[name], theirs[name])
    # Known answers, so that a change on both sides is seen too.
    first = ours[0]
    assert first["checkpoint"]
    assert first["objects"][0] == [{"rank": r, "name": f"r{r}"} for r in range(world)]
    assert first["objects"][1] == ["from 1", 1] and first["objects"][2] == [(r, "x" * r) for r in range(world)]
    assert [o["objects"][3] for o in ours] == [[{"to": r}] for r in range(world)]
    inputs = [torch.randn(16, generator=torch.Generator().manual_seed(r + 1)) for r in range(world)]
    total = inputs[0] + inputs[1] + inputs[2] + inputs[3]
    torch.testing.assert_close(first["funcol all_reduce"], total)
    torch.testing.assert_close(first["compiled all_reduce"], 2 * total)
    torch.testing.assert_close(first["new_subgroups"], inputs[0] + inputs[1])
    assert torch.equal(first["batch_isend_irecv"], inputs[world - 1])
    torch.manual_seed(0)
    shared = torch.randn(8, 6)
    assert torch.equal(first["dtensor replicate"], shared)
    torch.testing.assert_close(first["dtensor matmul"], shared @ shared.T)
