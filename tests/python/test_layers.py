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


def hook_step(rank, world, spec, density):
    import gradzip
    dist.init_process_group("gloo")
    net = model()
    ddp = DDP(net)
    state = gradzip.hooks.State(spec, model=ddp)
    ddp.register_comm_hook(state, gradzip.hooks.hook)
    local = model()  # the same weights, no DDP: this rank's own gradients
    for step in range(2):  # iteration 0 goes exact (DDP rebuilds its buckets), 1 compressed
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(16, 64, generator=g)
        for m in (ddp, local):
            m.zero_grad()
            out = m(x)
            out.pow(2).sum().backward()
        if step == 0:
            continue
        mine = {name: p.grad.detach().clone() for name, p in local.named_parameters()}
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
            exact = sum(x.double() for x in grads) / world
            assert torch.allclose(g.double(), exact, rtol=1e-6, atol=1e-9), name
            assert not residuals[f"{name}/residual"].any(), name
            continue
        k = math.ceil(density * g.numel())
        if codec.startswith("topk"):
            expected = sum(topk(x, density).double() for x in grads) / world
            assert torch.allclose(g.double(), expected, rtol=1e-6, atol=1e-9), name
        # Every rank sent its own k of this parameter, the small second layer included.
        assert 0 < g.count_nonzero() <= world * k, (name, g.count_nonzero().item(), k)
        assert residuals[f"{name}/residual"].count_nonzero() >= g.numel() - k - 1, name


def test_by_default_one_selection_spans_the_bucket():
    world, density = 3, 0.01
    outs = run_ranks(hook_step, world, "topk:density=0.01", density)
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
            exact = sum(ranks[name].double() for ranks in everyone) / world
            assert torch.allclose(g.double(), exact, rtol=1e-5, atol=1e-9), name
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
            assert torch.allclose(g.double(), exact, rtol=1e-5, atol=1e-9), name
        elif spec.startswith("sign"):  # a scale per block within the parameter: closer than 0
            assert (g.double() - exact).norm() < exact.norm(), name
