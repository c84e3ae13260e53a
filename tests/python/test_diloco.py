"""DiLoCo's outer loop with real ranks: the outer step against a single-process reference,
identical replicas, a compressed resume that is bit-exact, a diverged rank skipped."""
import copy
import warnings

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks

H, LR, INNER_LR, MOMENTUM = 3, 0.7, 0.05, 0.9


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def inner_steps(model, opt, rank, first, steps):
    for step in range(first, first + steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 5, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x[:, :3])
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world, rounds):
    """DiLoCo in one process, in float64: every rank's inner steps, the mean
    pseudo-gradient, Nesterov's outer step by its formula."""
    start = [p.detach().double() for p in make_model().parameters()]
    buffers = None
    for round_ in range(rounds):
        deltas = []
        for r in range(world):
            model = make_model()
            with torch.no_grad():
                for p, s in zip(model.parameters(), start):
                    p.copy_(s)
            inner_steps(model, torch.optim.SGD(model.parameters(), lr=INNER_LR), r, round_ * H, H)
            deltas.append([s - p.detach().double() for s, p in zip(start, model.parameters())])
        mean = [sum(d[i] for d in deltas) / world for i in range(len(start))]
        buffers = mean if buffers is None else [MOMENTUM * b + m for b, m in zip(buffers, mean)]
        start = [s - LR * (m + MOMENTUM * b) for s, m, b in zip(start, mean, buffers)]
    return start


def diloco_checks(rank, world):
    import gradzip
    dist.init_process_group("gloo")
    # Exact, two outer rounds: the reference's parameters.
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=INNER_LR)
    outer = gradzip.diloco.DiLoCo(model, "allreduce", local_steps=H, outer_lr=LR, outer_momentum=MOMENTUM)
    ran = []
    for step in range(2 * H):
        inner_steps(model, inner, rank, step, 1)
        ran.append(outer.step())
    exact = [p.detach().clone() for p in model.parameters()]

    # Compressed with error feedback: resume after round 2 is bit-exact.
    spec = "qsgd:bits=4,norm=max,ef=1"
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=INNER_LR, momentum=0.5)
    outer = gradzip.diloco.DiLoCo(model, spec, local_steps=H)
    for step in range(2 * H):
        inner_steps(model, inner, rank, step, 1)
        outer.step()
    # DiLoCo's state_dict is a snapshot of its own: not deep-copied here, later steps must
    # not change it (its outer momentum buffers are live tensors in torch's optimizer).
    saved = (*copy.deepcopy((model.state_dict(), inner.state_dict())), outer.state_dict())
    for step in range(2 * H, 4 * H):
        inner_steps(model, inner, rank, step, 1)
        outer.step()
    resumed_model = make_model()
    resumed_inner = torch.optim.SGD(resumed_model.parameters(), lr=INNER_LR, momentum=0.5)
    resumed = gradzip.diloco.DiLoCo(resumed_model, spec, local_steps=H)
    resumed_model.load_state_dict(saved[0])
    resumed_inner.load_state_dict(saved[1])
    resumed.load_state_dict(saved[2])
    for step in range(2 * H, 4 * H):
        inner_steps(resumed_model, resumed_inner, rank, step, 1)
        resumed.step()
    bit_exact = all(torch.equal(a, b) for a, b in zip(model.parameters(), resumed_model.parameters()))
    compressed = [p.detach().clone() for p in model.parameters()]
    sent = outer.stats()

    # A rank that diverges: the outer step is skipped on every rank.
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan") if rank == 1 else 1.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        took = outer.outer_step()
    restored = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    said = any("outer step skipped" in str(w.message) for w in caught)
    return ran, exact, compressed, bit_exact, sent, took, restored, said


def test_diloco_outer_loop():
    world = 2
    outs = run_ranks(diloco_checks, world)
    expected = reference(world, 2)
    for ran, exact, compressed, bit_exact, sent, took, restored, said in outs:
        assert ran == [False, False, True] * 2
        for got, want in zip(exact, expected):
            assert torch.allclose(got.double(), want, atol=1e-6), (got.double() - want).abs().max()
        assert bit_exact
        assert sent["bytes_sent"] < sent["dense_bytes"]  # tiny tensors: headers weigh
        assert not took and restored and said
    for other in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0][1], other[1]))
        assert all(torch.equal(a, b) for a, b in zip(outs[0][2], other[2]))


def test_diloco_refuses_bad_settings():
    import gradzip
    with pytest.raises(ValueError, match="local_steps"):
        gradzip.diloco.DiLoCo(make_model(), local_steps=0)
    with pytest.raises(ValueError, match="decentralized"):
        gradzip.diloco.DiLoCo(make_model(), "gossip")
