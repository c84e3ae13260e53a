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


def top_k(density):
    """DGC's selection: the k largest |v|; u is set to 0 where sent (factor masking)."""
    def compress(v):
        chosen = v.abs().topk(math.ceil(density * v.numel())).indices
        sent = torch.zeros_like(v)
        sent[chosen] = v[chosen]
        return sent, chosen
    return compress


def scaled_sign(block):
    """EF-SignSGD: mean|v| · sign(v) per block; every element sent, u kept whole."""
    def compress(v):
        blocks = v.view(-1, block)
        return (blocks.abs().mean(1, keepdim=True) * blocks.sign()).view(-1), None
    return compress


def reference_momentum(world, n, steps, momentum, compress):
    """u ← m·u + x; v ← e + u; send compress(v); e ← v − sent; u zeroed where masked."""
    velocity = [torch.zeros(n) for _ in range(world)]
    residual = [torch.zeros(n) for _ in range(world)]
    results = []
    for step in range(steps):
        total = torch.zeros(n)
        for r in range(world):
            velocity[r] = velocity[r] * momentum + inputs(r, step, n)
            accumulated = residual[r] + velocity[r]
            sent, masked = compress(accumulated)
            total = total + sent
            residual[r] = accumulated - sent
            if masked is not None:
                velocity[r][masked] = 0
        results.append(total)
    return results, velocity, residual


@pytest.mark.parametrize("spec, compress, tolerance", [
    ("topk:density=0.05,momentum=0.9,exchange=oneshot", top_k(0.05), 0.0),  # momentum correction: bit for bit
    ("sign:momentum=0.9,block=64,exchange=oneshot", scaled_sign(64), 1e-5),  # 1-bit SGD with momentum
])
def test_momentum_matches_the_reference(spec, compress, tolerance):
    world, n, steps = 2, 1024, 4
    outs = run_ranks(momentum_steps, world, spec, n, steps)
    expected, velocity, residual = reference_momentum(world, n, steps, 0.9, compress)
    for rank, (results, state) in enumerate(outs):
        for step in range(steps):
            assert torch.allclose(results[step], expected[step], rtol=tolerance, atol=tolerance), (rank, step)
        assert torch.equal(state["tensor/velocity"], velocity[rank])
        assert torch.allclose(state["tensor/residual"], residual[rank], rtol=tolerance, atol=tolerance)


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


# layers=off: the bucket of pieces compressed as one tensor, as the whole is.
@pytest.mark.parametrize("spec", ["stc:density=0.05,momentum=0.9,exchange=twophase,layers=off",
                                  "randomk:density=0.1,momentum=0.5,ef=1,seed=4,layers=off"])
def test_momentum_pieces_and_resume(spec):
    for same, resumed, saved in run_ranks(momentum_pieces_and_resume, 3, spec):
        assert same, "pieces differ from the whole"
        assert resumed, "resume differs"
        assert saved, "the velocity is not in the state"


def masking_steps(rank, world, spec, layout, steps):
    """Per call: the input, and the velocity and worker residual before and after it, each
    the layout's pieces end to end (a tensor not yet seen: zeros)."""
    import gradzip
    from gradzip._transport import transport_of
    dist.init_process_group("gloo")
    transport = transport_of(None, torch.device("cpu"))
    agg = gradzip._C.Aggregation(gradzip.Spec(spec))
    n = sum(size for _, size in layout)

    def joined(state, what):
        parts = [state[f"{key}/{what}"] for key, _ in layout if f"{key}/{what}" in state]
        return torch.cat(parts) if parts else torch.zeros(n)

    records = []
    for step in range(steps):
        before = agg.state_dict()
        x = inputs(rank, step, n)
        agg.allreduce_pieces(x.clone(), layout, dist.ReduceOp.SUM, transport)
        after = agg.state_dict()
        records.append((x, joined(before, "velocity"), joined(before, "residual"), joined(after, "velocity"),
                        joined(after, "residual")))
    return records


LAYOUT = [("w", 3000), ("bias", 100), ("v", 2011)]


