"""Layer-aware compression (the spec's `layers=on`) at the DDP hook with model=: a
selection codec selects within each parameter, small parameters go exact; against a
reference that selects each rank's gradient the same way, with real ranks."""
import math

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ranks import run_ranks

SMALL = 1024  # parameters under this many elements go exact (docs/spec.md, `layers`)


def topk(g, density):
    """g with only its ceil(density·n) largest magnitudes kept (no ties in random data)."""
    k = math.ceil(density * g.numel())
    kept = torch.zeros_like(g).view(-1)
    idx = g.view(-1).abs().topk(k).indices
    kept[idx] = g.view(-1)[idx]
    return kept.view_as(g)


def model():
    torch.manual_seed(0)
    # 16384 + 256 and 1024 + 4 elements; the second layer's weight gets gradients 1000
    # times smaller (scaled before DDP sees them).
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    net[2].weight.register_hook(lambda g: g * 1e-3)
    return net


def assert_exact_average(g, grads, name):
    """g is the average of the ranks' `grads` as an fp32 sum gives it: each element within a
    few fp32 roundings of its terms' magnitudes (a compressed piece would be off by the terms
    themselves; cancelling terms leave a small element a large relative error)."""
    world = len(grads)
    exact = sum(x.double() for x in grads) / world
    bound = 4 * 2.0 ** -24 * sum(x.double().abs() for x in grads) / world
    assert ((g.double() - exact).abs() <= bound).all(), (name, float((g.double() - exact).abs().max()))


def hook_step(rank, world, spec, density):
    import gradzip
    dist.init_process_group("gloo")
    net = model()
    ddp = DDP(net)
    state = gradzip.hooks.State(spec, model=ddp)
    names = {id(p): name for name, p in net.named_parameters()}
    mine = {}  # this rank's own gradients, as DDP hands them to the hook

    def recording_hook(state, bucket):
        for p, grad in zip(bucket.parameters(), bucket.gradients()):
            mine[names[id(p)]] = grad.detach().clone()
        return gradzip.hooks.hook(state, bucket)

    ddp.register_comm_hook(state, recording_hook)
    for step in range(2):  # iteration 0 goes exact (DDP rebuilds its buckets), 1 compressed
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(16, 64, generator=g)
        ddp.zero_grad()
        ddp(x).pow(2).sum().backward()
    got = {name: p.grad.detach().clone() for name, p in net.named_parameters()}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    residuals = {k: v for k, v in state.state_dict()["state"].items() if k.endswith("/residual")}
    return got, everyone, residuals, state.stats()


@pytest.mark.parametrize("codec", ["topk:density=0.01,layers=on", "stc:density=0.01,layers=on"])
def test_the_hook_with_a_model_selects_within_each_parameter(codec):
    world, density = 3, 0.01
    outs = run_ranks(hook_step, world, codec, density)
    got = outs[0][0]
    for other, *_ in outs[1:]:
        assert all(torch.equal(got[k], other[k]) for k in got), "ranks differ"
    everyone, residuals = outs[0][1], outs[0][2]
    for name, g in got.items():
        grads = [ranks[name] for ranks in everyone]
        if g.numel() < SMALL:  # exact: the average of the ranks' gradients
            assert_exact_average(g, grads, name)
            assert not residuals[f"{name}/residual"].any(), name
            continue
        k = math.ceil(density * g.numel())
        if codec.startswith("topk"):
            expected = sum(topk(x, density).double() for x in grads) / world
            assert torch.allclose(g.double(), expected, rtol=1e-6, atol=1e-9), name
        # Every rank sent its own k of this parameter, the small second layer included.
        assert 0 < g.count_nonzero() <= world * k, (name, g.count_nonzero().item(), k)
        assert residuals[f"{name}/residual"].count_nonzero() >= g.numel() - k - 1, name


