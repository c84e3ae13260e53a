"""Error feedback under a changing loss scale (torch.amp.GradScaler): residuals are kept
in the units of the scale they were made under and rescaled when it changes. With scales
that are powers of two every step is then exactly the unscaled run's times the scale."""
import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks

SCALES = [1024.0, 512.0, 512.0, 2048.0, 4096.0, 1024.0]
SPECS = ["topk:density=0.05", "stc:density=0.05", "sign", "qsgd:bits=4,ef=1,seed=3",
         "stc:density=0.05,exchange=twophase", "topk:density=0.05,momentum=0.9"]


def inputs(rank, step, n=3001):
    return torch.randn(n, generator=torch.Generator().manual_seed(100 * step + rank))


def through_aggregation(rank, world, spec, told):
    """Per step: the unscaled result times the scale, and the scaled run's result."""
    import gradzip
    dist.init_process_group("gloo")
    plain, scaled = gradzip.Aggregation(spec), gradzip.Aggregation(spec)
    out = []
    for step, scale in enumerate(SCALES):
        a = plain(inputs(rank, step))
        if told:
            scaled.set_loss_scale(scale)
        b = scaled(inputs(rank, step) * scale)
        out.append((a * scale, b))
    saved = scaled.state_dict()
    dist.destroy_process_group()
    return out, saved


@pytest.mark.parametrize("spec", SPECS)
def test_the_aggregation_follows_the_loss_scale(spec):
    for out, saved in run_ranks(through_aggregation, 3, spec, True):
        for step, (expected, got) in enumerate(out):
            assert torch.equal(expected, got), (spec, step)
        assert any(name.endswith("/loss_scale") and float(v) == SCALES[-1] for name, v in saved["tensors"].items())


def test_untold_the_residuals_are_mis_weighted():
    """The control: without set_loss_scale, a step after the scale changed differs."""
    out, _ = run_ranks(through_aggregation, 3, "topk:density=0.05", False)[0]
    assert torch.equal(out[0][0], out[0][1])  # the first step has no residual yet
    assert not all(torch.equal(expected, got) for expected, got in out)


def through_backend(rank, world, spec):
    import gradzip
    dist.init_process_group("gloo")
    options = gradzip.Options(aggregation=spec)
    plain = dist.new_group(backend="gradzip", pg_options=options)
    scaled = dist.new_group(backend="gradzip", pg_options=options)
    same = True
    for step, scale in enumerate(SCALES):
        a, b = inputs(rank, step), inputs(rank, step) * scale
        dist.all_reduce(a, group=plain)
        gradzip.set_loss_scale(scale, group=scaled)
        dist.all_reduce(b, group=scaled)
        same = same and torch.equal(a * scale, b)
    dist.destroy_process_group()
    return same


def test_the_backend_follows_the_loss_scale():
    assert all(run_ranks(through_backend, 3, "stc:density=0.05"))


def train_with_scaler(rank, world, growing, told):
    """DDP with the hook and a GradScaler whose scale doubles every step (growing) or
    stays: the parameters after 6 steps."""
    import gradzip
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1 if growing else 10_000)
    # layers=off: per parameter, this model's parameters (under 1024 elements) would go exact.
    state = gradzip.hooks.State("topk:density=0.1,layers=off", model=model, scaler=scaler if told else None)
    model.register_comm_hook(state, gradzip.hooks.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(6):
        x, y = torch.randn(16, 20, generator=g), torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        scaler.scale(torch.nn.functional.cross_entropy(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
    params = [p.detach().clone() for p in model.parameters()]
    dist.destroy_process_group()
    return params, scaler.get_scale()


def test_the_hook_reads_the_scaler():
    """Told the scaler, a run whose scale doubles every step ends with the parameters of
    a run at a constant scale (powers of two: unscaling is exact); untold, it does not."""
    constant = run_ranks(train_with_scaler, 2, False, True)
    growing = run_ranks(train_with_scaler, 2, True, True)
    untold = run_ranks(train_with_scaler, 2, True, False)
    assert growing[0][1] > constant[0][1]  # the scale did grow
    for c, g, u in zip(constant, growing, untold):
        assert all(torch.equal(a, b) for a, b in zip(c[0], g[0]))
    assert not all(torch.equal(a, b) for a, b in zip(constant[0][0], untold[0][0]))


def test_a_loss_scale_must_be_positive_and_finite():
    import gradzip
    aggregation = gradzip.Aggregation("topk:density=0.1")
    for bad in [0.0, -1.0, float("inf"), float("nan")]:
        with pytest.raises(RuntimeError, match="loss scale must be finite and above 0"):
            aggregation.set_loss_scale(bad)
