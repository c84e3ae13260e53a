"""The exchanges (one-shot, two-phase, auto) with real ranks: identical bits on every
rank, the float64 sum within codec error, error feedback conserved on both sides, bytes
as the cost model says, bit-exact resume, and per-piece state across bucket layouts."""
import math

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks

SPECS = ["identity", "fp16", "bf16", "sign", "sign:vote=majority", "qsgd:bits=4", "qsgd:bits=8,bucket=64",
         "stc:density=0.05", "topk:density=0.05", "topk:density=0.05,approx=1", "topk:density=0.05,values=fp16",
         "randomk:density=0.2,seed=3"]


def with_key(spec, key):
    return f"{spec}{',' if ':' in spec else ':'}{key}"


def inputs(rank, step, n):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, generator=g)


def reduce_steps(rank, world, spec, exchange, n, steps):
    """Each rank's results, its stats and the float64 sums of the inputs."""
    import gradzip
    dist.init_process_group("gloo")
    agg = gradzip.Aggregation(with_key(spec, f"exchange={exchange}"))
    results, exact = [], []
    for step in range(steps):
        x = inputs(rank, step, n)
        total = torch.zeros(n, dtype=torch.float64)
        for r in range(world):
            total += inputs(r, step, n).double()
        exact.append(total)
        results.append(agg(x.clone(), op="sum"))
    return results, exact, agg.stats(), agg.state_dict()["tensors"]


# How far a codec's sum may be from the float64 sum, relative to its largest entry,
# after two compressions (two-phase) or one.
TOLERANCE = {"identity": 1e-6, "fp16": 3e-3, "bf16": 2e-2, "qsgd:bits=8,bucket=64": 5e-2}


@pytest.mark.parametrize("exchange", ["oneshot", "twophase"])
@pytest.mark.parametrize("spec", SPECS)
def test_every_codec_in_both_exchanges(spec, exchange):
    world, n = 3, 1001
    outs = run_ranks(reduce_steps, world, spec, exchange, n, 2)
    for step in range(2):
        first = outs[0][0][step]
        for results, *_ in outs[1:]:
            assert torch.equal(results[step], first), "ranks differ"
        exact = outs[0][1][step]
        if spec == "sign:vote=majority":  # 3 voters: no ties, both exchanges give the majority
            votes = sum(torch.where(inputs(r, step, n) >= 0, 1.0, -1.0) for r in range(world))
            assert torch.equal(first, votes.sign())
        elif spec in TOLERANCE:
            err = (first.double() - exact).abs().max() / exact.abs().max()
            assert err < TOLERANCE[spec], err
        else:  # lossy: the error is bounded by the signal, and the result correlates with it
            cos = torch.nn.functional.cosine_similarity(first.double(), exact, dim=0)
            assert cos > (0.1 if "density" in spec else 0.3), cos
    import gradzip
    plan = gradzip.exchange_plan(with_key(spec, f"exchange={exchange}"), n, world)
    for _, _, stats, _ in outs:
        assert stats["bytes_sent"] == 2 * plan[exchange]
        assert stats["calls"] == 2


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_tensors_smaller_than_the_world(n):
    """Chunks may be empty: two-phase still agrees with the float64 sum."""
    outs = run_ranks(reduce_steps, 4, "fp16", "twophase", n, 1)
    for results, exact, _, _ in outs:
        assert torch.equal(results[0], outs[0][0][0])
        assert torch.allclose(results[0].double(), exact[0], rtol=3e-3, atol=3e-3)


ROUNDS_OF = {"oneshot": "oneshot_rounds", "twophase": "rounds"}


@pytest.mark.parametrize("exchange", ["oneshot", "twophase"])
@pytest.mark.parametrize("spec", ["identity", "fp16", "bf16", "sign:vote=majority"])
def test_rounds_keep_the_bits_of_element_wise_codecs(spec, exchange):
    """Pipelined rounds cut the vector (one-shot) or every chunk (two-phase) into pieces;
    a codec that codes each element alone gives the same bits in three rounds as in one,
    and sends what the plan says."""
    import gradzip
    world, n = 3, 1001
    one = run_ranks(reduce_steps, world, with_key(spec, "rounds=1"), exchange, n, 2)
    three = run_ranks(reduce_steps, world, with_key(spec, "rounds=3"), exchange, n, 2)
    plan = gradzip.exchange_plan(with_key(spec, f"rounds=3,exchange={exchange}"), n, world)
    assert plan[ROUNDS_OF[exchange]] == 3
    for a, b in zip(one, three):
        for step in range(2):
            assert torch.equal(a[0][step], b[0][step])
        assert b[2]["bytes_sent"] == 2 * plan[exchange]