def test_layers_off_spans_the_bucket_with_one_selection():
    world, density = 3, 0.01
    outs = run_ranks(hook_step, world, "topk:density=0.01,layers=off", density)
    got, everyone = outs[0][0], outs[0][1]
    names = list(got)
    flat = [torch.cat([ranks[n].view(-1) for n in names]) for ranks in everyone]
    expected = sum(topk(x, density).double() for x in flat) / world
    assert torch.allclose(torch.cat([got[n].view(-1) for n in names]).double(), expected, rtol=1e-6, atol=1e-9)
    # Across the bucket the small second layer (gradients 1000 times smaller) gets nothing.
    assert got["2.weight"].count_nonzero() == 0


def test_layers_hold_in_the_hierarchical_exchange():
    """4 ranks as 2 nodes of 2: each node's exact sum of a shard is compressed across the
    nodes with the pieces cut to the shard; every rank ends with the same bits."""
    world, density = 4, 0.01
    outs = run_ranks(hook_step, world, "topk:density=0.01,layers=on", density, env={"GRADZIP_NODE_SIZE": "2"})
    got, everyone = outs[0][0], outs[0][1]
    for other, *_ in outs[1:]:
        assert all(torch.equal(got[k], other[k]) for k in got), "ranks differ"
    for name, g in got.items():
        if g.numel() < SMALL:
            assert_exact_average(g, [ranks[name] for ranks in everyone], name)
        else:  # each node sent its own k of each part of this parameter
            assert 0 < g.count_nonzero() <= 2 * (math.ceil(density * g.numel()) + 1), name


@pytest.mark.parametrize("spec", ["sign:layers=on,exchange=twophase", "qsgd:bits=4,layers=on,seed=3,exchange=twophase"])
def test_layers_in_the_two_phase_exchange(spec):
    """Two-phase's chunks and each owner's re-encode take the pieces cut to them (sign's
    blocks within each parameter)."""
    import gradzip
    world = 3
    outs = run_ranks(hook_step, world, spec, 0.0)
    got, everyone, stats = outs[0][0], outs[0][1], outs[0][3]
    for other, *_ in outs[1:]:
        assert all(torch.equal(got[k], other[k]) for k in got), "ranks differ"
    n = sum(g.numel() for g in got.values())
    plan = gradzip.exchange_plan(spec, n, world)
    assert plan["choice"] == "twophase"
    # Two iterations: the first exact (dense ring), the second two-phase: more than the
    # flat codec's (a slot per piece and per chunk, the small pieces in fp32), far below
    # the ring's.
    compressed = stats["bytes_sent"] - plan["dense"]
    assert plan["twophase"] <= compressed < plan["dense"] / 4, stats
    for name, g in got.items():
        exact = sum(ranks[name].double() for ranks in everyone) / world
        if g.numel() < SMALL:
            assert_exact_average(g, [ranks[name] for ranks in everyone], name)
        elif spec.startswith("sign"):  # a scale per block within the parameter: closer than 0
            assert (g.double() - exact).norm() < exact.norm(), name


def three_layers():
    torch.manual_seed(0)
    # Three weights of 8192 elements; the second and third get gradients 1000 times
    # smaller, so the spec's 1% everywhere spends most of its bytes where they matter least.
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 128))
    for layer in (net[2], net[4]):
        layer.weight.register_hook(lambda g: g * 1e-3)
    return net


def chosen_levels(state):
    """Each parameter's level (layers=adapt) in a hook state's state_dict, by name."""
    return {k[:-len("/level")]: int(v) for k, v in state.state_dict()["state"].items() if k.endswith("/level")}


