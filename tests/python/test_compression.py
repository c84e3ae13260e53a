"""Compressed aggregation with real ranks, through all three doors: the backend, the DDP
comm hook and gradzip.Aggregation; and the byte-level codec API."""
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradzip
from ranks import run_ranks

SMOKE = pytest.mark.torch_range  # also beside the second torch (scripts/second_torch.sh)
SPECS = ["topk:density=0.05", "topk:density=0.05,approx=1", "randomk:density=0.1",
         pytest.param("stc:density=0.05", marks=SMOKE), "sign", "sign:vote=majority",
         pytest.param("qsgd:bits=4", marks=SMOKE), "qsgd:bits=8,bucket=128,norm=max", "fp16", "bf16",
         "identity", "sz:mode=abs,bound=1e-3", "zfp:mode=rel,bound=1e-2", "uniform:threshold=0",
         "polar:rate=0.5,block=256"]
RANDOM_DRAWS = ("randomk", "qsgd", "uniform")  # their draws are seeded per tensor name


def grad_like(numel, rank, step, salt=0):
    g = torch.Generator().manual_seed(10007 * step + 101 * rank + salt)
    return torch.randn(numel, generator=g)


def three_doors(rank, world, spec):
    import gradzip
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    gloo = dist.new_group(backend="gloo")
    results = {}
    # 1. the backend: all_reduce on the gradzip group
    backend_out = []
    for step in range(3):
        x = grad_like(1000, rank, step)
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        backend_out.append(x)
    results["backend"] = torch.stack(backend_out)
    # 2. gradzip.Aggregation over a Gloo group, keyed by position
    agg = gradzip.Aggregation(spec, group=gloo)
    model_out = []
    for step in range(3):
        x = grad_like(1000, rank, step)
        agg([x])
        model_out.append(x)
    results["aggregation"] = torch.stack(model_out)
    # 3. the DDP hook, over the Gloo group
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.ReLU(), torch.nn.Linear(30, 4))
    ddp = DDP(model, process_group=gloo)
    ddp.register_comm_hook(gradzip.hooks.State(spec, process_group=gloo), gradzip.hooks.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(4):
        g = torch.Generator().manual_seed(step * 10 + rank)
        opt.zero_grad()
        ddp(torch.randn(8, 20, generator=g)).pow(2).mean().backward()
        opt.step()
    results["hook"] = torch.cat([p.detach().view(-1) for p in model.parameters()])
    return results


@pytest.mark.parametrize("spec", SPECS)
def test_every_spec_through_every_door_is_bitwise_equal_on_all_ranks(spec):
    results = run_ranks(three_doors, 3, spec)
    for door in ("backend", "aggregation", "hook"):
        for rank in (1, 2):
            assert torch.equal(results[0][door].view(torch.int32), results[rank][door].view(torch.int32)), door
    # The backend and gradzip.Aggregation run the same algorithm on the same inputs; codecs
    # with random draws seed them from the tensor's name, which differs between the doors.
    if not spec.startswith(RANDOM_DRAWS):
        assert torch.equal(results[0]["backend"], results[0]["aggregation"])


def known_answers(rank, world):
    import gradzip
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation="topk:density=0.01"))
    # At most k = 10 non-zeros per rank: top-k sends them all, the sum is exact.
    x = torch.zeros(1000)
    x[rank * 7: rank * 7 + 10] = torch.arange(1, 11, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(x)
    # Integer tensors and MAX go exact.
    counts = torch.tensor([rank, 1], dtype=torch.int64)
    dist.all_reduce(counts)
    largest = torch.full((100,), float(rank))
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    # Half-width tensors: compressed in fp32, returned in their own dtype.
    half = torch.zeros(1000, dtype=torch.bfloat16)
    half[rank] = 1.5
    dist.all_reduce(half)
    return x, counts, largest, half


@SMOKE
def test_lossless_cases_give_the_exact_answer():
    world = 3
    results = run_ranks(known_answers, world)
    expected = torch.zeros(1000)
    for r in range(world):  # summed in rank order, in fp32, as every rank decodes
        part = torch.zeros(1000)
        part[r * 7: r * 7 + 10] = torch.arange(1, 11, dtype=torch.float32) * (r + 1)
        expected = expected + part
    for x, counts, largest, half in results:
        assert torch.equal(x, expected)
        assert counts.tolist() == [3, 3]
        assert torch.equal(largest, torch.full((100,), 2.0))
        assert half.dtype == torch.bfloat16 and half[:3].tolist() == [1.5] * 3 and half[3:].abs().sum() == 0


def bytes_counted(rank, world, spec):
    import gradzip
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    x = grad_like(5000, rank, 0)
    payload = len(gradzip.codec.encode(x, spec, gradzip.codec.State(rank=rank, error_feedback=spec != "qsgd")))
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([payload]))
    gradzip.reset_stats()
    dist.all_reduce(x)
    return gradzip.stats(), max(s.item() for s in sizes)


