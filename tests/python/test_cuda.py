"""The GPU codecs against the CPU codecs, and CUDA all-reduces through the gradzip
backend against the CPU path: the same bytes, residuals and results. Skips without a GPU
(benchmarks/gpu.sh runs it on a GPU machine, where a skip is a failure)."""
import time

import pytest
import torch
import torch.distributed as dist

import gradzip
from gradzip import _C
from gradzip._transport import transport_of
from ranks import run_ranks

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (torch.cuda.is_available() is False)"),
    pytest.mark.skipif(not hasattr(_C.testing, "cuda_encode"), reason="this build of gradzip has no CUDA kernels"),
]

SPECS = ["topk:density=0.01", "topk:density=0.001", "topk:density=0.01,approx=1", "topk:density=1",
         "topk:density=0.000000001", "stc:density=0.01", "stc:density=0.5", "stc:density=1",
         "stc:density=0.000000001", "sign", "sign:block=100", "sign:block=0", "sign:block=1024",
         "sign:vote=majority", "qsgd", "qsgd:bits=8", "qsgd:levels=5,bucket=100", "qsgd:norm=max",
         "qsgd:bits=16,bucket=1024", "identity", "fp16", "bf16", "uniform", "uniform:threshold=0",
         "uniform:threshold=0,rounding=nearest", "randomk:density=0.01", "randomk:density=0.3,unbiased=0",
         "topk:density=0.01,values=fp16", "topk:density=0.3,values=bf16,approx=1"]
# Both sides of warp, block and word boundaries, and a grid of thousands of blocks.
SIZES = [0, 1, 7, 31, 32, 33, 1023, 1025, 4099, (1 << 20) + 7]
# Their payloads hold one term per element: all ranks' payloads decode in one pass, each
# term scaled as the CPU scales it (cuda/device_codec.h).
ONE_PASS = ("sign", "qsgd", "identity", "fp16", "bf16")


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.cpu().view(torch.int32), b.cpu().view(torch.int32))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("ties", [False, True])
def test_gpu_encoders_write_the_cpu_bytes_and_residuals(spec, n, ties):
    g = torch.Generator().manual_seed(n + 17)
    x = torch.randn(n, generator=g)
    if ties:
        x = (x * 2).round()
    residual = torch.randn(n, generator=g)
    cpu_residual = residual.clone()
    expected, _ = _C.encode(x, spec, cpu_residual, 7, 3, 1)
    gpu_residual = residual.cuda()
    got = _C.testing.cuda_encode(x.cuda(), spec, gpu_residual, 7, 3, 1)
    assert bytes(got.cpu().numpy().tobytes()) == expected
    assert same_bits(gpu_residual, cpu_residual)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_gpu_decode_accumulate_is_the_cpu_sum_in_rank_order(spec, scale):
    n = 100003
    payloads = [_C.encode(torch.randn(n, generator=torch.Generator().manual_seed(r)), spec, None, 5, 0, r)[0]
                for r in range(8)]
    start = torch.randn(n, generator=torch.Generator().manual_seed(99))
    expected = start.clone()
    if spec.split(":")[0] in ONE_PASS or scale == 1.0:
        for p in payloads:
            _C.decode_add(p, expected, scale)
    else:  # decoded one by one, unscaled, then start + scale × their sum
        terms = torch.zeros(n)
        for p in payloads:
            _C.decode_add(p, terms)
        expected = start + scale * terms
    out = start.cuda()
    rows = [torch.frombuffer(bytearray(p), dtype=torch.uint8).cuda() for p in payloads]
    _C.testing.cuda_decode_add(rows, out, spec, scale)
    assert same_bits(out, expected)


@pytest.mark.parametrize("spec", ["sign", "qsgd", "fp16", "stc:density=0.01"])
def test_decode_rows_set_the_sum_without_reading_it(spec):
    n = 4099
    payloads = [_C.encode(torch.randn(n, generator=torch.Generator().manual_seed(r)), spec, None, 5, 0, r)[0]
                for r in range(3)]
    expected = torch.zeros(n)
    for p in payloads:
        _C.decode_add(p, expected)
    rows = _C.testing.cuda_payload_rows([torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in payloads],
                                torch.device("cuda"))
    out = torch.full((n,), float("nan"), device="cuda")
    _C.testing.cuda_decode_rows(rows, [len(p) for p in payloads], out, spec, 1.0, True)
    assert same_bits(out, expected)


