"""Steps whose input holds Inf or NaN (mixed precision makes them on purpose and skips
them) leave error feedback as it was, at every door: gradzip.codec with a State, the
Aggregation object, the backend, the DDP hook, and CHOCO's public copies. The result of
such a step is all NaN on every rank, so a GradScaler skips it and training goes on."""
import math

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ranks import run_ranks

# Error feedback, or a codec that could drop a NaN: the ranks agree on finiteness first.
# With momentum correction the host writes the next velocity into a spare in the pass
# that checks the input: a refused step leaves the velocity as it was too.
AGREEING = ["topk:density=0.05", "stc:density=0.05", "sign", "sign:vote=majority", "randomk:density=0.2",
            "qsgd:bits=4,ef=1", "stc:density=0.05,momentum=0.9", "topk:density=0.05,momentum=0.9",
            "sign:momentum=0.9"]
# No state to protect: the codec carries Inf and NaN into the result, as a dense all-reduce does.
CARRYING = ["qsgd:bits=4", "fp16", "bf16"]
STEPS, BAD_STEP, N = 4, 2, 1001


def grad(rank, step, n=N):
    return torch.randn(n, generator=torch.Generator().manual_seed(100 * step + rank))


def spoiled(x, value):
    y = x.clone()
    y[x.numel() // 3] = value
    return y


def with_key(spec, key):
    return f"{spec}{',' if ':' in spec else ':'}{key}"


@pytest.mark.parametrize("spec", ["topk:density=0.05", "stc:density=0.05", "sign", "qsgd:bits=4"])
def test_codec_door_sends_a_non_finite_payload_and_keeps_the_state(spec):
    import gradzip
    skipped, clean = gradzip.codec.State(seed=3, error_feedback=True), gradzip.codec.State(seed=3, error_feedback=True)
    for step in range(STEPS):
        x = torch.randn(N, generator=torch.Generator().manual_seed(step))
        if step == BAD_STEP:
            residual, at = skipped.residual.clone(), skipped.step
            data = gradzip.codec.encode(spoiled(x, math.inf), spec, skipped)
            assert gradzip.codec.header(data) == {"codec": spec.split(":")[0], "version": 1, "numel": N,
                                                  "finite": False}
            assert len(data) == 16
            assert torch.isnan(gradzip.codec.decode(data, like=x)).all()
            assert torch.equal(skipped.residual, residual) and skipped.step == at
            continue
        a = gradzip.codec.encode(x, spec, skipped)
        b = gradzip.codec.encode(x, spec, clean)
        assert a == b, f"step {step}: the skipped step changed what was sent"
        assert gradzip.codec.header(a)["finite"]
    assert torch.equal(skipped.residual, clean.residual)


def aggregation_runs(rank, world, spec, bad_rank, value):
    """Two aggregations over the same steps, one of them also given a spoiled step."""
    import gradzip
    dist.init_process_group("gloo")
    skipped, clean = gradzip.Aggregation(spec), gradzip.Aggregation(spec)
    bad_result, skipped_out, clean_out = None, [], []
    for step in range(STEPS):
        x = grad(rank, step)
        if step == BAD_STEP:
            bad_result = skipped(spoiled(x, value) if rank == bad_rank else x.clone(), op="sum")
        skipped_out.append(skipped(x.clone(), op="sum"))
        clean_out.append(clean(x.clone(), op="sum"))
    return bad_result, skipped_out, clean_out, skipped.state_dict(), clean.state_dict()


@pytest.mark.parametrize("exchange", ["oneshot", "twophase"])
@pytest.mark.parametrize("spec", AGREEING)
def test_aggregation_returns_nan_everywhere_and_keeps_its_state(spec, exchange):
    world = 3
    value = math.nan if spec.startswith("sign") else -math.inf
    outs = run_ranks(aggregation_runs, world, with_key(spec, f"exchange={exchange}"), 1, value)
    for rank, (bad, skipped, clean, skipped_state, clean_state) in enumerate(outs):
        assert torch.isnan(bad).all(), f"rank {rank}: the spoiled step's result is not all NaN"
        for step, (a, b) in enumerate(zip(skipped, clean)):
            assert torch.isfinite(a).all(), f"rank {rank} step {step}: poisoned"
            assert torch.equal(a, b), f"rank {rank} step {step}: the spoiled step changed later results"
        assert skipped_state["tensors"].keys() == clean_state["tensors"].keys()
        for key in skipped_state["tensors"]:
            assert torch.equal(skipped_state["tensors"][key], clean_state["tensors"][key]), key


@pytest.mark.parametrize("exchange", ["oneshot", "twophase"])
@pytest.mark.parametrize("spec", CARRYING)
def test_codecs_without_state_carry_inf_and_nan_into_the_result(spec, exchange):
    world = 3
    outs = run_ranks(aggregation_runs, world, with_key(spec, f"exchange={exchange}"), 1, math.inf)
    bad = outs[0][0]
    assert not torch.isfinite(bad).all(), "the non-finite input vanished"
    for rank, (bad_here, skipped, *_) in enumerate(outs):
        assert torch.equal(bad_here.view(torch.int32), bad.view(torch.int32)), f"rank {rank} differs"
        assert all(torch.isfinite(r).all() for r in skipped), f"rank {rank}: a later step is not finite"


def backend_runs(rank, world, spec, validate, dtype, n):
    import gradzip
    gradzip.init_process_group("gloo")
    options = gradzip.Options(aggregation=spec, validate=validate)
    skipped = dist.new_group(backend="gradzip", pg_options=options)
    clean = dist.new_group(backend="gradzip", pg_options=options)
    results = []
    for step in range(STEPS):
        x = grad(rank, step, n).to(dtype)
        if step == BAD_STEP:
            y = spoiled(x, math.inf) if rank == 0 else x.clone()
            dist.all_reduce(y, group=skipped)  # asynchronous on the CPU: wait() is implied by the read
            assert torch.isnan(y).all()
        a, b = x.clone(), x.clone()
        dist.all_reduce(a, group=skipped)
        dist.all_reduce(b, group=clean)
        results.append((a, b))
    return results


# validate=True: the collective check carries each rank's finiteness flag (one exchange),
# but for a large float32 tensor whose aggregation checks it in a pass of its own before
# the agreement (an exact selection over one-shot, momentum correction): that one agrees
# in an all-reduce of its own, as with validate=False.
BIG = 1 << 20


@pytest.mark.parametrize("spec, validate, dtype, n", [
    ("stc:density=0.05,exchange=twophase", True, torch.float32, N),
    ("topk:density=0.05,exchange=oneshot", True, torch.float32, N),
    ("topk:density=0.01,exchange=oneshot", True, torch.float32, BIG),
    ("stc:density=0.01,momentum=0.9", True, torch.float32, BIG),
    ("sign:exchange=twophase", True, torch.float32, N),
    ("stc:density=0.05,exchange=twophase", False, torch.float32, N),
    ("topk:density=0.05,exchange=oneshot", True, torch.bfloat16, N),
    ("qsgd:bits=4,ef=1", False, torch.float16, N)])
def test_backend_all_reduce_skips_the_step_for_error_feedback(spec, validate, dtype, n):
    for rank_results in run_ranks(backend_runs, 2, spec, validate, dtype, n):
        for step, (a, b) in enumerate(rank_results):
            assert torch.isfinite(a).all() and torch.equal(a, b), f"step {step}"


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 20, generator=g), torch.randint(0, 4, (16,), generator=g)


