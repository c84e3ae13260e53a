"""Decentralized aggregations (gossip, choco) with real ranks: exact averaging on the
one-peer graph, conservation of the sum, consensus at the rate the spectral gap
predicts, CHOCO's compressed consensus, determinism, state, and errors."""
import math

import pytest
import torch
import torch.distributed as dist

import gradzip
from ranks import run_ranks


def initial(rank, numel=257, dtype=torch.float64, salt=0):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randn(numel, generator=g, dtype=torch.float64).to(dtype)


def all_initial(world, **kw):
    return torch.stack([initial(r, **kw).double() for r in range(world)])


def gossip_steps(rank, world, specs, steps, dtypes=(torch.float64,), salt=0, through_backend=False):
    """Runs `steps` gossip steps of one tensor per (spec, dtype); returns {(spec, dtype):
    the value after each step}."""
    if through_backend:
        gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=specs[0]))
    else:
        dist.init_process_group("gloo")
    out = {}
    for spec in specs:
        for dtype in dtypes:
            if through_backend:
                reduce = lambda x: dist.all_reduce(x, op=dist.ReduceOp.AVG)  # noqa: E731
            else:
                reduce = gradzip.Aggregation(spec)
            x = initial(rank, dtype=dtype, salt=salt)
            history = [x.clone()]
            for _ in range(steps):
                reduce(x)
                history.append(x.clone())
            out[spec, dtype] = torch.stack(history)
    return out


@pytest.mark.parametrize("world", [4, 8])
def test_onepeer_reaches_the_exact_average_in_log2_n_steps(world):
    steps = int(math.log2(world))
    spec = "gossip:topology=onepeer"
    out = run_ranks(gossip_steps, world, [spec], steps, (torch.float64, torch.float32))
    for dtype, tolerance in [(torch.float64, 1e-14), (torch.float32, 1e-6)]:
        mean = all_initial(world, dtype=dtype).mean(0)
        final = [o[spec, dtype][-1] for o in out]
        for r in range(world):
            assert torch.equal(final[r], final[0]), f"rank {r} differs from rank 0 ({dtype})"
            torch.testing.assert_close(final[r].double(), mean, rtol=0, atol=tolerance)
        # One step short of log2 n, the ranks still disagree.
        assert not torch.equal(out[0][spec, dtype][-2], out[world - 1][spec, dtype][-2])


def test_a_step_is_the_mixing_matrix_and_conserves_the_sum():
    world = 4
    topologies = ["ring", "torus", "exp", "complete"]
    specs = [f"gossip:topology={t}" for t in topologies]
    out = run_ranks(gossip_steps, world, specs, 3, (torch.float64,), 1)
    backend = run_ranks(gossip_steps, world, specs[:1], 3, (torch.float64,), 1, True)
    for topology, spec in zip(topologies, specs):
        w = gradzip.Topology(topology, world).mixing_matrix()
        expected = all_initial(world, salt=1)
        for step in range(1, 4):
            expected = w @ expected
            got = torch.stack([o[spec, torch.float64][step] for o in out])
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
            torch.testing.assert_close(got.sum(0), all_initial(world, salt=1).sum(0), rtol=0, atol=1e-11)
    for rank in range(world):  # all_reduce on a gradzip group configured for gossip: the same
        assert torch.equal(backend[rank][specs[0], torch.float64], out[rank][specs[0], torch.float64])


def test_consensus_error_respects_the_spectral_gap_bound():
    world, steps = 8, 12
    topologies = ["ring", "torus", "exp"]
    specs = [f"gossip:topology={t}" for t in topologies]
    out = run_ranks(gossip_steps, world, specs, steps, (torch.float64,), 2)
    for topology, spec in zip(topologies, specs):
        x = torch.stack([o[spec, torch.float64] for o in out], dim=1)  # step, rank, element
        distance = (x - x.mean(dim=1, keepdim=True)).norm(dim=(1, 2))
        rho = gradzip.Topology(topology, world).consensus_rate()
        for t in range(steps + 1):
            assert distance[t] <= rho ** t * distance[0] * (1 + 1e-9), (topology, t)
        # The bound is tight: random initial values contract at nearly rho per step.
        measured = (distance[steps] / distance[steps - 4]).item() ** 0.25
        assert measured > 0.8 * rho, (topology, measured, rho)


