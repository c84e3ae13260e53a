"""Several ranks on one GPU through every door: their CUDA tensors travel over the host
transport (gradzip/cuda_transport.py, csrc/transport/host_staged_backend.h), since NCCL
refuses two ranks on one device. Every rank works on cuda:0. Results are bitwise equal
across ranks, and equal to the same ranks on CPU tensors where only gradzip's arithmetic
runs (its GPU codecs write the CPU's bytes: test_cuda.py). Where a model's own forward
and backward run on the GPU (DDP, the hook), cuBLAS rounds otherwise than the CPU's
BLAS, so those compare across ranks only. Skips without a GPU (benchmarks/gpu.sh runs it
on a GPU machine, where a skip is a failure)."""
import logging

import pytest
import torch
import torch.distributed as dist

from collective_calls import collectives
from ranks import run_ranks

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="no CUDA device here (torch.cuda.is_available() is False)"),
]

WORLDS = [2, 4]
SPECS = ["allreduce", "topk:density=0.01", "stc:density=0.01", "sign", "qsgd", "fp16", "topk:density=0.01,momentum=0.9"]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.cpu().contiguous().view(torch.uint8),
                                              b.cpu().contiguous().view(torch.uint8))


def init(spec="allreduce", device="cuda", **options):
    """A gradzip default group; CUDA tensors over the host transport, every rank on cuda:0."""
    import gradzip
    if device == "cuda":
        torch.cuda.set_device(0)
        options.setdefault("cuda_transport", "host")
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec, **options))


def inputs(rank, step, n, device):
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 * step + rank)).to(device)


def allreduce_steps(rank, world, spec, device, steps=3, op=dist.ReduceOp.SUM):
    init(spec, device)
    out = []
    for step in range(steps):
        t = inputs(rank, step, 50021, device)
        dist.all_reduce(t, op=op)
        out.append(t.cpu())
    backend = dist.group.WORLD._get_backend(torch.device(device))
    return torch.stack(out), type(backend.transport(device)).__name__


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("world", WORLDS)
def test_all_reduce_on_a_shared_gpu_is_the_cpu_result(spec, world):
    on_gpu = run_ranks(allreduce_steps, world, spec, "cuda")
    on_cpu = run_ranks(allreduce_steps, world, spec, "cpu")
    for rank in range(world):
        assert on_gpu[rank][1] == "HostStagedBackend"
        assert same_bits(on_gpu[rank][0], on_gpu[0][0]), (spec, rank)
        assert same_bits(on_gpu[rank][0], on_cpu[rank][0]), (spec, rank)


def auto_choice(rank, world):
    import gradzip
    torch.cuda.set_device(0)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("gradzip.cuda_transport")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation="sign"))
    inner = type(dist.group.WORLD._get_backend(torch.device("cuda")).transport("cuda")).__name__
    t = inputs(rank, 0, 4099, "cuda")
    if inner == "HostStagedBackend":  # NCCL would refuse the two ranks on cuda:0
        dist.all_reduce(t)
    return inner, [r.getMessage() for r in records], t.cpu()


def test_auto_takes_the_host_transport_when_ranks_outnumber_the_gpus_and_says_so():
    results = run_ranks(auto_choice, 2)
    said = results[0][1]
    assert results[1][1] == [] and len(said) == 1, said  # rank 0 alone says it
    if torch.cuda.device_count() == 1:
        assert [r[0] for r in results] == ["HostStagedBackend"] * 2
        assert "the host transport" in said[0] and "holds 2 ranks (0, 1) and its ranks see 1 GPU" in said[0], said
        assert same_bits(results[0][2], results[1][2])
    else:  # unbound ranks on a node with a GPU each are taken to use one each (cuda_transport.py)
        assert [r[0] for r in results] == ["ProcessGroupNCCL"] * 2
        assert "over NCCL" in said[0], said


def every_collective(rank, world, device):
    init("allreduce", device)
    return collectives(rank, world, dist.group.WORLD, device)


@pytest.mark.parametrize("world", WORLDS)
def test_every_exact_collective_on_a_shared_gpu_gives_the_cpu_bytes(world):
    on_gpu = run_ranks(every_collective, world, "cuda")
    on_cpu = run_ranks(every_collective, world, "cpu")
    for rank in range(world):
        assert list(on_gpu[rank]) == list(on_cpu[rank])
        for what in on_gpu[rank]:
            assert same_bits(on_gpu[rank][what], on_cpu[rank][what]), (what, rank)