def test_a_corrupt_payload_is_refused():
    n = 1000
    good, _ = _C.encode(torch.randn(n), "topk:density=0.05", None, 0, 0, 0)
    bad = bytearray(good)
    bad[25:29], bad[29:33] = bad[29:33], bad[25:29]  # the first two indices out of order
    rows = [torch.frombuffer(bytearray(p), dtype=torch.uint8).cuda() for p in (good, bytes(bad))]
    with pytest.raises(ValueError, match="payload 1"):
        _C.testing.cuda_decode_add(rows, torch.zeros(n, device="cuda"), "topk:density=0.05")


def allreduce_on(rank, world, spec, device, steps, op=dist.ReduceOp.SUM):
    if device == "cuda":
        torch.cuda.set_device(rank)
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    results = []
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        t = torch.randn(50021, generator=g).to(device)
        dist.all_reduce(t, op=op)
        results.append(t.cpu())
    return torch.stack(results)


def ranks_for_nccl():
    return [1] + ([2] if torch.cuda.device_count() >= 2 else [])


def exchanged(spec, world):
    """The spec, made to exchange payloads at one rank too: with one rank every exchange
    moves 0 bytes and `exchange=auto` takes the exact all-reduce (no codec at all)."""
    if world != 1:
        return spec
    return spec + (",exchange=oneshot" if ":" in spec else ":exchange=oneshot")


@pytest.mark.parametrize("spec", ["topk:density=0.01", "stc:density=0.01", "sign", "qsgd", "sign:vote=majority",
                                  "topk:density=0.01,values=fp16", "randomk:density=0.01", "fp16",
                                  "qsgd:rounds=3", "topk:density=0.01,rounds=3"])
@pytest.mark.parametrize("world", ranks_for_nccl())
def test_cuda_allreduce_through_gradzip_matches_the_cpu_path(spec, world):
    # NCCL puts each rank on its own GPU: two ranks need two GPUs; one rank still runs the
    # whole GPU path (encode, NCCL allgather, decode: exchanged()) against the CPU path's.
    spec = exchanged(spec, world)
    on_gpu = run_ranks(allreduce_on, world, spec, "cuda", 3)
    on_cpu = run_ranks(allreduce_on, world, spec, "cpu", 3)
    for rank in range(world):
        assert same_bits(on_gpu[rank], on_cpu[rank]), (spec, rank)
        assert same_bits(on_gpu[rank], on_gpu[0])


@pytest.mark.parametrize("spec", ["sign", "qsgd", "fp16", "topk:density=0.01"])
@pytest.mark.parametrize("world", ranks_for_nccl())
def test_cuda_average_through_gradzip(spec, world):
    # AVG scales each term as it is decoded; the one-pass codecs do it as the CPU does.
    on_gpu = run_ranks(allreduce_on, world, exchanged(spec, world), "cuda", 2, dist.ReduceOp.AVG)
    on_cpu = run_ranks(allreduce_on, world, exchanged(spec, world), "cpu", 2, dist.ReduceOp.AVG)
    for rank in range(world):
        assert same_bits(on_gpu[rank], on_gpu[0])
        if spec.split(":")[0] in ONE_PASS:
            assert same_bits(on_gpu[rank], on_cpu[rank]), (spec, rank)
        else:
            torch.testing.assert_close(on_gpu[rank], on_cpu[rank], rtol=1e-6, atol=1e-6)