def adapt_step(rank, world, spec):
    """One exact and one compressed iteration of the three-layer model: the compressed
    result, the exact average of the ranks' gradients, the levels, the stats."""
    import gradzip
    dist.init_process_group("gloo")
    net = three_layers()
    ddp = DDP(net)
    state = gradzip.hooks.State(spec, model=ddp)
    ddp.register_comm_hook(state, gradzip.hooks.hook)
    local = three_layers()
    for step in range(2):
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(100 * step + rank))
        for m in (ddp, local):
            m.zero_grad()
            m(x).pow(2).sum().backward()
    got = {name: p.grad.detach().clone() for name, p in net.named_parameters()}
    mine = {name: p.grad.detach().clone() for name, p in local.named_parameters()}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    exact = {name: sum(g[name].double() for g in everyone) / world for name in mine}
    levels = chosen_levels(state)
    return got, exact, levels, state.stats()


def test_adapt_gives_a_layers_bytes_to_the_layer_that_loses_most():
    """layers=adapt: every rank chooses the same levels; the layer whose gradient matters
    gets a denser level than the spec's, the others sparser ones, the bucket sends no
    more than with the spec's density everywhere, and its result is closer to the exact
    average than layers=on's."""
    world = 3
    adapt = run_ranks(adapt_step, world, "topk:density=0.01,layers=adapt")
    uniform = run_ranks(adapt_step, world, "topk:density=0.01,layers=on")
    got, exact, levels, stats = adapt[0]
    for other in adapt[1:]:
        assert all(torch.equal(got[k], other[0][k]) for k in got), "ranks differ"
        assert other[2] == levels
    base = 6  # density 0.01 among 0.01 × 2^-3 .. 2^3 in steps of √2
    assert set(levels) == {"0.weight", "2.weight", "4.weight"}, levels  # the biases go exact
    assert levels["0.weight"] > base and levels["2.weight"] < base and levels["4.weight"] < base, levels
    assert uniform[0][2] == {}
    tables = (world - 1) * 3 * 13 * 8  # each rank's float64 errors of 3 weights at 13 levels, to every other rank
    assert stats["bytes_sent"] <= uniform[0][3]["bytes_sent"] + tables, (stats, uniform[0][3])
    error = sum((got[k].double() - exact[k]).pow(2).sum() for k in got)
    error_uniform = sum((uniform[0][0][k].double() - exact[k]).pow(2).sum() for k in got)
    assert error < 0.9 * error_uniform, (error, error_uniform)


def adapt_resume(rank, world, spec):
    """Per parameter, the levels travel in the hook's state: a resumed job continues bit for bit."""
    import gradzip
    from hook_resume import resumes_bit_exactly
    dist.init_process_group("gloo")

    def make():
        net = three_layers()
        ddp = DDP(net)
        state = gradzip.hooks.State(spec, model=ddp)
        ddp.register_comm_hook(state, gradzip.hooks.hook)
        return net, ddp, state, torch.optim.SGD(net.parameters(), lr=0.05)

    return resumes_bit_exactly(make, lambda step: torch.randn(16, 64, generator=torch.Generator().manual_seed(7 * step + rank)))


@pytest.mark.parametrize("spec", ["stc:density=0.01,layers=adapt,adapt_every=3", "topk:density=0.01", "sign:block=0"])
def test_per_parameter_compression_resumes_bit_exactly(spec):
    assert run_ranks(adapt_resume, 2, spec) == [True, True]


def levels_after_a_residual(rank, world, spec, added):
    """The levels a choice (every call: adapt_every=1) makes on the third iteration of the
    three-layer model (the first is exact, the second compressed), after `added` times a
    random tensor is added to the middle weight's residual through the hook's state_dict;
    and the gradients that iteration returns."""
    import gradzip
    dist.init_process_group("gloo")
    net = three_layers()
    ddp = DDP(net)
    state = gradzip.hooks.State(spec, model=ddp)
    ddp.register_comm_hook(state, gradzip.hooks.hook)

    def step(s):
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(100 * s + rank))
        ddp.zero_grad()
        ddp(x).pow(2).sum().backward()

    step(0)
    step(1)
    saved = state.state_dict()
    residual = saved["state"]["2.weight/residual"]
    saved["state"]["2.weight/residual"] = residual + added * torch.randn(
        residual.shape, generator=torch.Generator().manual_seed(5 + rank))
    state.load_state_dict(saved)
    step(2)
    levels = chosen_levels(state)
    return levels, {name: p.grad.detach().clone() for name, p in net.named_parameters()}