@pytest.mark.parametrize("spec, world, layout", [
    ("topk:density=0.05,momentum=0.9,exchange=oneshot", 2, [("t", 5000)]),
    ("topk:density=0.05,momentum=0.9,exchange=twophase,rounds=3", 3, [("t", 5000)]),
    ("stc:density=0.02,momentum=0.9,layers=on,exchange=oneshot", 2, LAYOUT),
    ("stc:density=0.02,momentum=0.9,layers=on,exchange=twophase,rounds=2", 3, LAYOUT),
    ("stc:density=0.02,momentum=0.9", 3, LAYOUT),  # layers=adapt: each piece at its own density
    ("randomk:density=0.1,momentum=0.5,ef=1,seed=4,exchange=twophase,rounds=2", 2, LAYOUT),
])
def test_the_velocity_is_zeroed_exactly_where_the_encode_sent(spec, world, layout):
    """Factor masking, whatever cuts the tensor (two-phase's chunks and rounds, the pieces
    of a layer-aware spec): after each call the velocity m·u + x is 0 exactly where the
    worker residual no longer holds residual + m·u + x, and kept elsewhere; a piece under
    1024 elements (sent exact, layer-aware) keeps its velocity whole."""
    momentum = 0.5 if spec.startswith("randomk") else 0.9
    layer_aware = "layers=off" not in spec
    small = torch.zeros(sum(size for _, size in layout), dtype=torch.bool)
    offset = 0
    for _, size in layout:
        small[offset:offset + size] = layer_aware and size < 1024
        offset += size
    masked_somewhere = False
    for rank, records in enumerate(run_ranks(masking_steps, world, spec, layout, 4)):
        for step, (x, u0, r0, u1, r1) in enumerate(records):
            u = u0 * momentum + x
            sent = (r1 != r0 + u) & ~small
            expected = torch.where(sent, torch.zeros_like(u), u)
            assert torch.equal(u1, expected), (rank, step, (u1 != expected).nonzero().flatten()[:10].tolist())
            masked_somewhere |= bool(sent.any())
    assert masked_somewhere


def hook_training(rank, world, spec, momentum, fold):
    """Five SGD steps of a small DDP model under the gradzip hook on a Gloo group: the
    optimizer's momentum given to State (fold) or not; the parameters and the hook's spec."""
    import gradzip
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum, weight_decay=1e-4)
    state = gradzip.hooks.State(spec, model=model, optimizer=opt if fold else None)
    model.register_comm_hook(state, gradzip.hooks.hook)
    for step in range(5):
        x = torch.randn(16, 40, generator=torch.Generator().manual_seed(100 * step + rank))
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], str(state.spec), opt.param_groups[0]["momentum"]


@pytest.mark.parametrize("spec, by_hand", [("stc:density=0.05", "stc:density=0.05,momentum=0.9,density_warmup=20"),
                                           ("sign:block=64", "sign:block=64,momentum=0.9")])
def test_the_hook_folds_the_optimizers_momentum_into_momentum_correction(spec, by_hand):
    """State(optimizer=SGD(momentum=0.9)) runs as the spec with momentum=0.9 (and, for a
    sparsifier, the density warm-up of 20 calls) and an optimizer without momentum, bit
    for bit; the optimizer's momentum is 0 after."""
    import gradzip
    folded = run_ranks(hook_training, 2, spec, 0.9, True)
    by_hand_runs = run_ranks(hook_training, 2, by_hand, 0.0, False)
    unfolded = run_ranks(hook_training, 2, spec, 0.9, False)
    for rank in range(2):
        (params, folded_spec, left), (expected, hand_spec, _), (other, _, kept) = \
            folded[rank], by_hand_runs[rank], unfolded[rank]
        assert folded_spec == hand_spec == str(gradzip.Spec(by_hand)) and left == 0.0 and kept == 0.9
        assert all(torch.equal(a, b) for a, b in zip(params, expected))
        assert not all(torch.equal(a, b) for a, b in zip(params, other))  # folding changed the training