def hook_runs(rank, world, spec):
    """DDP with the hook twice: once with a step whose loss is Inf on rank 1 (skipped, as
    GradScaler would), once without that step. Same parameters and hook state after."""
    import gradzip
    dist.init_process_group("gloo")
    out = []
    for spoil in (True, False):
        torch.manual_seed(0)
        model = DDP(mlp(), bucket_cap_mb=0.001)
        state = gradzip.hooks.State(spec)
        model.register_comm_hook(state, gradzip.hooks.hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(STEPS + 1):
            if step == BAD_STEP and not spoil:
                continue
            x, y = batch(rank, step)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if step == BAD_STEP and rank == 1:
                loss = loss * math.inf
            loss.backward()
            finite = all(torch.isfinite(p.grad).all() for p in model.parameters())
            assert finite == (step != BAD_STEP), f"step {step}: finite gradients {finite}"
            if finite:
                opt.step()
        out.append(([p.detach().clone() for p in model.parameters()], state.state_dict()))
    return out


def test_ddp_hook_skipped_step_leaves_parameters_and_residuals_as_without_it():
    for (params_a, state_a), (params_b, state_b) in run_ranks(hook_runs, 2, "stc:density=0.1"):
        for p, q in zip(params_a, params_b):
            assert torch.equal(p, q)
        assert state_a["iteration"] == state_b["iteration"] + 1  # DDP did run the skipped iteration
        assert state_a["state"].keys() == state_b["state"].keys()
        for key in state_a["state"]:
            assert torch.equal(state_a["state"][key], state_b["state"][key]), key


def grad_scaler_run(rank, world, spec):
    """A real GradScaler: rank 0's loss overflows at one step; the step is skipped on every
    rank, the scale drops, and training goes on with finite updates."""
    import gradzip
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    torch.manual_seed(0)
    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000)
    x, y = batch(rank, 0)
    losses, skipped = [], []
    for step in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        scaled = scaler.scale(loss)
        if step == 5 and rank == 0:
            scaled = scaled * 1e38 * 1e38  # overflows to Inf, as a too-large loss scale would
        before = [p.detach().clone() for p in model.parameters()]
        scaled.backward()
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        moved = any(not torch.equal(p, q) for p, q in zip(model.parameters(), before))
        skipped.append(not moved)
        losses.append(loss.item())
        assert scaler.get_scale() == (scale / 2 if step == 5 else scale), f"step {step}"
    return losses, skipped, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("spec", ["stc:density=0.1", "sign:exchange=twophase"])