def point_to_point(rank, world):
    init()
    received = torch.empty(1000, device="cuda")
    right, left = (rank + 1) % world, (rank - 1) % world
    sent = inputs(rank, 0, 1000, "cuda")
    works = [dist.irecv(received, left), dist.isend(sent, right)]
    for work in reversed(works):
        work.wait()
    return same_bits(received, inputs(left, 0, 1000, "cpu"))


@pytest.mark.parametrize("world", WORLDS)
def test_point_to_point_on_a_shared_gpu(world):
    assert run_ranks(point_to_point, world) == [True] * world


def model_and_batches(rank, device, steps):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)
    g = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(64, 256, generator=g).to(device), torch.randint(0, 10, (64,), generator=g).to(device))
               for _ in range(steps)]
    return model, batches


def ddp_steps(rank, world, spec, door):
    """DDP on cuda:0 in every rank over a gradzip group: the backend's aggregation
    (door "backend") or the hook's over the same group (door "hook", the backend exact)."""
    import gradzip
    init(spec if door == "backend" else "allreduce")
    model, batches = model_and_batches(rank, "cuda", 10)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    if door == "hook":
        ddp.register_comm_hook(gradzip.hooks.State(spec), gradzip.hooks.hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]), losses


@pytest.mark.parametrize("spec", ["topk:density=0.1", "stc:density=0.01", "sign", "qsgd:bits=8"])
@pytest.mark.parametrize("door", ["backend", "hook"])
@pytest.mark.parametrize("world", WORLDS)
def test_ddp_on_a_shared_gpu(spec, door, world):
    results = run_ranks(ddp_steps, world, spec, door)
    params, losses = results[0]
    assert torch.isfinite(params).all() and min(losses[-3:]) < losses[0], losses
    assert all(same_bits(r[0], params) for r in results)


def aggregation_steps(rank, world, spec, device):
    """gradzip.Aggregation on a gradzip group: its own codec state, the group's transport."""
    import gradzip
    init("allreduce", device)
    agg = gradzip.Aggregation(spec)
    out = []
    for step in range(3):
        x = inputs(rank, step, 20011, device)
        agg(x)
        out.append(x.cpu())
    return torch.stack(out)


@pytest.mark.parametrize("spec", ["topk:density=0.01", "sign", "choco:topology=ring,compress=sign,block=64,gamma=0.8",
                                  "gossip:topology=ring"])
@pytest.mark.parametrize("world", WORLDS)
def test_aggregation_and_gossip_on_a_shared_gpu_are_the_cpu_result(spec, world):
    on_gpu = run_ranks(aggregation_steps, world, spec, "cuda")
    on_cpu = run_ranks(aggregation_steps, world, spec, "cpu")
    for rank in range(world):
        assert same_bits(on_gpu[rank], on_cpu[rank]), (spec, rank)
        if not spec.startswith(("choco", "gossip")):  # gossip: each rank keeps its own model
            assert same_bits(on_gpu[rank], on_gpu[0]), (spec, rank)


def reduce_scatter_steps(rank, world, device):
    """The compressed reduce-scatter (FSDP's gradients) through the backend."""
    init("qsgd:bits=8,reduce_scatter=compressed", device)
    out = []
    for step in range(2):
        shard = torch.empty(4000, device=device)
        dist.reduce_scatter_tensor(shard, inputs(rank, step, world * 4000, device), op=dist.ReduceOp.AVG)
        out.append(shard.cpu())
    return torch.stack(out)


@pytest.mark.parametrize("world, env", [(2, None), (4, None), (4, {"GRADZIP_NODE_SIZE": "2"})])
def test_the_compressed_reduce_scatter_on_a_shared_gpu_is_the_cpu_result(world, env):
    on_gpu = run_ranks(reduce_scatter_steps, world, "cuda", env=env)
    on_cpu = run_ranks(reduce_scatter_steps, world, "cpu", env=env)
    for rank in range(world):
        assert same_bits(on_gpu[rank], on_cpu[rank]), rank


def hierarchical_steps(rank, world, device):
    init("topk:density=0.01", device)
    levels = dist.group.WORLD._get_backend(torch.device(device)).node_levels(device)
    out = []
    for step in range(3):
        t = inputs(rank, step, 50021, device)
        dist.all_reduce(t)
        out.append(t.cpu())
    return torch.stack(out), levels is not None