@pytest.mark.parametrize("spec", ["topk:density=0.01,adapt_every=1", "stc:density=0.01,adapt_every=1"])
def test_the_levels_are_chosen_on_what_the_call_adds_not_on_the_residual(spec):
    """A residual that grew under the last choice's levels does not move the next one: a
    layer given more density drains its residual and would look easy, then refill and look
    hard, and the choice would swing between the two (docs/spec.md, "Adaptive")."""
    world = 2
    plain = run_ranks(levels_after_a_residual, world, spec, 0.0)
    grown = run_ranks(levels_after_a_residual, world, spec, 1.0)
    for rank in range(world):
        assert plain[rank][0] == grown[rank][0] and plain[rank][0], (plain[rank][0], grown[rank][0])
        assert plain[rank][0] == plain[0][0]
    # The grown residual was sent: the middle weight's result differs.
    assert not torch.equal(plain[0][1]["2.weight"], grown[0][1]["2.weight"])


def test_by_default_codecs_with_levels_adapt_and_sign_goes_per_parameter():
    """layers=auto (the default): a bare `stc:density=0.01` at the hook with the model
    chooses levels as layers=adapt does, bit for bit; sign compresses per parameter."""
    world = 3
    bare = run_ranks(adapt_step, world, "stc:density=0.01")
    adapt = run_ranks(adapt_step, world, "stc:density=0.01,layers=adapt")
    assert bare[0][2] == adapt[0][2] and bare[0][2], bare[0][2]
    assert all(torch.equal(bare[0][0][k], adapt[0][0][k]) for k in bare[0][0])
    sign = run_ranks(adapt_step, world, "sign")
    sign_on = run_ranks(adapt_step, world, "sign:layers=on")
    assert all(torch.equal(sign[0][0][k], sign_on[0][0][k]) for k in sign[0][0])


def test_a_budget_sets_the_bytes_adapt_chooses_levels_under():
    """`budget` (a fraction of the adapted parameters' fp32 bytes) moves every level: a
    smaller budget sends fewer bytes than the spec's density everywhere, a larger one more
    and closer to the exact average; every rank chooses the same levels."""
    world = 3
    runs = {budget: run_ranks(adapt_step, world, f"topk:density=0.01,layers=adapt{budget}")
            for budget in (",budget=0.002", "", ",budget=0.08")}
    for ranks in runs.values():
        for other in ranks[1:]:
            assert other[2] == ranks[0][2]
            assert all(torch.equal(other[0][k], ranks[0][0][k]) for k in other[0]), "ranks differ"
    small, spec, large = (runs[b][0] for b in (",budget=0.002", "", ",budget=0.08"))
    assert all(small[2][k] <= spec[2][k] <= large[2][k] for k in spec[2]), (small[2], spec[2], large[2])
    assert small[3]["bytes_sent"] < spec[3]["bytes_sent"] < large[3]["bytes_sent"]
    exact = spec[1]

    def error(run):
        return sum((run[0][k].double() - exact[k]).pow(2).sum() for k in exact)

    assert error(large) < error(spec) < error(small)


@pytest.mark.parametrize("spec", ["sign:budget=0.01", "topk:density=0.01,layers=on,budget=0.01"])
def test_a_budget_needs_layers_adapt(spec):
    import gradzip
    with pytest.raises(gradzip.SpecError, match="budget sets the bytes layers=adapt chooses levels under"):
        gradzip.hooks.State(spec)


def test_adapt_needs_a_codec_with_levels():
    import gradzip
    with pytest.raises(gradzip.SpecError, match="layers=adapt chooses each layer's density.*'sign' has neither"):
        gradzip.hooks.State("sign:layers=adapt")
    assert gradzip.hooks.State("qsgd:bits=4,layers=adapt") is not None