@pytest.mark.parametrize("exchange", ["oneshot", "twophase"])
@pytest.mark.parametrize("spec", ["stc:density=0.05", "topk:density=0.05", "qsgd:bits=4", "sign",
                                  "randomk:density=0.2,seed=3"])
def test_every_codec_in_rounds(spec, exchange):
    """Codecs that select or scale per block do so per piece: still the same bits on
    every rank, close to the float64 sum, the bytes of the plan."""
    import gradzip
    world, n = 3, 3001
    spec = with_key(spec, "rounds=4")
    outs = run_ranks(reduce_steps, world, spec, exchange, n, 2)
    plan = gradzip.exchange_plan(with_key(spec, f"exchange={exchange}"), n, world)
    assert plan[ROUNDS_OF[exchange]] == 4
    for step in range(2):
        first = outs[0][0][step]
        for results, *_ in outs[1:]:
            assert torch.equal(results[step], first), "ranks differ"
        cos = torch.nn.functional.cosine_similarity(first.double(), outs[0][1][step], dim=0)
        assert cos > (0.1 if "density" in spec else 0.3), cos
    for _, _, stats, _ in outs:
        assert stats["bytes_sent"] == 2 * plan[exchange]


# 3001: pieces too small to sample, the encoder selects; 120000: pieces of 40000, whose
# candidates the pass before the agreement collects (aggregate/residual_selection.h).
@pytest.mark.parametrize("n", [3001, 120000])
def test_oneshot_rounds_select_per_piece(n):
    """One-shot in three rounds: each rank sends the top ⌈density·m⌉ of each of the three
    pieces of its vector (m elements each, as exchange_chunk cuts them), and every rank
    adds them up in rank order: the bits of that reference, computed with torch.topk."""
    world, density = 3, 0.05
    outs = run_ranks(reduce_steps, world, f"topk:density={density},rounds=3", "oneshot", n, 1)
    expected = torch.zeros(n)
    for r in range(world):
        x = inputs(r, 0, n)
        for s in range(3):
            begin, end = s * n // 3, (s + 1) * n // 3
            piece = x[begin:end]
            chosen = piece.abs().topk(math.ceil(density * piece.numel())).indices  # as the codec's k
            expected[begin + chosen] += piece[chosen]
    for results, *_ in outs:
        assert torch.equal(results[0], expected)