@pytest.mark.parametrize("spec", ["stc:density=0.01", "sign", "qsgd"])
def test_stats_match_the_payload_sizes(spec):
    import gradzip
    world = 4
    for exchange in ("oneshot", "twophase"):
        plan = gradzip.exchange_plan(f"{spec}{',' if ':' in spec else ':'}exchange={exchange}", 5000, world)
        for stats, largest in run_ranks(bytes_counted, world, f"{spec}{',' if ':' in spec else ':'}exchange={exchange}"):
            # Payloads travel in slots of the codec's bound (8-byte size, payload, padding):
            # one-shot sends one to each other rank, two-phase two (a chunk each).
            assert stats["bytes_sent"] == plan[exchange], (stats, plan)
            if exchange == "oneshot":
                assert largest + 8 <= plan["oneshot"] // (world - 1) < largest + 8 + 8 + (5000 // 8 if "stc" in spec else 0)
            assert stats["dense_bytes"] == 2 * (world - 1) * 5000 * 4 // world
            assert stats["calls"] == 1


def per_parameter_loop(rank, world, spec):
    """zero_grad(set_to_none=True) reallocates every gradient: the backend must still give
    each parameter its own residual. Reference: gradzip.Aggregation keyed by name."""
    import gradzip
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    gloo = dist.new_group(backend="gloo")
    reference = gradzip.Aggregation(spec, group=gloo)
    torch.manual_seed(0)
    # Two biases of 20 elements, one after the other's layer: the same size twice in a step.
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Tanh(), torch.nn.Linear(20, 20),
                                torch.nn.Tanh(), torch.nn.Linear(20, 5))
    mismatches = 0
    for step in range(6):
        model.zero_grad(set_to_none=True)
        g = torch.Generator().manual_seed(step * 100 + rank)
        model(torch.randn(16, 10, generator=g)).pow(2).sum().backward()
        expected = {name: p.grad.clone() for name, p in model.named_parameters()}
        for name, grad in expected.items():
            reference._aggregation.allreduce(grad, f"grad:{name}", dist.ReduceOp.AVG,
                                             gloo._get_backend(torch.device("cpu")))
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        for name, p in model.named_parameters():
            mismatches += not torch.equal(p.grad, expected[name])
    return mismatches


@pytest.mark.parametrize("spec", ["topk:density=0.1", "stc:density=0.1", "sign"])
def test_backend_keeps_one_residual_per_parameter(spec):
    assert run_ranks(per_parameter_loop, 2, spec) == [0, 0]