def test_grad_scaler_skips_the_overflow_step_and_recovers(spec):
    outs = run_ranks(grad_scaler_run, 2, spec)
    for losses, skipped, params in outs:
        assert skipped == [step == 5 for step in range(30)]
        assert all(math.isfinite(v) for v in losses)
        assert losses[-1] < 0.8 * losses[6], losses
        assert all(torch.isfinite(p).all() for p in params)
    for p, q in zip(outs[0][2], outs[1][2]):
        assert torch.equal(p, q)


def choco_runs(rank, world, spec):
    import gradzip
    dist.init_process_group("gloo")
    agg = gradzip.Aggregation(spec)
    results, states = [], []
    for step in range(STEPS):
        x = grad(rank, 0) + step
        if step == BAD_STEP and rank == 2:
            x = spoiled(x, math.nan)
        results.append(agg(x, op="avg"))
        states.append({k: v.clone() for k, v in agg.state_dict()["tensors"].items()})
    return results, states


def test_choco_keeps_every_copy_of_a_non_finite_rank():
    world = 4  # a ring: rank 2's neighbours are 1 and 3
    outs = run_ranks(choco_runs, world, "choco:topology=ring,compress=sign,block=64,gamma=0.5")
    for rank, (results, _) in enumerate(outs):
        for step, r in enumerate(results):
            poisoned = step == BAD_STEP and rank in (1, 2, 3)
            assert torch.isnan(r).all() if poisoned else torch.isfinite(r).all(), f"rank {rank} step {step}"
    copy_of_2 = [k for k in outs[2][1][0] if k.endswith("public_copy_2")][0]
    for holder in (1, 2, 3):
        states = outs[holder][1]
        assert torch.equal(states[BAD_STEP][copy_of_2], states[BAD_STEP - 1][copy_of_2]), holder
        for step in range(STEPS):  # every holder's copy of rank 2 is the same
            assert torch.equal(states[step][copy_of_2], outs[2][1][step][copy_of_2]), (holder, step)
    for holder in (1, 3):  # rank 2's own copy moved on after the spoiled step
        assert not torch.equal(outs[holder][1][-1][copy_of_2], outs[holder][1][BAD_STEP][copy_of_2])


def gossip_run(rank, world):
    import gradzip
    dist.init_process_group("gloo")
    agg = gradzip.Aggregation("gossip:topology=ring")
    x = grad(rank, 0)
    if rank == 2:
        x = spoiled(x, math.inf)
    return agg(x, op="avg"), agg(grad(rank, 1), op="avg")


def test_gossip_passes_non_finite_values_to_neighbours_only_and_recovers():
    outs = run_ranks(gossip_run, 4)
    for rank, (spoiled_step, next_step) in enumerate(outs):
        assert torch.isfinite(spoiled_step).all() == (rank == 0), rank
        assert torch.isfinite(next_step).all(), rank