def input_pass_runs(rank, world, spec, layout, steps, bad_step):
    """The same steps through two aggregations: one given float32 tensors, which it
    reduces in place (an exact selection then makes u = x + residual, with momentum
    correction from the next velocity, and collects its candidates in the pass that
    checks x), the other the same values in bfloat16 (the inputs are made so: exact),
    which it copies to float32 (the encoder makes u and selects itself). A layout of
    several pieces goes as one bucket of them (the DDP hook's door). Rank 1 spoils step
    bad_step."""
    import gradzip
    from gradzip._transport import transport_of
    dist.init_process_group("gloo")
    transport = transport_of(None, torch.device("cpu"))
    in_place, copied = gradzip._C.Aggregation(gradzip.Spec(spec)), gradzip._C.Aggregation(gradzip.Spec(spec))
    n = sum(size for _, size in layout)

    def reduce(aggregation, x):
        if len(layout) == 1:
            aggregation.allreduce(x, "tensor", dist.ReduceOp.SUM, transport)
        else:
            aggregation.allreduce_pieces(x, layout, dist.ReduceOp.SUM, transport)
        return x

    results = []
    for step in range(steps):
        x = inputs(rank, step, n).bfloat16().float()
        if step == bad_step and rank == 1:
            x[n // 2] = math.inf
        results.append((reduce(in_place, x.clone()), reduce(copied, x.bfloat16())))
    return results, in_place.state_dict(), copied.state_dict()


ONE = [("tensor", 100_000)]
LAYERS = [("w", 60_000), ("bias", 500), ("v", 45_000)]


@pytest.mark.parametrize("spec, layout", [
    ("topk:density=0.01", ONE), ("stc:density=0.02,rounds=3", ONE), ("topk:density=0.003,values=fp16,rounds=2", ONE),
    ("stc:density=0.05,density_warmup=2", ONE), ("stc:density=0.02,momentum=0.9", ONE),
    ("topk:density=0.01,momentum=0.9,rounds=3", ONE), ("topk:density=0.01,layers=on", LAYERS),
    ("stc:density=0.02,layers=adapt,adapt_every=2,momentum=0.9,rounds=2", LAYERS)])
def test_selection_in_the_input_pass_gives_the_encoders_bits(spec, layout):
    """An exact selection over one-shot selects in the pass before the ranks agree on
    finiteness: the same results, residuals and velocities, bit for bit, as the encoder's
    own passes, a refused step (Inf on one rank) included."""
    world, steps, bad_step = 2, 5, 2
    for rank, (results, in_place, copied) in enumerate(run_ranks(input_pass_runs, world, with_key(
            spec, "exchange=oneshot"), layout, steps, bad_step)):
        for step, (a, b) in enumerate(results):
            if step == bad_step:
                assert torch.isnan(a).all() and torch.isnan(b).all(), f"rank {rank}: the spoiled step went through"
            else:
                assert torch.isfinite(a).all() and torch.equal(a.bfloat16(), b), f"rank {rank} step {step}"
        assert in_place.keys() == copied.keys()
        for key in in_place:
            assert torch.equal(in_place[key], copied[key]), f"rank {rank}: {key}"


def residual_totals(world, n, states):
    """Σ over ranks of worker residuals plus every owner residual at its offset."""
    total = torch.zeros(n, dtype=torch.float64)
    for state in states:
        total += state["tensor/residual"].double()
        if "tensor/owner_residual" in state:
            offset = int(state["tensor/owner_offset"])
            owned = state["tensor/owner_residual"].double()
            total[offset:offset + owned.numel()] += owned
    return total


@pytest.mark.parametrize("spec", ["topk:density=0.02", "stc:density=0.05", "sign", "qsgd:bits=2,ef=1",
                                  "stc:density=0.05,rounds=3", "qsgd:bits=2,ef=1,rounds=5"])
@pytest.mark.parametrize("exchange", ["oneshot", "twophase"])
def test_error_feedback_is_conserved_on_both_sides(spec, exchange):
    """What was sent plus what the residuals hold is everything the ranks put in:
    Σ_t result_t + Σ residuals = Σ_t Σ_r x_r,t, with worker and owner residuals (two-phase)
    or worker residuals alone (one-shot)."""
    world, n, steps = 3, 3000, 4
    outs = run_ranks(reduce_steps, world, spec, exchange, n, steps)
    sent = sum(r.double() for r in outs[0][0])
    put_in = sum(outs[0][1])
    states = [o[3] for o in outs]
    if exchange == "twophase":
        assert all("tensor/owner_residual" in s for s in states)
        assert sum(s["tensor/owner_residual"].numel() for s in states) == n
    else:
        assert not any("tensor/owner_residual" in s for s in states)
    held = residual_totals(world, n, states)
    assert held.abs().max() > 0.1  # the residuals hold something
    assert torch.allclose(sent + held, put_in, atol=1e-3), (sent + held - put_in).abs().max()


def resume(rank, world, spec):
    """Five steps straight, against three steps, a state_dict round trip into a new
    Aggregation, then the same two."""
    import gradzip
    dist.init_process_group("gloo")
    straight = gradzip.Aggregation(spec)
    first = gradzip.Aggregation(spec)
    for step in range(5):
        a = straight(inputs(rank, step, 777), op="avg")
        if step < 3:
            first(inputs(rank, step, 777), op="avg")
    saved = first.state_dict()
    resumed = gradzip.Aggregation(spec)
    resumed.load_state_dict(saved)
    for step in range(3, 5):
        b = resumed(inputs(rank, step, 777), op="avg")
    return torch.equal(a, b)


@pytest.mark.parametrize("spec", ["stc:density=0.05,exchange=twophase", "qsgd:bits=4,exchange=twophase,seed=9",
                                  "stc:density=0.05,exchange=twophase,rounds=3"])
def test_two_phase_resumes_bit_exactly(spec):
    assert all(run_ranks(resume, 3, spec))


def pieces_against_whole(rank, world, spec):
    """A bucket of pieces keeps per-piece state that, while the layout stays, gives the
    bits of one tensor keyed as a whole; after the pieces move into another layout, the
    error feedback is still conserved (owner residuals fold into worker residuals)."""
    import gradzip
    from gradzip._transport import transport_of
    dist.init_process_group("gloo")
    transport = transport_of(None, torch.device("cpu"))
    whole, pieces = gradzip._C.Aggregation(gradzip.Spec(spec)), gradzip._C.Aggregation(gradzip.Spec(spec))
    layout = [("a", 300), ("b", 401), ("c", 99)]
    same = True
    sent = torch.zeros(800, dtype=torch.float64)
    put_in = torch.zeros(800, dtype=torch.float64)
    for step in range(3):
        x = inputs(rank, step, 800)
        y, z = x.clone(), x.clone()
        whole.allreduce(y, "whole", dist.ReduceOp.SUM, transport)
        pieces.allreduce_pieces(z, layout, dist.ReduceOp.SUM, transport)
        same &= torch.equal(y, z)
        sent += z.double()
        put_in += sum(inputs(r, step, 800).double() for r in range(world))
    # Another layout: b alone, then c and a in one bucket.
    for step in range(3, 5):
        x = inputs(rank, step, 800)
        a, b, c = x[:300].clone(), x[300:701].clone(), x[701:].clone()
        pieces.allreduce_pieces(b, [("b", 401)], dist.ReduceOp.SUM, transport)
        ca = torch.cat([c, a])
        pieces.allreduce_pieces(ca, [("c", 99), ("a", 300)], dist.ReduceOp.SUM, transport)
        sent += torch.cat([ca[99:], b, ca[:99]]).double()
        put_in += sum(inputs(r, step, 800).double() for r in range(world))
    return same, sent, put_in, pieces.state_dict()


def test_pieces_keep_state_across_bucket_layouts():
    world = 3
    # layers=off: the bucket of pieces compressed as one tensor, as the whole is.
    outs = run_ranks(pieces_against_whole, world, "topk:density=0.05,exchange=twophase,layers=off")
    assert all(o[0] for o in outs)
    held = torch.zeros(800, dtype=torch.float64)
    starts = {"a": 0, "b": 300, "c": 701}
    for *_, state in outs:
        for name, value in state.items():
            key, field = name.split("/")
            if field == "residual":
                held[starts[key]:starts[key] + value.numel()] += value.double()
            elif field == "owner_residual":
                offset = starts[key] + int(state[f"{key}/owner_offset"])
                held[offset:offset + value.numel()] += value.double()
    sent, put_in = outs[0][1], outs[0][2]
    assert torch.allclose(sent + held, put_in, atol=1e-3), (sent + held - put_in).abs().max()


def test_auto_follows_the_cost_model():
    import gradzip
    n = 1 << 20
    assert gradzip.exchange_plan("identity", n, 4)["choice"] == "dense"
    assert gradzip.exchange_plan("fp16", n, 2)["choice"] == "oneshot"
    assert gradzip.exchange_plan("fp16", n, 8)["choice"] == "twophase"
    assert gradzip.exchange_plan("qsgd:bits=4", n, 8)["choice"] == "oneshot"  # lossy: compressed once
    assert gradzip.exchange_plan("sign:exchange=oneshot", n, 8)["choice"] == "oneshot"
    plans = [gradzip.exchange_plan("stc:density=0.01", n, p) for p in (2, 4, 8, 16)]
    # Two-phase: 2(P-1)/P of a whole payload, below two payloads at any P; one-shot: P-1.
    assert all(plan["twophase"] < 2.1 * plans[0]["oneshot"] for plan in plans)
    assert plans[-1]["oneshot"] > 4.9 * plans[1]["oneshot"]    # grows with P
    # A lossy codec never takes two-phase by auto, though it sends fewer bytes from 3 ranks
    # up: its owners would compress the summed chunk again.
    assert [plan["choice"] for plan in plans] == ["oneshot"] * 4
    assert all(plan["twophase"] < plan["oneshot"] for plan in plans[1:])
    for plan in [gradzip.exchange_plan(spec, n, p) for spec in ("fp16", "bf16") for p in (2, 4, 8)]:
        assert plan[plan["choice"]] <= 1.05 * min(plan["dense"], plan["oneshot"], plan["twophase"])
    with pytest.raises(RuntimeError, match="no exchange"):
        gradzip.exchange_plan("gossip", n, 4)
    with pytest.raises(gradzip.SpecError, match="exchange"):
        gradzip.Spec("sign:exchange=ring")


def auto_in_the_backend(rank, world, spec, n):
    import gradzip
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    x = inputs(rank, 0, n)
    gradzip.reset_stats()
    dist.all_reduce(x)
    return gradzip.stats(), x


@pytest.mark.parametrize("world", [2, 4])
def test_the_backend_sends_what_auto_planned(world):
    import gradzip
    spec, n = "fp16", 100_000
    outs = run_ranks(auto_in_the_backend, world, spec, n)
    plan = gradzip.exchange_plan(spec, n, world)
    assert plan["choice"] == ("oneshot" if world == 2 else "twophase")
    for stats, x in outs:
        assert stats["bytes_sent"] == plan[plan["choice"]]
        assert torch.equal(x, outs[0][1])


def shaped_reduce(rank, world):
    import gradzip
    dist.init_process_group("gloo")
    results = {}
    for exchange in ("oneshot", "twophase"):
        agg = gradzip.Aggregation(f"qsgd:bits=8,bucket=64,exchange={exchange}")
        x = inputs(rank, 0, 5 * 7 * 3).reshape(5, 7, 3)
        results[exchange] = agg(x.clone(), op="sum")
    return results


def test_tensors_of_any_shape_in_both_exchanges():
    world = 3
    exact = sum(inputs(r, 0, 5 * 7 * 3).double() for r in range(world)).reshape(5, 7, 3)
    for results in run_ranks(shaped_reduce, world):
        for exchange, got in results.items():
            assert got.shape == (5, 7, 3)
            err = (got.double() - exact).abs().max() / exact.abs().max()
            assert err < TOLERANCE["qsgd:bits=8,bucket=64"], (exchange, err)


def sparse_sum(rank, world, spec):
    """Inputs with disjoint supports, each rank at most k/2 non-zeros spread over the
    whole tensor, summed on a gradzip group with the spec as a user types it."""
    import gradzip
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    n, k = 40000, 400  # density 0.01
    g = torch.Generator().manual_seed(5)
    positions = torch.randperm(n, generator=g)[: world * (k // 2)].view(world, k // 2)
    x = torch.zeros(n)
    x[positions[rank]] = torch.randn(k // 2, generator=torch.Generator().manual_seed(rank)) + 3
    exact = torch.zeros(n, dtype=torch.float64)
    for r in range(world):
        exact[positions[r]] = (torch.randn(k // 2, generator=torch.Generator().manual_seed(r)) + 3).double()
    plan = gradzip._C.exchange_plan(gradzip.Spec(spec), n, world, 4)["choice"]
    dist.all_reduce(x)
    return plan, torch.equal(x.double(), exact)


@pytest.mark.parametrize("spec", ["topk:density=0.01", "topk:density=0.01,ef=0", "randomk:density=0.01,ef=0,seed=1"])
def test_sparse_inputs_sum_exactly_with_the_default_exchange(spec):
    """exchange=auto never re-selects a selection codec's sum: what each rank sends in
    full arrives in full (two-phase's owners would drop most of it, and with error
    feedback send it steps late)."""
    for plan, exact in run_ranks(sparse_sum, 4, spec):
        assert plan == "oneshot", plan
        if spec.startswith("topk"):
            assert exact, "the sum of disjoint sparse inputs lost mass"