def train_with_hook(rank, world, spec, steps, group_kind, lr=0.05):
    import gradzip
    gradzip.init_process_group("gradzip")
    group = dist.new_group(backend="gloo") if group_kind == "gloo" else dist.group.WORLD
    torch.manual_seed(0)
    teacher = torch.nn.Linear(16, 4)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.002)  # several buckets, rebuilt after step 1
    state = gradzip.hooks.State(spec, process_group=group)
    ddp.register_comm_hook(state, gradzip.hooks.hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step * 31 + rank)
        x = torch.randn(32, 16, generator=g)
        loss = torch.nn.functional.mse_loss(ddp(x), teacher(x).detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return sum(losses[:10]) / 10, sum(losses[-10:]) / 10, state.stats()


@pytest.mark.parametrize("spec", SPECS)
def test_a_small_model_converges_with_every_spec(spec):
    # Majority vote returns ±1 per element, not a gradient's scale: it needs a small step.
    lr = 0.002 if "majority" in spec else 0.05
    for first, last, stats in run_ranks(train_with_hook, 2, spec, 150, "gloo", lr):
        assert last < 0.5 * first, (spec, first, last)


@pytest.mark.parametrize("spec", ["stc:density=0.01", "sign"])
def test_hook_over_the_gradzip_backend_sends_fewer_bytes(spec):
    for first, last, stats in run_ranks(train_with_hook, 2, spec, 30, "gradzip"):
        assert stats["bytes_sent"] * 3 < stats["dense_bytes"], stats


def resume(rank, world, spec):
    import gradzip
    from hook_resume import resumes_bit_exactly
    gradzip.init_process_group("gradzip")
    gloo = dist.new_group(backend="gloo")

    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
        ddp = DDP(model, process_group=gloo, bucket_cap_mb=0.001)
        state = gradzip.hooks.State(spec, process_group=gloo, model=ddp)
        ddp.register_comm_hook(state, gradzip.hooks.hook)
        return model, ddp, state, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    return resumes_bit_exactly(make, lambda step: torch.randn(4, 8, generator=torch.Generator().manual_seed(step * 7 + rank)))


# Per-element codecs; block scales (sign:block>0, QSGD buckets) follow DDP's bucket layout.
# layers=off: this model's parameters are under 1024 elements, which per-parameter
# compression sends exact (its resume: test_layers.py).
@pytest.mark.parametrize("spec", ["topk:density=0.1,layers=off", "stc:density=0.2,layers=off", "sign:block=0,layers=off"])
def test_hook_state_dict_resumes_bit_exactly(spec):
    assert run_ranks(resume, 2, spec) == [True, True]


def test_hook_refuses_gossip_with_a_reason():
    with pytest.raises(ValueError, match="neighbour average"):
        gradzip.hooks.State("gossip:topology=exp")


def test_codec_round_trip_and_errors():
    x = torch.randn(3, 500)
    state = gradzip.codec.State()
    data = gradzip.codec.encode(x, "stc:density=0.02", state)
    assert gradzip.codec.header(data) == {"codec": "stc", "version": 1, "numel": 1500, "finite": True}
    y = gradzip.codec.decode(data, like=x)
    assert y.shape == x.shape and (y != 0).sum() == 30
    assert torch.equal(state.residual, (x.view(-1) - y.view(-1)))
    with pytest.raises(gradzip.PayloadError, match="truncated"):
        gradzip.codec.decode(data[:-3], like=x)
    with pytest.raises(gradzip.PayloadError, match="holds 1500 elements, the output has 10"):
        gradzip.codec.decode(data, like=torch.zeros(10))
    # The spec a process group takes works here too: ef and seed apply, the rest is all-reduce's.
    no_feedback = gradzip.codec.State()
    gradzip.codec.encode(x, "stc:density=0.02,ef=0,min_numel=10", no_feedback)
    assert no_feedback.residual is None and no_feedback.step == 1
    # One ef default at every door: the codec's (on for stc, off for qsgd) unless the
    # spec or the State says otherwise, the spec first.
    for spec, state, keeps in [("qsgd:bits=4", gradzip.codec.State(), False),
                               ("qsgd:bits=4", gradzip.codec.State(error_feedback=True), True),
                               ("qsgd:bits=4,ef=1", gradzip.codec.State(error_feedback=False), True),
                               ("stc:density=0.02", gradzip.codec.State(error_feedback=False), False)]:
        gradzip.codec.encode(x, spec, state)
        assert (state.residual is not None) == keeps, spec
    bound = gradzip.Spec("stc:ef=0,density=0.02")
    assert str(bound) == "stc:density=0.02,ef=0" and bound.codec == "stc:density=0.02"
    assert gradzip.codec.encode(x, bound) == gradzip.codec.encode(x, "stc:density=0.02")
    with pytest.raises(gradzip.SpecError, match="unknown key 'level' for aggregation 'stc'"):
        gradzip.codec.encode(x, "stc:level=1")
    with pytest.raises(gradzip.SpecError, match="aggregation without a codec"):
        gradzip.codec.encode(x, "allreduce")
    with pytest.raises(gradzip.SpecError, match="decentralized gossip, not a codec"):
        gradzip.codec.encode(x, "choco:gamma=0.5")
    with pytest.raises(TypeError, match="floating tensor"):
        gradzip.codec.encode(torch.ones(3, dtype=torch.int64), "topk")
    assert gradzip.codec.decode(gradzip.codec.encode(x.half(), "fp16"), like=x.half()).equal(x.half())


@pytest.mark.parametrize("spec", SPECS)
def test_encode_into_a_kept_buffer_gives_the_same_payload(spec):
    """encode(..., out=buffer) writes the bytes encode() returns into the buffer, leaves the
    same State, and decode() takes the view it returns."""
    buffer = torch.empty(gradzip.codec.max_payload_bytes(spec, 3001), dtype=torch.uint8)
    to_bytes, to_buffer = gradzip.codec.State(seed=4, rank=1), gradzip.codec.State(seed=4, rank=1)
    for step in range(3):
        x = grad_like(3001, 0, step)
        data = gradzip.codec.encode(x, spec, to_bytes)
        view = gradzip.codec.encode(x, spec, to_buffer, out=buffer)
        assert view.dtype == torch.uint8 and view.data_ptr() == buffer.data_ptr()
        assert bytes(view.numpy()) == data, (spec, step)
        assert torch.equal(gradzip.codec.decode(view, like=x), gradzip.codec.decode(data, like=x))
        assert to_buffer.step == to_bytes.step
        assert (to_buffer.residual is None) == (to_bytes.residual is None)
        if to_bytes.residual is not None:
            assert torch.equal(to_buffer.residual, to_bytes.residual)


def test_encode_into_refuses_what_cannot_hold_a_payload():
    x = torch.randn(1000)
    need = gradzip.codec.max_payload_bytes("fp16", 1000)
    assert need == 16 + 2 * 1000
    with pytest.raises(RuntimeError, match=f"may take {need} bytes; `out` holds {need - 1}"):
        gradzip.codec.encode(x, "fp16", out=torch.empty(need - 1, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="contiguous uint8 CPU tensor"):
        gradzip.codec.encode(x, "fp16", out=torch.empty(need, dtype=torch.int32))
    with pytest.raises(TypeError, match="out must be a uint8 tensor"):
        gradzip.codec.encode(x, "fp16", out=bytearray(need))
    with pytest.raises(RuntimeError, match="contiguous uint8 on the CPU"):
        gradzip.codec.decode(torch.zeros(need, dtype=torch.float32), like=x)
    x[3] = float("inf")  # a non-finite step: the header alone, in the buffer too
    view = gradzip.codec.encode(x, "fp16", out=torch.empty(need, dtype=torch.uint8))
    assert view.numel() == 16 and gradzip.codec.decode(view, like=x).isnan().all()


def draws_per_tensor(rank, world, spec):
    """Two equal tensors of equal size in one call: each is drawn for on its own."""
    import gradzip
    gradzip.init_process_group("gloo")
    agg = gradzip.Aggregation(spec)
    first, second = torch.linspace(-1, 1, 4000), torch.linspace(-1, 1, 4000)
    agg([first, second])
    return first, second


@pytest.mark.parametrize("spec", ["randomk:density=0.1,ef=0,exchange=oneshot", "qsgd:bits=2,ef=0,exchange=oneshot"])
def test_equal_tensors_of_one_step_get_their_own_random_draws(spec):
    """Every tensor's seed mixes in its key: random-k picks other positions in a second
    tensor of the same size, and QSGD rounds it independently (the same on every rank)."""
    (first, second), (first_1, second_1) = run_ranks(draws_per_tensor, 2, spec)
    assert torch.equal(first, first_1) and torch.equal(second, second_1)
    assert not torch.equal(first, second)
    if spec.startswith("randomk"):
        overlap = ((first != 0) & (second != 0)).sum().item()
        assert overlap < 0.1 * 0.1 * 4000 * 3, overlap  # independent draws share ~1% of positions