def test_the_hierarchical_exchange_on_a_shared_gpu_is_the_cpu_result():
    env = {"GRADZIP_NODE_SIZE": "2"}  # 2 nodes of 2 ranks
    on_gpu = run_ranks(hierarchical_steps, 4, "cuda", env=env)
    on_cpu = run_ranks(hierarchical_steps, 4, "cpu", env=env)
    for rank in range(4):
        assert on_gpu[rank][1], "the CUDA transport got no node levels"
        assert same_bits(on_gpu[rank][0], on_cpu[rank][0]), rank
        assert same_bits(on_gpu[rank][0], on_gpu[0][0]), rank


def resumed(rank, world, spec):
    """Three steps straight, and two steps, a checkpoint, a new group and the third."""
    import gradzip
    init(spec)
    straight = []
    for step in range(3):
        t = inputs(rank, step, 20011, "cuda")
        dist.all_reduce(t)
        straight.append(t.cpu())
    dist.destroy_process_group()
    init(spec)
    for step in range(2):
        t = inputs(rank, step, 20011, "cuda")
        dist.all_reduce(t)
    saved = gradzip.state_dict()
    dist.destroy_process_group()
    init(spec)
    gradzip.load_state_dict(saved)
    t = inputs(rank, 2, 20011, "cuda")
    dist.all_reduce(t)
    return same_bits(t, straight[2])


@pytest.mark.parametrize("spec", ["stc:density=0.01", "topk:density=0.01,momentum=0.9"])
def test_a_checkpoint_on_a_shared_gpu_resumes_bit_for_bit(spec):
    assert run_ranks(resumed, 2, spec) == [True, True]


def fsdp_on_the_gpu(rank, world):
    """FSDP2 on cuda:0 in every rank over the gradzip group (its all-gathers and exact
    reduce-scatters staged), gradzip.fsdp.compress's reduce-scatter on the GPU; a resume
    from a checkpoint at step 10 continues bit for bit."""
    from test_fsdp import resumes_bit_for_bit, sharded, train
    init()
    exact, _, opt = sharded(world, None, device="cuda")
    exact_losses = train(exact, opt, rank, 40, device="cuda")
    stc, state, opt = sharded(world, "stc:density=0.1", device="cuda")
    stc_losses = train(stc, opt, rank, 40, device="cuda")
    calls = state.stats()["calls"]
    resumed_equal = resumes_bit_for_bit(world, rank, "stc:density=0.1", device="cuda")
    return exact_losses, stc_losses, calls, resumed_equal


@pytest.mark.parametrize("world", WORLDS)
def test_fsdp2_with_the_compressed_reduce_scatter_on_a_shared_gpu(world):
    for exact_losses, stc_losses, calls, resumed_equal in run_ranks(fsdp_on_the_gpu, world):
        assert sum(exact_losses[-10:]) < 0.3 * sum(exact_losses[:10]), exact_losses
        assert sum(stc_losses[-10:]) < 0.3 * sum(stc_losses[:10]), stc_losses
        assert calls == 40 * 3  # every layer's reduce-scatter went through gradzip
        assert resumed_equal


def diloco_on_the_gpu(rank, world):
    """DiLoCo's outer step on cuda:0 in every rank: exact against the float64 reference,
    compressed replicas identical."""
    import gradzip

    from test_diloco import H, INNER_LR, LR, MOMENTUM, make_model
    init()
    out = []
    for spec in ("allreduce", "qsgd:bits=4,norm=max,ef=1"):
        model = make_model().cuda()
        inner = torch.optim.SGD(model.parameters(), lr=INNER_LR)
        outer = gradzip.diloco.DiLoCo(model, spec, local_steps=H, outer_lr=LR, outer_momentum=MOMENTUM)
        for step in range(2 * H):
            g = torch.Generator().manual_seed(100 * step + rank)
            x = torch.randn(8, 5, generator=g).cuda()
            loss = torch.nn.functional.mse_loss(model(x), x[:, :3])
            inner.zero_grad()
            loss.backward()
            inner.step()
            outer.step()
        out.append([p.detach().cpu().clone() for p in model.parameters()])
    return out


def test_diloco_on_a_shared_gpu():
    from test_diloco import reference
    outs = run_ranks(diloco_on_the_gpu, 2)
    for exact, compressed in outs:
        for got, want in zip(exact, reference(2, 2)):
            assert torch.allclose(got.double(), want, atol=1e-5), (got.double() - want).abs().max()
    for a, b in zip(outs[0][1], outs[1][1]):
        assert same_bits(a, b)
    for a, b in zip(outs[0][0], outs[1][0]):
        assert same_bits(a, b)
