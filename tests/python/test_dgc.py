"""DGC's two additions to sparsification (Lin et al., 2018), with real ranks: momentum
correction with factor masking (`momentum`) against a reference written from the paper,
and the density warm-up (`density_warmup`) by the bytes of each call."""
import math

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks


def inputs(rank, step, n):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, generator=g)


def momentum_steps(rank, world, spec, n, steps):
    import gradzip
    dist.init_process_group("gloo")
    agg = gradzip.Aggregation(spec)
    results = [agg(inputs(rank, step, n), op="sum") for step in range(steps)]
    return results, agg.state_dict()["tensors"]


def reference_top_k(world, n, steps, density, momentum):
    """u ← m·u + x; v ← v + u; send the k largest |v|; v and u set to 0 where sent."""
    k = math.ceil(density * n)
    velocity = [torch.zeros(n) for _ in range(world)]
    residual = [torch.zeros(n) for _ in range(world)]
    results = []
    for step in range(steps):
        total = torch.zeros(n)
        for r in range(world):
            velocity[r] = velocity[r] * momentum + inputs(r, step, n)
            accumulated = residual[r] + velocity[r]
            sent = torch.zeros(n)
            chosen = accumulated.abs().topk(k).indices
            sent[chosen] = accumulated[chosen]
            total = total + sent
            residual[r] = accumulated - sent
            velocity[r][chosen] = 0
        results.append(total)
    return results, velocity, residual


def test_momentum_correction_matches_the_reference():
    world, n, steps = 2, 1000, 4
    outs = run_ranks(momentum_steps, world, "topk:density=0.05,momentum=0.9,exchange=oneshot", n, steps)
    expected, velocity, residual = reference_top_k(world, n, steps, 0.05, 0.9)
    for rank, (results, state) in enumerate(outs):
        for step in range(steps):
            assert torch.equal(results[step], expected[step]), (rank, step)
        assert torch.equal(state["tensor/velocity"], velocity[rank])
        assert torch.equal(state["tensor/residual"], residual[rank])


def reference_scaled_sign(world, n, steps, block, momentum):
    """u ← m·u + x; v ← e + u; send mean|v| · sign(v) per block; e ← v − sent; u kept
    whole (every element is sent: no masking)."""
    velocity = [torch.zeros(n) for _ in range(world)]
    residual = [torch.zeros(n) for _ in range(world)]
    results = []
    for step in range(steps):
        total = torch.zeros(n, dtype=torch.float64)
        for r in range(world):
            velocity[r] = velocity[r] * momentum + inputs(r, step, n)
            accumulated = (residual[r] + velocity[r]).view(-1, block)
            sent = (accumulated.abs().mean(1, keepdim=True) * accumulated.sign()).view(-1)
            total += sent.double()
            residual[r] = accumulated.view(-1) - sent
        results.append(total)
    return results, velocity, residual


def test_sign_compresses_the_momentum_without_masking():
    """1-bit SGD with momentum: sign's `momentum` keeps the whole velocity."""
    world, n, steps = 2, 1024, 4
    outs = run_ranks(momentum_steps, world, "sign:momentum=0.9,block=64,exchange=oneshot", n, steps)
    expected, velocity, residual = reference_scaled_sign(world, n, steps, 64, 0.9)
    for rank, (results, state) in enumerate(outs):
        for step in range(steps):
            assert torch.allclose(results[step].double(), expected[step], rtol=1e-5, atol=1e-5), (rank, step)
        assert torch.equal(state["tensor/velocity"], velocity[rank])
        assert torch.allclose(state["tensor/residual"], residual[rank], rtol=1e-5, atol=1e-5)