def choco_run(rank, world, spec, steps):
    dist.init_process_group("gloo")
    results = []
    for one in spec.split("|"):
        agg = gradzip.Aggregation(one)
        x = initial(rank, numel=2000, dtype=torch.float32, salt=3)
        history = [x.clone()]
        for _ in range(steps):
            agg(x)
            history.append(x.clone())
        results.append(torch.stack(history))
    return torch.stack(results) if len(results) > 1 else results[0], agg.stats()


@pytest.mark.parametrize("spec,steps", [("choco:topology=ring,compress=sign,block=64,gamma=0.8", 200),
                                        ("choco:topology=ring,compress=topk,density=0.1,gamma=0.05", 200)])
def test_choco_reaches_consensus_and_conserves_the_mean(spec, steps):
    world = 4
    out = run_ranks(choco_run, world, spec, steps)
    x = torch.stack([o[0] for o in out], dim=1).double()  # step, rank, element
    distance = (x - x.mean(dim=1, keepdim=True)).norm(dim=(1, 2))
    assert distance[-1] < 5e-3 * distance[0], (spec, distance[-1] / distance[0])
    torch.testing.assert_close(x[-1].mean(0), x[0].mean(0), rtol=0, atol=1e-4)
    stats = out[0][1]
    assert stats["calls"] == steps
    assert 0 < stats["bytes_sent"] < stats["dense_bytes"]


def test_results_are_identical_from_run_to_run():
    specs = "gossip:topology=exp|choco:topology=ring,compress=topk,density=0.05,gamma=0.2"
    first = run_ranks(choco_run, 4, specs, 5)
    second = run_ranks(choco_run, 4, specs, 5)
    for a, b in zip(first, second):
        assert torch.equal(a[0], b[0])


def choco_resume(rank, world):
    dist.init_process_group("gloo")
    spec = "choco:topology=ring,compress=topk,density=0.05,gamma=0.3"
    model = torch.nn.Linear(30, 20)
    with torch.no_grad():
        model.weight.copy_(initial(rank, 600).view(20, 30))
        model.bias.copy_(initial(rank, 20, salt=1))
    agg = gradzip.Aggregation(spec)
    for _ in range(3):
        agg(model)
    saved = ({k: v.clone() for k, v in model.state_dict().items()}, agg.state_dict())
    for _ in range(3):
        agg(model)
    uninterrupted = torch.cat([p.detach().flatten() for p in model.parameters()])
    resumed_agg = gradzip.Aggregation(spec)
    resumed_agg.load_state_dict(saved[1])
    model.load_state_dict(saved[0])
    for _ in range(3):
        resumed_agg(model)
    resumed = torch.cat([p.detach().flatten() for p in model.parameters()])
    prefix = "model:weight/public_copy_"
    copies = [int(name[len(prefix):]) for name in saved[1]["tensors"] if name.startswith(prefix)]
    return torch.equal(uninterrupted, resumed), sorted(copies)


def test_choco_state_resumes_exactly():
    out = run_ranks(choco_resume, 4, timeout=120)
    for rank, (equal, copies) in enumerate(out):
        assert equal, f"rank {rank}: a resumed run differs from an uninterrupted one"
        assert copies == sorted({rank, (rank + 1) % 4, (rank - 1) % 4})


def backend_ops(rank, world):
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation="gossip:topology=ring"))
    x = initial(rank, 10)
    average = x.clone()
    dist.all_reduce(average, op=dist.ReduceOp.AVG)
    total = x.clone()
    dist.all_reduce(total)  # SUM: size x the neighbour average
    counts = torch.tensor([rank + 1])
    dist.all_reduce(counts)  # integers: exact
    largest = x.clone()
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)  # MAX: exact
    return average, total, counts, largest, gradzip.stats()


def test_backend_all_reduce_returns_the_neighbour_average():
    world = 4
    out = run_ranks(backend_ops, world)
    w = gradzip.Topology("ring", world).mixing_matrix()
    expected = w @ torch.stack([initial(r, 10) for r in range(world)])
    for rank, (average, total, counts, largest, stats) in enumerate(out):
        torch.testing.assert_close(average, expected[rank], rtol=0, atol=1e-12)
        torch.testing.assert_close(total, world * expected[rank], rtol=0, atol=1e-12)
        assert counts.item() == 10
        torch.testing.assert_close(largest, torch.stack([initial(r, 10) for r in range(world)]).max(0).values)
        # Two neighbours, 80 bytes each plus a 32-byte header, for both float calls.
        assert stats["bytes_sent"] >= 2 * 2 * (80 + 32)


