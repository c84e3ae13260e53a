"""The GPU codecs against the CPU codecs, and CUDA all-reduces through the gradzip
backend against the CPU path: the same bytes, residuals and results. Skips without a GPU
(benchmarks/gpu.sh runs it on a GPU machine, where a skip is a failure)."""
import pytest
import torch
import torch.distributed as dist

import gradzip
from gradzip import _C
from ranks import run_ranks

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (torch.cuda.is_available() is False)"),
    pytest.mark.skipif(not hasattr(_C, "cuda_encode"), reason="this build of gradzip has no CUDA kernels"),
]

SPECS = ["topk:density=0.01", "topk:density=0.001", "topk:density=0.01,approx=1", "stc:density=0.01",
         "stc:density=0.5", "sign", "sign:block=100", "sign:vote=majority", "qsgd", "qsgd:bits=8",
         "qsgd:levels=5,bucket=100", "qsgd:norm=max", "identity", "fp16", "bf16", "uniform", "uniform:threshold=0",
         "uniform:threshold=0,rounding=nearest"]
SIZES = [0, 1, 7, 4099, 1 << 20]


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
    got = _C.cuda_encode(x.cuda(), spec, gpu_residual, 7, 3, 1)
    assert bytes(got.cpu().numpy().tobytes()) == expected
    assert same_bits(gpu_residual, cpu_residual)


@pytest.mark.parametrize("spec", SPECS)
def test_gpu_decode_accumulate_is_the_cpu_sum_in_rank_order(spec):
    n = 100003
    payloads = [_C.encode(torch.randn(n, generator=torch.Generator().manual_seed(r)), spec, None, 5, 0, r)[0]
                for r in range(4)]
    expected = torch.zeros(n)
    for p in payloads:
        _C.decode_add(p, expected)
    out = torch.zeros(n, device="cuda")
    rows = [torch.frombuffer(bytearray(p), dtype=torch.uint8).cuda() for p in payloads]
    _C.cuda_decode_add(rows, out, spec)
    assert same_bits(out, expected)


def test_a_corrupt_payload_is_refused():
    n = 1000
    good, _ = _C.encode(torch.randn(n), "topk:density=0.05", None, 0, 0, 0)
    bad = bytearray(good)
    bad[25:29], bad[29:33] = bad[29:33], bad[25:29]  # the first two indices out of order
    rows = [torch.frombuffer(bytearray(p), dtype=torch.uint8).cuda() for p in (good, bytes(bad))]
    with pytest.raises(ValueError, match="payload 1"):
        _C.cuda_decode_add(rows, torch.zeros(n, device="cuda"), "topk:density=0.05")


def allreduce_on(rank, world, spec, device, steps):
    if device == "cuda":
        torch.cuda.set_device(rank)
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    results = []
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        t = torch.randn(50021, generator=g).to(device)
        dist.all_reduce(t)
        results.append(t.cpu())
    return torch.stack(results)


def ranks_for_nccl():
    return [1] + ([2] if torch.cuda.device_count() >= 2 else [])


@pytest.mark.parametrize("spec", ["topk:density=0.01", "stc:density=0.01", "sign", "qsgd", "sign:vote=majority"])
@pytest.mark.parametrize("world", ranks_for_nccl())
def test_cuda_allreduce_through_gradzip_matches_the_cpu_path(spec, world):
    # NCCL puts each rank on its own GPU: two ranks need two GPUs; one rank still runs the
    # whole GPU path (encode, NCCL allgather, decode) against the CPU path's result.
    on_gpu = run_ranks(allreduce_on, world, spec, "cuda", 3)
    on_cpu = run_ranks(allreduce_on, world, spec, "cpu", 3)
    for rank in range(world):
        assert same_bits(on_gpu[rank], on_cpu[rank]), (spec, rank)
        assert same_bits(on_gpu[rank], on_gpu[0])


def state_round_trip(rank, world):
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation="topk:density=0.01"))
    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    t = torch.randn(10007, device="cuda")
    dist.all_reduce(t)
    return backend.state_dict()


def test_a_cuda_residual_is_saved_on_the_host():
    (state,) = run_ranks(state_round_trip, 1)
    (residual,) = [value for name, value in state.items() if name.endswith("/residual")]
    assert residual.device.type == "cpu"
    assert residual.numel() == 10007