def test_what_cannot_be_folded_is_refused_and_what_needs_no_folding_is_left():
    import gradzip
    from gradzip.momentum_folding import fold_optimizer_momentum
    params = list(torch.nn.Linear(3, 2).parameters())
    sgd = lambda **kw: torch.optim.SGD(params, lr=0.1, **kw)  # noqa: E731
    for spec, opt, message in [
            ("topk:density=0.01,momentum=0.9", sgd(momentum=0.9), "would apply momentum twice"),
            ("topk:density=0.01", sgd(momentum=0.9, nesterov=True), "Nesterov"),
            ("stc:density=0.01", sgd(momentum=0.9, dampening=0.1), "dampening"),
            ("stc:density=0.01", torch.optim.SGD([{"params": params[:1], "momentum": 0.9},
                                                  {"params": params[1:], "momentum": 0.5}], lr=0.1),
             r"momenta \[0.5, 0.9\]")]:
        with pytest.raises(ValueError, match=message):
            gradzip.hooks.State(spec, optimizer=opt)
    saved = gradzip.hooks.State("stc:density=0.01", optimizer=sgd(momentum=0.9)).state_dict()
    with pytest.raises(ValueError, match="give State the optimizer before loading the optimizer's state_dict"):
        gradzip.hooks.State("stc:density=0.01", optimizer=sgd(momentum=0.0)).load_state_dict(saved)
    # At the hook: a spec's own density warm-up stays (0: none), the others' is the folded one.
    for spec, folded in [("topk:density=0.01,density_warmup=0", "topk:density=0.01,density_warmup=0,momentum=0.9"),
                         ("randomk:density=0.1,ef=1", "randomk:density=0.1,density_warmup=20,ef=1,momentum=0.9"),
                         ("sign", "sign:momentum=0.9")]:
        assert str(fold_optimizer_momentum(gradzip.Spec(spec), sgd(momentum=0.9), "gradzip.hooks.State", 20)) == folded
    # Without a warm-up to add (the FSDP door), momentum alone.
    assert str(fold_optimizer_momentum(gradzip.Spec("stc"), sgd(momentum=0.9), "gradzip.fsdp.State")) == \
        "stc:momentum=0.9"
    # Left as they are: no momentum key (qsgd, fp16), no error feedback, no momentum, not SGD.
    for spec, opt in [("qsgd:bits=4", sgd(momentum=0.9)), ("fp16", sgd(momentum=0.9)),
                      ("topk:density=0.01,ef=0", sgd(momentum=0.9)), ("stc:density=0.01", sgd()),
                      ("stc:density=0.01", torch.optim.RMSprop(params, momentum=0.9))]:
        assert str(fold_optimizer_momentum(gradzip.Spec(spec), opt, "gradzip.hooks.State")) == spec
        assert opt.param_groups[0]["momentum"] == (0.9 if spec != "stc:density=0.01" or
                                                   isinstance(opt, torch.optim.RMSprop) else 0)


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


def backend_training(rank, world, spec, momentum, fold):
    """Five SGD steps of a small DDP model over a gradzip group of `spec` (the backend door),
    the optimizer's momentum folded in by gradzip.fold_momentum or not; then what
    fold_momentum refuses: a group that already holds state, ranks that fold different
    momenta, a group that is not gradzip's."""
    import gradzip
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum, weight_decay=1e-4)
    folded = gradzip.fold_momentum(opt) if fold else None
    for step in range(5):
        x = torch.randn(16, 40, generator=torch.Generator().manual_seed(100 * step + rank))
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    refusals = []
    again = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for group, optimizer in [(dist.group.WORLD, again),
                             (dist.new_group(backend="gradzip", pg_options=gradzip.Options(aggregation=spec)),
                              torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9 if rank == 0 else 0.5)),
                             (dist.new_group(backend="gloo"), again)]:
        try:
            gradzip.fold_momentum(optimizer, group)
            refusals.append(None)
        except (RuntimeError, ValueError) as error:
            refusals.append((type(error).__name__, str(error)))
    return [p.detach().clone() for p in model.parameters()], str(folded), opt.param_groups[0]["momentum"], \
        again.param_groups[0]["momentum"], refusals


def test_the_backend_folds_the_optimizers_momentum_when_the_script_asks():
    """gradzip.fold_momentum(opt) at the backend runs as the spec with momentum=0.9 and the
    density warm-up, the optimizer without momentum, bit for bit; it refuses a group that
    holds state (the optimizer left untouched), ranks that fold differently, and a Gloo group."""
    import gradzip
    folded = run_ranks(backend_training, 2, "stc:density=0.05", 0.9, True)
    by_hand = run_ranks(backend_training, 2, "stc:density=0.05,momentum=0.9,density_warmup=20", 0.0, False)
    for rank in range(2):
        (params, spec, left, untouched, refusals), (expected, *_) = folded[rank], by_hand[rank]
        assert spec == str(gradzip.Spec("stc:density=0.05,momentum=0.9,density_warmup=20")) and left == 0.0
        assert all(torch.equal(a, b) for a, b in zip(params, expected))
        held, disagree, gloo = refusals
        assert held[0] == "RuntimeError" and "already holds state" in held[1] and untouched == 0.9, held
        assert disagree[0] == "ValueError" and "configured differently" in disagree[1] and \
            "momentum=0.5" in disagree[1] and "momentum=0.9" in disagree[1], disagree
        assert gloo[0] == "ValueError" and "not 'gradzip'" in gloo[1], gloo