def ddp_hook_on_a_shared_gpu(rank, world, spec, per_parameter):
    """DDP on cuda:0 in every rank, the collectives over Gloo (ranks may share one GPU),
    the hook's codecs on the GPU. Returns the parameters after 3 steps, the bucket
    averages of the last step against their float64 reference, and the GPU memory the
    compressed state took."""
    dist.init_process_group("gloo")
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    state = gradzip.hooks.State(spec, model=ddp if per_parameter else None)
    ddp.register_comm_hook(state, gradzip.hooks.hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    held = None
    for step in range(3):
        g = torch.Generator().manual_seed(10 * step + rank)
        x, y = torch.randn(64, 512, generator=g).cuda(), torch.randint(0, 10, (64,), generator=g).cuda()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        torch.cuda.synchronize()
        if step == 0:
            held = torch.cuda.memory_allocated()
        optimizer.step()
    grown = torch.cuda.memory_allocated() - held
    params = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    return params, grown, sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("spec", ["stc:density=0.01", "sign", "qsgd:ef=1", "fp16:ef=1"])
@pytest.mark.parametrize("per_parameter", [False, True])
def test_the_ddp_hook_on_the_gpu(spec, per_parameter):
    # Two ranks on one GPU (Gloo moves the payloads; encode and decode run on the GPU).
    results = run_ranks(ddp_hook_on_a_shared_gpu, 2, spec, per_parameter)
    (params0, grown, numel), (params1, _, _) = results
    assert torch.isfinite(params0).all()
    assert same_bits(params0, params1), "the replicas diverged"
    # Error feedback keeps a float32 residual per element, on the GPU (not on the host).
    assert grown >= 4 * numel, (grown, numel)


def ddp_through_the_backend(rank, world, spec):
    """DDP on one GPU per rank over the gradzip backend (its NCCL moves the payloads)."""
    torch.cuda.set_device(rank)
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    losses = []
    for step in range(20):
        g = torch.Generator().manual_seed(0)  # one batch, every step and rank: a loss that must fall
        x, y = torch.randn(64, 256, generator=g).cuda(), torch.randint(0, 10, (64,), generator=g).cuda()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]), losses


@pytest.mark.parametrize("spec", ["topk:density=0.1", "sign", "qsgd:bits=8"])
@pytest.mark.parametrize("world", ranks_for_nccl())
def test_ddp_through_the_gradzip_backend_on_the_gpu(spec, world):
    results = run_ranks(ddp_through_the_backend, world, exchanged(spec, world))
    params, losses = results[0]
    assert torch.isfinite(params).all() and losses[-1] < losses[0], losses
    assert all(same_bits(r[0], params) for r in results)


def allreduce_on_streams(rank, world, spec):
    """The same all-reduces on the default stream and on a side stream, alternating, so
    the state's tensors are used on a stream they were not allocated on."""
    torch.cuda.set_device(rank)
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    side = torch.cuda.Stream()
    results = []
    for step in range(4):
        t = torch.randn(50021, generator=torch.Generator().manual_seed(1000 * step + rank)).cuda()
        stream = side if step % 2 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            dist.all_reduce(t)
        torch.cuda.current_stream().wait_stream(stream)
        results.append(t.cpu())
    return torch.stack(results)


@pytest.mark.parametrize("spec", ["topk:density=0.01", "sign", "qsgd"])
def test_cuda_allreduce_on_a_side_stream(spec):
    (streams,) = run_ranks(allreduce_on_streams, 1, exchanged(spec, 1))
    (cpu,) = run_ranks(allreduce_on, 1, exchanged(spec, 1), "cpu", 4)
    assert same_bits(streams, cpu)


def allreduce_behind_a_busy_stream(rank, world, spec):
    """allreduce_on's two steps on the GPU, the second issued with async_op while the
    current stream is still busy (a sleep kernel, then the copy that writes the input)."""
    torch.cuda.set_device(rank)
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    inputs = [torch.randn(50021, generator=torch.Generator().manual_seed(1000 * step + rank)).cuda()
              for step in range(2)]
    t = inputs[0].clone()
    dist.all_reduce(t)
    results = [t.cpu()]
    t = torch.empty_like(inputs[1])
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda._sleep(2_000_000_000)  # about a second at an H100's clock
    t.copy_(inputs[1])  # the input exists only once the sleep is over
    work = dist.all_reduce(t, async_op=True)
    returned = time.perf_counter() - start
    work.wait()
    results.append((t * 1).cpu())  # on the current stream, which wait() made wait for the result
    elapsed = time.perf_counter() - start
    return torch.stack(results), returned, elapsed


@pytest.mark.parametrize("spec", ["topk:density=0.01", "sign", "qsgd", "stc:density=0.01"])
def test_a_cuda_allreduce_returns_while_its_input_is_still_being_computed(spec):
    """The call returns at once (its work runs on the worker thread's side stream), the
    side stream waits for the producing stream, and the caller's stream for the result:
    the same bits as the CPU path."""
    ((gpu, returned, elapsed),) = run_ranks(allreduce_behind_a_busy_stream, 1, exchanged(spec, 1))
    (cpu,) = run_ranks(allreduce_on, 1, exchanged(spec, 1), "cpu", 2)
    assert same_bits(gpu, cpu)
    assert elapsed > 0.2, f"the sleep kernel took {elapsed:.3f} s: too short to tell"
    assert returned < elapsed / 4, f"all_reduce took {returned:.3f} s of {elapsed:.3f} s to return"