def momentum_pieces_and_resume(rank, world, spec):
    """A bucket of pieces gives the bits of the whole tensor (named as its first piece: its
    random draws are seeded from that name), and a resumed aggregation the bits of one
    that ran straight through."""
    import gradzip
    from gradzip._transport import transport_of
    dist.init_process_group("gloo")
    transport = transport_of(None, torch.device("cpu"))
    whole, pieces = gradzip._C.Aggregation(gradzip.Spec(spec)), gradzip._C.Aggregation(gradzip.Spec(spec))
    same = True
    for step in range(3):
        y, z = inputs(rank, step, 800), inputs(rank, step, 800)
        whole.allreduce(y, "a", dist.ReduceOp.SUM, transport)
        pieces.allreduce_pieces(z, [("a", 300), ("b", 500)], dist.ReduceOp.SUM, transport)
        same &= torch.equal(y, z)
    straight, first = gradzip.Aggregation(spec), gradzip.Aggregation(spec)
    for step in range(5):
        a = straight(inputs(rank, step, 777), op="avg")
        if step < 3:
            first(inputs(rank, step, 777), op="avg")
    resumed = gradzip.Aggregation(spec)
    resumed.load_state_dict(first.state_dict())
    for step in range(3, 5):
        b = resumed(inputs(rank, step, 777), op="avg")
    return same, torch.equal(a, b), "tensor/velocity" in first.state_dict()["tensors"]


@pytest.mark.parametrize("spec", ["stc:density=0.05,momentum=0.9,exchange=twophase",
                                  "randomk:density=0.1,momentum=0.5,ef=1,seed=4"])
def test_momentum_pieces_and_resume(spec):
    for same, resumed, saved in run_ranks(momentum_pieces_and_resume, 3, spec):
        assert same, "pieces differ from the whole"
        assert resumed, "resume differs"
        assert saved, "the velocity is not in the state"


def test_momentum_needs_error_feedback():
    import gradzip
    with pytest.raises(gradzip.SpecError, match="needs ef=1"):
        gradzip.Aggregation("topk:momentum=0.9,ef=0")
    with pytest.raises(gradzip.SpecError, match="needs ef=1"):  # refused where the spec is bound, at every door
        gradzip.Spec("randomk:density=0.1,momentum=0.9")
    with pytest.raises(gradzip.SpecError, match="momentum must be a number in"):
        gradzip.Spec("stc:momentum=1")
    with pytest.raises(gradzip.SpecError, match="needs ef=1"):  # majority vote has no error feedback by default
        gradzip.Spec("sign:vote=majority,momentum=0.9")
    with pytest.raises(gradzip.SpecError, match="unknown key 'momentum'"):
        gradzip.Spec("qsgd:momentum=0.9")


def bytes_per_call(rank, world, spec, n, calls):
    import gradzip
    dist.init_process_group("gloo")
    agg = gradzip.Aggregation(spec)
    sent, results = [], []
    for step in range(calls):
        before = agg.stats()["bytes_sent"]
        results.append(agg(inputs(rank, step, n), op="sum"))
        sent.append(agg.stats()["bytes_sent"] - before)
    return sent, results


def test_density_warmup_sends_its_stages_after_the_exact_warmup():
    import gradzip
    world, n = 2, 4000
    spec = "topk:density=0.01,density_warmup=8,warmup=2,exchange=oneshot"
    outs = run_ranks(bytes_per_call, world, spec, n, 12)
    assert all(torch.equal(a, b) for a, b in zip(outs[0][1], outs[1][1]))
    dense = gradzip.exchange_plan("topk:exchange=oneshot", n, world)["dense"]
    expected = [dense, dense]  # warmup=2: exact
    for call in range(8):  # four stages of two calls: 25%, 6.25%, 1.5625%, then 1% (not below density)
        density = max(0.01, 0.25 / 4 ** (call * 4 // 8))
        expected.append(gradzip.exchange_plan(f"topk:density={density},exchange=oneshot", n, world)["oneshot"])
    expected += [gradzip.exchange_plan("topk:density=0.01,exchange=oneshot", n, world)["oneshot"]] * 2
    for sent, _ in outs:
        assert sent == expected