def mismatched(rank, world):
    dist.init_process_group("gloo")
    agg = gradzip.Aggregation("gossip:topology=ring")
    x = torch.zeros(10 if rank != 1 else 12)
    try:
        agg(x)
    except RuntimeError as e:
        return str(e)
    return None


def test_mismatched_sizes_are_an_error_naming_both_ranks():
    out = run_ranks(mismatched, 4, timeout=120)
    for rank in (0, 2):  # rank 1's neighbours
        assert out[rank] is not None and f"rank {rank} has 10 elements" in out[rank], out[rank]
        assert "rank 1 has 12 elements" in out[rank], out[rank]
    assert "rank 1 has 12 elements" in out[1]
    assert out[3] is None  # not a neighbour of rank 1: its gossip went through


def test_unsupported_graphs_and_specs_are_clear_errors():
    with pytest.raises(ValueError, match="power-of-two"):
        gradzip.Topology("onepeer", 6)
    with pytest.raises(ValueError, match="choco needs gamma"):
        gradzip.Aggregation("choco:compress=sign")
    with pytest.raises(ValueError, match="neighbour average"):
        gradzip.hooks.State("gossip:topology=exp")
    with pytest.raises(ValueError, match="does not list 0"):
        gradzip.Topology.from_neighbour_lists({0: [1], 1: []})
    t = gradzip.Topology.from_neighbour_lists({0: [1, 2], 1: [0], 2: [0]})
    assert [r for r, _ in t.neighbours(0)] == [1, 2]


def choco_with_its_own_spec(rank, world, specs):
    """Each rank runs choco with its own spec, specs[rank]; returns the error it raised. The
    C++ aggregation is driven directly: gradzip.Aggregation would refuse the ranks' specs
    before any payload moves (test_errors.py), and these are the checks behind that one."""
    dist.init_process_group("gloo")
    aggregation = gradzip._C.Aggregation(gradzip.Spec(specs[rank]))
    transport = dist.group.WORLD._get_backend(torch.device("cpu"))
    try:
        aggregation.allreduce(torch.randn(4096, generator=torch.Generator().manual_seed(rank)), "tensor",
                              dist.ReduceOp.AVG, transport)
    except RuntimeError as e:
        return str(e)
    return None


def test_a_payload_the_codec_cannot_decode_is_an_error_naming_its_rank():
    # fp16 against bf16: payloads of one size, each decoded by a codec that did not write it.
    out = run_ranks(choco_with_its_own_spec, 2, [f"choco:topology=ring,compress={codec},gamma=0.5"
                                                 for codec in ("fp16", "bf16")], timeout=120)
    for rank, (codec, other) in enumerate([("fp16", "bf16"), ("bf16", "fp16")]):
        assert out[rank] == (f"gradzip: the choco payload of rank {1 - rank} for the tensor keyed 'tensor' cannot be "
                             f"decoded: gradzip: invalid {codec} payload: a {other} payload given to the {codec} "
                             "decoder"), out[rank]


def test_a_message_too_large_for_its_receiver_is_refused_by_both_ends_naming_the_sizes():
    # Top-k at 10% against 1%: rank 0's message is larger than anything rank 1 accepts. Both
    # ranks judge both messages from the two headers, so the sender raises too, in gradzip's
    # words, instead of waiting for bytes its peer will not send.
    out = run_ranks(choco_with_its_own_spec, 2, [f"choco:topology=ring,compress=topk,density={density},gamma=0.5"
                                                 for density in (0.1, 0.01)], timeout=120)
    accepts = gradzip.codec.max_payload_bytes("topk:density=0.01", 4096)
    assert out[0].startswith("gradzip: rank 0's message of "), out[0]
    assert out[0].endswith(f"bytes for the tensor keyed 'tensor' is more than rank 1 accepts ({accepts}); rank 1 "
                           "refuses it (every rank must gossip with the same spec)"), out[0]
    assert out[1].startswith("gradzip: rank 0 announced a message of "), out[1]
    assert out[1].endswith(f"bytes for the tensor keyed 'tensor', where rank 1 accepts at most {accepts} "
                           "(every rank must gossip with the same spec)"), out[1]