def allreduce_read_right_after_wait(rank, world, spec, n):
    """A large all-reduce whose result is read on the caller's stream the moment wait()
    returns: wait() does not wait on the host for what the job queued after its last host
    synchronization, only orders the caller's stream after it, so a missing order would
    read the result before it is written."""
    torch.cuda.set_device(rank)
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    results = []
    for step in range(2):
        t = torch.randn(n, generator=torch.Generator().manual_seed(1000 * step + rank)).cuda()
        dist.all_reduce(t, async_op=True).wait()
        results.append((t * 1).cpu())
    return torch.stack(results)


def allreduce_large_on_the_cpu(rank, world, spec, n):
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    results = []
    for step in range(2):
        t = torch.randn(n, generator=torch.Generator().manual_seed(1000 * step + rank))
        dist.all_reduce(t)
        results.append(t.clone())
    return torch.stack(results)


@pytest.mark.parametrize("spec", ["sign", "fp16", "stc:density=0.01"])
def test_the_result_is_ordered_on_the_callers_stream_after_wait(spec):
    n = 1 << 25
    (gpu,) = run_ranks(allreduce_read_right_after_wait, 1, exchanged(spec, 1), n)
    (cpu,) = run_ranks(allreduce_large_on_the_cpu, 1, exchanged(spec, 1), n)
    assert same_bits(gpu, cpu)


def bound_to_its_gpu(rank, world):
    torch.cuda.set_device(rank)
    gradzip.init_process_group("gradzip", device_id=torch.device("cuda", rank),
                               pg_options=gradzip.Options(aggregation=exchanged("sign", world)))
    nccl = transport_of(None, torch.device("cuda", rank))
    t = torch.full((4099,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    dist.barrier()
    return nccl.bound_device_id, t.cpu()


@pytest.mark.parametrize("world", ranks_for_nccl())
def test_a_group_bound_to_a_gpu_binds_its_nccl_transport(world):
    """init_process_group(device_id=...) binds the inner NCCL to the rank's GPU."""
    for rank, (bound, t) in enumerate(run_ranks(bound_to_its_gpu, world)):
        assert bound == torch.device("cuda", rank)
        assert torch.equal(t.sign(), torch.ones(4099))


def choco_on(rank, world, spec, device, steps):
    if device == "cuda":
        torch.cuda.set_device(rank)
    gradzip.init_process_group("gradzip")
    agg = gradzip.Aggregation(spec)
    x = torch.randn(4099, generator=torch.Generator().manual_seed(rank)).to(device)
    for _ in range(steps):
        agg(x)
    return x.cpu(), agg.state_dict()


@pytest.mark.parametrize("spec", ["choco:topology=ring,compress=sign,block=64,gamma=0.8",
                                  "choco:topology=ring,compress=topk,density=0.1,gamma=0.05"])
@pytest.mark.parametrize("world", ranks_for_nccl())
def test_choco_keeps_its_public_copies_on_the_gpu(spec, world):
    on_gpu = run_ranks(choco_on, world, spec, "cuda", 5)
    on_cpu = run_ranks(choco_on, world, spec, "cpu", 5)
    for rank in range(world):
        (gpu_x, gpu_state), (cpu_x, cpu_state) = on_gpu[rank], on_cpu[rank]
        copies = [name for name in cpu_state["tensors"] if "public_copy_" in name]
        assert copies and sorted(copies) == sorted(n for n in gpu_state["tensors"] if "public_copy_" in n)
        # This rank's own copy takes the same decoded q as on the host: the same bits (while
        # x stays the same: at most one neighbour, whose consensus step rounds alike).
        own = [name for name in copies if name.endswith(f"public_copy_{rank}")]
        assert same_bits(gpu_state["tensors"][own[0]], cpu_state["tensors"][own[0]])
        assert all(gpu_state["tensors"][name].device.type == "cpu" for name in copies)  # saved on the host
        torch.testing.assert_close(gpu_x, cpu_x, rtol=1e-5, atol=1e-5)


def state_round_trip(rank, world):
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=exchanged("topk:density=0.01", 1)))
    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    t = torch.randn(10007, device="cuda")
    dist.all_reduce(t)
    return backend.state_dict()


def test_a_cuda_residual_is_saved_on_the_host():
    (state,) = run_ranks(state_round_trip, 1)
    (residual,) = [value for name, value in state.items() if name.endswith("/residual")]
    assert residual.device.type == "cpu"
    assert residual.numel() == 10007
