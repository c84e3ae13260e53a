"""The hierarchical exchange: exact inside each node, compressed across the nodes
(aggregate/exchange.h). One machine plays several nodes with GRADZIP_NODE_SIZE; the
node layout from host names is tested without ranks."""
import logging

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks

CODEC_SPECS = ["identity", "fp16", "bf16", "topk:density=0.01", "topk:density=0.02,values=fp16",
               "stc:density=0.01", "randomk:density=0.05,seed=3", "sign", "qsgd:bits=4,seed=5", "uniform:threshold=0",
               "sz:mode=abs,bound=1e-3", "zfp:mode=abs,bound=1e-3", "polar:block=256",
               "topk:density=0.01,exchange=twophase", "qsgd:bits=4,exchange=oneshot", "stc:density=0.05,rounds=3"]


def inputs(rank, step, n):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, generator=g)


def world_inputs(world, step, n):
    return sum(inputs(r, step, n).double() for r in range(world))


def all_reduce_steps(rank, world, spec, sizes, steps):
    """Per size and step, this rank's result; the group's node levels; its state."""
    import gradzip
    dist.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    levels = backend.node_levels("cpu")
    results = {}
    for n in sizes:
        for step in range(steps):
            x = inputs(rank, step, n)
            dist.all_reduce(x)
            results[(n, step)] = x
    state = backend.state_dict()
    dist.destroy_process_group()
    shape = None if levels is None else (levels[0].size(), levels[1].size(), levels[0].rank(), levels[1].rank())
    return results, shape, state


def residuals_held(world, n, states, key):
    """Σ over ranks of every worker and owner residual of one tensor, in float64."""
    total = torch.zeros(n, dtype=torch.float64)
    for state in states:
        if f"{key}/residual" in state:
            total += state[f"{key}/residual"].double()
        if f"{key}/owner_residual" in state:
            offset = int(state[f"{key}/owner_offset"])
            owned = state[f"{key}/owner_residual"].double()
            total[offset:offset + owned.numel()] += owned
    return total


@pytest.mark.parametrize("shared", ["1", "0"])
@pytest.mark.parametrize("world,node_size", [(4, 2), (6, 2), (6, 3)])
def test_every_layout_sums_exactly_inside_and_across(world, node_size, shared):
    """identity through the hierarchical exchange, its node stages in shared memory and
    over Gloo: the float64 sum within fp32 rounding, the same bits on every rank, at
    sizes that split unevenly into shards (and shards shorter than the nodes), the levels
    the layout asks for."""
    sizes = [1, 3, 5, 100003]
    outs = run_ranks(all_reduce_steps, world, "identity", sizes, 1,
                     env={"GRADZIP_NODE_SIZE": str(node_size), "GRADZIP_NODE_SHARED_MEMORY": shared})
    nodes = world // node_size
    for rank, (_, shape, _) in enumerate(outs):
        assert shape == (node_size, nodes, rank % node_size, rank // node_size)
    for n in sizes:
        got = [out[0][(n, 0)] for out in outs]
        assert all(torch.equal(got[0], g) for g in got), n
        exact = world_inputs(world, 0, n)
        assert torch.allclose(got[0].double(), exact, atol=1e-5 * world), (got[0].double() - exact).abs().max()


@pytest.mark.parametrize("spec", CODEC_SPECS)
def test_every_codec_gives_every_rank_the_same_bits(spec):
    """2 nodes × 2 ranks: every codec's results are bitwise equal on every rank and
    finite; with error feedback, what was summed plus what every residual holds is
    everything the ranks put in. The node stages in shared memory and over Gloo give the
    same bits."""
    world, n, steps = 4, 20011, 3
    outs = run_ranks(all_reduce_steps, world, spec, [n], steps, env={"GRADZIP_NODE_SIZE": "2"})
    over_gloo = run_ranks(all_reduce_steps, world, spec, [n], steps,
                          env={"GRADZIP_NODE_SIZE": "2", "GRADZIP_NODE_SHARED_MEMORY": "0"})
    assert all(torch.equal(a[0][(n, s)], b[0][(n, s)]) for a, b in zip(outs, over_gloo) for s in range(steps))
    assert all(out[1] == (2, 2, r % 2, r // 2) for r, out in enumerate(outs))
    for step in range(steps):
        got = [out[0][(n, step)] for out in outs]
        assert all(torch.equal(got[0], g) for g in got), step
        assert torch.isfinite(got[0]).all()
    states = [out[2] for out in outs]
    key = next((k.rsplit("/", 1)[0] for k in states[0] if k.endswith("/residual")), None)
    if key is None:
        return  # no error feedback
    summed = sum(outs[0][0][(n, step)].double() for step in range(steps))
    put_in = sum(world_inputs(world, step, n) for step in range(steps))
    held = residuals_held(world, n, states, key)
    assert held.abs().max() > 0  # the residuals hold something
    assert torch.allclose(summed + held, put_in, atol=2e-3), (summed + held - put_in).abs().max()


@pytest.mark.parametrize("world,node_size", [(4, 2), (6, 3)])
def test_the_node_stage_in_the_lanes_rounds_gives_the_same_bits(world, node_size):
    """In shared memory the node stage runs in the lane's rounds (each round's rows
    written and summed while the lane sends the round before): fp16 in 3 rounds gives the
    bits of 1 round and of the node stage over Gloo, at sizes whose shards take the same
    rounds (100003) and take different ones (11: shards of 5 and 6 elements, or 3 and 4,
    cut in 2 and 3 rounds), where the node stage runs in one step."""
    sizes, steps, spec = [11, 100003], 2, "fp16:exchange=twophase,rounds={}"
    env = {"GRADZIP_NODE_SIZE": str(node_size)}
    pipelined = run_ranks(all_reduce_steps, world, spec.format(3), sizes, steps, env=env)
    one_round = run_ranks(all_reduce_steps, world, spec.format(1), sizes, steps, env=env)
    over_gloo = run_ranks(all_reduce_steps, world, spec.format(3), sizes, steps,
                          env={**env, "GRADZIP_NODE_SHARED_MEMORY": "0"})
    for key, result in pipelined[0][0].items():
        assert all(torch.equal(result, out[0][key]) for out in pipelined + one_round + over_gloo), key
        exact = world_inputs(world, key[1], key[0])
        assert torch.allclose(result.double(), exact, rtol=2e-3, atol=2e-3 * world), (result.double() - exact).abs().max()


def test_a_compressed_rank_keeps_a_residual_for_its_shard_only():
    """The worker residual is zero outside the rank's shard (the rest went into the
    node's exact sum), and the owner residual covers part of the shard."""
    world, n = 4, 1000
    outs = run_ranks(all_reduce_steps, world, "stc:density=0.05,exchange=twophase", [n], 2,
                     env={"GRADZIP_NODE_SIZE": "2"})
    for rank, (_, _, state) in enumerate(outs):
        key = next(k.rsplit("/", 1)[0] for k in state if k.endswith("/residual"))
        residual = state[f"{key}/residual"]
        local = rank % 2
        shard = slice(local * n // 2, (local + 1) * n // 2)
        outside = torch.cat([residual[:shard.start], residual[shard.stop:]])
        assert torch.count_nonzero(outside) == 0 and torch.count_nonzero(residual[shard]) > 0
        offset, owned = int(state[f"{key}/owner_offset"]), state[f"{key}/owner_residual"].numel()
        assert shard.start <= offset and offset + owned <= shard.stop and owned == 250


def resume(rank, world, spec):
    """Five steps straight, against three steps, the backend's state_dict into a new
    group, then the same two: the same bits."""
    import gradzip
    dist.init_process_group("gloo")
    options = gradzip.Options(aggregation=spec)
    straight = dist.new_group(backend="gradzip", pg_options=options)
    first = dist.new_group(backend="gradzip", pg_options=options)
    for step in range(5):
        a = inputs(rank, step, 5003)
        dist.all_reduce(a, group=straight)
        if step < 3:
            dist.all_reduce(inputs(rank, step, 5003), group=first)
    saved = first._get_backend(torch.device("cpu")).state_dict()
    resumed = dist.new_group(backend="gradzip", pg_options=options)
    resumed._get_backend(torch.device("cpu")).load_state_dict(saved)
    for step in range(3, 5):
        b = inputs(rank, step, 5003)
        dist.all_reduce(b, group=resumed)
    levels = resumed._get_backend(torch.device("cpu")).node_levels("cpu")
    dist.destroy_process_group()
    return torch.equal(a, b) and levels is not None


@pytest.mark.parametrize("spec", ["stc:density=0.05", "qsgd:bits=4,exchange=twophase,seed=2"])
def test_a_hierarchical_group_resumes_bit_exactly(spec):
    assert all(run_ranks(resume, 4, spec, env={"GRADZIP_NODE_SIZE": "2"}))


def levels_of(rank, world, spec):
    import gradzip
    dist.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    levels = dist.group.WORLD._get_backend(torch.device("cpu")).node_levels("cpu")
    x = torch.full((100,), float(rank))
    dist.all_reduce(x)
    dist.destroy_process_group()
    return levels is not None, x[0].item()


@pytest.mark.parametrize("node_size,spec", [("4", "stc:density=0.01"), ("1", "stc:density=0.01"),
                                            ("2", "stc:density=0.01,hierarchy=off"), ("2", "sign:vote=majority"),
                                            ("2", "topk:density=0.01,momentum=0.9"), ("2", "allreduce")])
def test_flat_where_there_is_no_hierarchy_to_use(node_size, spec):
    """One node, one rank per node, hierarchy=off, per-rank rules (majority, momentum)
    and exact aggregations: no node levels, the flat result."""
    outs = run_ranks(levels_of, 4, spec, env={"GRADZIP_NODE_SIZE": node_size})
    assert not any(uses for uses, _ in outs)
    assert len({first for _, first in outs}) == 1
    if spec == "allreduce":
        assert outs[0][1] == 6.0


def test_a_node_is_a_host_and_the_launchers_node_index(monkeypatch):
    from gradzip import node_layout as nl
    monkeypatch.setattr(nl.socket, "gethostname", lambda: "host")
    monkeypatch.delenv("SLURM_NODEID", raising=False)
    monkeypatch.setenv("GROUP_RANK", "3")
    assert nl.node_identity() == "host/3"
    monkeypatch.delenv("GROUP_RANK")
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert nl.node_identity() == "host/1"
    monkeypatch.delenv("SLURM_NODEID")
    assert nl.node_identity() == "host/"


def test_node_layout_groups_ranks_by_host_name(monkeypatch, caplog):
    """Without the override, ranks with the same host name share a node: nodes in the
    order of their lowest rank; the transports of a rank are its node's and its lane's;
    nodes of different sizes stay flat, with a warning."""
    from gradzip import node_layout as nl
    monkeypatch.delenv("GRADZIP_NODE_SIZE", raising=False)
    store = dist.HashStore()
    for r, host in enumerate(["b", "a", "b", "a"]):
        store.set(f"gradzip/host/{r}", host)
    monkeypatch.setattr(nl, "node_identity", lambda: "a")
    layout = nl.node_layout(store, 3, 4)
    assert layout == [[0, 2], [1, 3]]
    made = nl.node_transports(layout, 3, lambda name, members, index: (name, members, index))
    assert made == (("node1", [1, 3], 1), ("lane1", [2, 3], 1))
    assert nl.node_transports([[0, 1, 2, 3]], 0, lambda *a: a) is None  # one node
    assert nl.node_transports([[0], [1]], 0, lambda *a: a) is None      # one rank per node
    with caplog.at_level(logging.WARNING):
        assert nl.node_transports([[0, 1, 2], [3, 4]], 0, lambda *a: a) is None
    assert "different numbers of ranks" in caplog.text
    for bad in ["3", "0", "two"]:
        monkeypatch.setenv("GRADZIP_NODE_SIZE", bad)
        with pytest.raises(ValueError, match="GRADZIP_NODE_SIZE"):
            nl.node_layout(store, 0, 4)


def through_own_doors(rank, world, spec):
    """gradzip.Aggregation and the DDP hook over a Gloo group of 2 nodes × 2 ranks: their
    results, DDP's parameters, and the hook's bucket residual."""
    import gradzip
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    aggregation = gradzip.Aggregation(spec)
    results = [aggregation(inputs(rank, step, 4001)).clone() for step in range(3)]
    aggregated = aggregation.state_dict()["tensors"]["tensor/residual"]
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(30, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5)))
    state = gradzip.hooks.State(spec)
    model.register_comm_hook(state, gradzip.hooks.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(4):
        opt.zero_grad()
        x, y = torch.randn(8, 30, generator=g), torch.randint(0, 5, (8,), generator=g)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    hooked = state.state_dict()["state"]["bucket:0/residual"]
    params = [p.detach().clone() for p in model.parameters()]
    dist.destroy_process_group()
    return results, aggregated, params, hooked


def test_the_aggregation_and_the_hook_take_the_hierarchical_exchange():
    """Their own aggregations get node and lane groups too: every rank the same bits,
    replicas identical, and residuals kept for the rank's shard only (zero outside it)."""
    outs = run_ranks(through_own_doors, 4, "stc:density=0.05", env={"GRADZIP_NODE_SIZE": "2"})
    for step in range(3):
        assert all(torch.equal(outs[0][0][step], out[0][step]) for out in outs)
    for out in outs:
        assert all(torch.equal(a, b) for a, b in zip(outs[0][2], out[2]))
    for rank, (_, aggregated, _, hooked) in enumerate(outs):
        for residual in (aggregated, hooked):
            n, local = residual.numel(), rank % 2
            outside = torch.cat([residual[:local * n // 2], residual[(local + 1) * n // 2:]])
            assert torch.count_nonzero(outside) == 0 and torch.count_nonzero(residual) > 0, rank


def reduce_scatter_steps(rank, world, spec, m, steps):
    """Per step, this rank's chunk of the compressed reduce_scatter_tensor over the gradzip
    backend; the bytes it sent; its state."""
    import gradzip
    dist.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    results = []
    for step in range(steps):
        output = torch.empty(m)
        dist.reduce_scatter_tensor(output, inputs(rank, step, world * m))
        results.append(output)
    sent = gradzip.stats()["bytes_sent"]
    state = backend.state_dict()
    dist.destroy_process_group()
    return results, sent, state


def node_sums_in_fp16(layout, step, n):
    """Σ over the nodes of fp16(the node's fp32 sum in local rank order), in float64: what
    a hierarchical fp16 reduce-scatter sums (exact inside a node, fp16 across)."""
    total = torch.zeros(n, dtype=torch.float64)
    for ranks in layout:
        node_sum = inputs(ranks[0], step, n).clone()
        for r in ranks[1:]:
            node_sum += inputs(r, step, n)
        total += node_sum.half().double()
    return total


@pytest.mark.parametrize("shared", ["1", "0"])
@pytest.mark.parametrize("world,node_size", [(4, 2), (6, 2), (6, 3)])
def test_compressed_reduce_scatter_sums_exactly_inside_and_compresses_across(world, node_size, shared):
    """FSDP's reduce_scatter_tensor, compressed (fp16) through the hierarchical exchange:
    every rank gets its own chunk of Σ over the nodes of fp16(the node's exact sum), not
    the flat Σ over the ranks of fp16(input); in shared memory the node's stage is off the
    wire, so each rank sends less than the flat reduce-scatter."""
    spec, m = "fp16:reduce_scatter=compressed", 1001
    env = {"GRADZIP_NODE_SIZE": str(node_size), "GRADZIP_NODE_SHARED_MEMORY": shared}
    outs = run_ranks(reduce_scatter_steps, world, spec, m, 1, env=env)
    flat = run_ranks(reduce_scatter_steps, world, spec.replace(":", ":hierarchy=off,"), m, 1, env=env)
    layout = [list(range(k, k + node_size)) for k in range(0, world, node_size)]
    expected = node_sums_in_fp16(layout, 0, world * m)
    for rank, (results, sent, _) in enumerate(outs):
        mine = expected[rank * m:(rank + 1) * m]
        assert torch.allclose(results[0].double(), mine, atol=1e-5 * world), (results[0].double() - mine).abs().max()
        assert not torch.equal(results[0], flat[rank][0][0])  # the flat sum of fp16 inputs differs
        if shared == "1":
            assert sent < flat[rank][1], (sent, flat[rank][1])


@pytest.mark.parametrize("world,node_size", [(4, 2), (6, 3)])
def test_the_reduce_scatters_node_stage_in_the_lanes_rounds_gives_the_same_bits(world, node_size):
    """The hierarchical reduce-scatter's node stage in shared memory runs in the lane's
    rounds too: fp16 in 3 rounds gives the bits of 1 round and of the node stage over
    Gloo, each rank its chunk of the nodes' fp16 sums."""
    m, spec = 1001, "fp16:reduce_scatter=compressed,rounds={}"
    env = {"GRADZIP_NODE_SIZE": str(node_size)}
    pipelined = run_ranks(reduce_scatter_steps, world, spec.format(3), m, 2, env=env)
    one_round = run_ranks(reduce_scatter_steps, world, spec.format(1), m, 2, env=env)
    over_gloo = run_ranks(reduce_scatter_steps, world, spec.format(3), m, 2,
                          env={**env, "GRADZIP_NODE_SHARED_MEMORY": "0"})
    layout = [list(range(k, k + node_size)) for k in range(0, world, node_size)]
    for step in range(2):
        expected = node_sums_in_fp16(layout, step, world * m)
        for rank in range(world):
            result = pipelined[rank][0][step]
            assert torch.equal(result, one_round[rank][0][step]) and torch.equal(result, over_gloo[rank][0][step])
            mine = expected[rank * m:(rank + 1) * m]
            assert torch.allclose(result.double(), mine, atol=1e-5 * world), (result.double() - mine).abs().max()


@pytest.mark.parametrize("spec", ["stc:density=0.05", "topk:density=0.05,exchange=twophase", "qsgd:bits=4,ef=1",
                                  "sign", "stc:density=0.05,rounds=3"])
def test_compressed_reduce_scatter_conserves_what_error_feedback_keeps(spec):
    """2 nodes × 2 ranks: what the ranks' chunks summed to, plus what every residual holds,
    is everything the ranks put in; the node stages in shared memory (in the lane's
    rounds where it takes several) and over Gloo give the same bits."""
    world, m, steps = 4, 3001, 3
    spec = f"{spec}{',' if ':' in spec else ':'}reduce_scatter=compressed"
    outs = run_ranks(reduce_scatter_steps, world, spec, m, steps, env={"GRADZIP_NODE_SIZE": "2"})
    over_gloo = run_ranks(reduce_scatter_steps, world, spec, m, steps,
                          env={"GRADZIP_NODE_SIZE": "2", "GRADZIP_NODE_SHARED_MEMORY": "0"})
    for a, b in zip(outs, over_gloo):
        assert all(torch.equal(x, y) for x, y in zip(a[0], b[0]))
    summed = torch.cat([sum(r.double() for r in out[0]) for out in outs])
    put_in = sum(world_inputs(world, step, world * m) for step in range(steps))
    states = [out[2] for out in outs]
    key = next(k.rsplit("/", 1)[0] for k in states[0] if k.endswith("/residual"))
    held = sum(state[f"{key}/residual"].double() for state in states)
    assert held.abs().max() > 0
    assert torch.allclose(summed + held, put_in, atol=2e-3), (summed + held - put_in).abs().max()


def reduce_scatter_over_layout(rank, world, layout, m):
    """A _C.Aggregation given node levels of `layout` (nodes whose ranks are not
    consecutive): this rank's chunk of the compressed reduce-scatter."""
    from gradzip import _C
    from gradzip.node_layout import layout_ranks, node_transports
    from gradzip.spec import bind_spec
    dist.init_process_group("gloo")
    cpu = torch.device("cpu")

    def make(_name, members, _index):
        return dist.new_group(members, backend="gloo", use_local_synchronization=True)._get_backend(cpu)

    transport = dist.group.WORLD._get_backend(cpu)
    aggregation = _C.Aggregation(bind_spec("fp16"))
    node, lane = node_transports(layout, rank, make)
    aggregation.use_node_levels(transport, node, lane, layout_ranks(layout))
    output = torch.empty(m)
    aggregation.reduce_scatter(output, inputs(rank, 0, world * m), "x", dist.ReduceOp.SUM, transport)
    sent = aggregation.stats()["bytes_sent"]
    dist.destroy_process_group()
    return output, sent


def test_reduce_scatter_gives_each_rank_its_chunk_when_nodes_interleave():
    """Nodes [0, 2] and [1, 3] (as a cyclic launcher places ranks): each rank still gets
    its own chunk of the nodes' fp16 sums, through the node stage (bytes on the node
    transport) and the lane."""
    world, m, layout = 4, 257, [[0, 2], [1, 3]]
    outs = run_ranks(reduce_scatter_over_layout, world, layout, m)
    exact = node_sums_in_fp16(layout, 0, world * m)
    for rank, (output, sent) in enumerate(outs):
        mine = exact[rank * m:(rank + 1) * m]
        assert torch.allclose(output.double(), mine, atol=1e-5 * world), (output.double() - mine).abs().max()
        assert sent > 0


def one_large_fp16_call(rank, world, n):
    """One fp16 all_reduce of n elements on a gradzip group: the result, the bytes sent."""
    import gradzip
    dist.init_process_group("gradzip", pg_options=gradzip.Options(aggregation="fp16"))
    x = inputs(rank, 0, n)
    dist.all_reduce(x)
    sent = gradzip.stats()["bytes_sent"]
    dist.destroy_process_group()
    return x, sent


def test_a_lanes_rounds_count_every_lane_of_its_node():
    """The lanes of a node share its link: a lane's automatic rounds count what all of
    them send in the first phase (3 rounds here, where one lane's bytes alone make 1),
    and the call sends the bytes of the lane's plan in those rounds."""
    import gradzip
    world, node_size, n = 4, 2, 3 << 22
    shard = n // node_size
    alone = gradzip.exchange_plan("fp16", shard, world // node_size)
    shared = gradzip.exchange_plan("fp16", shard, world // node_size, link_shared_by=node_size)
    assert (alone["rounds"], shared["rounds"], shared["choice"]) == (1, 3, "twophase")
    outs = run_ranks(one_large_fp16_call, world, n, env={"GRADZIP_NODE_SIZE": str(node_size)})
    assert all(torch.equal(outs[0][0], x) for x, _ in outs)
    assert torch.allclose(outs[0][0].double(), world_inputs(world, 0, n), atol=3e-3 * world)
    assert all(sent == shared["twophase"] for _, sent in outs), ([sent for _, sent in outs], shared, alone)


def reduce_scatter_bytes(rank, world, m, specs):
    """Per spec, the bytes this rank sent in one compressed reduce-scatter of world × m."""
    import gradzip
    dist.init_process_group("gloo")
    sent = []
    for spec in specs:
        state = gradzip.fsdp.State(spec)
        state.reduce_scatter(torch.empty(m), inputs(rank, 0, world * m), "x", dist.ReduceOp.AVG, dist.group.WORLD)
        sent.append(state.stats()["bytes_sent"])
    dist.destroy_process_group()
    return sent


def test_a_reduce_scatters_lane_rounds_count_every_lane_of_its_node():
    """The hierarchical reduce-scatter's lane takes the same rounds: 3 here (the node's two
    lanes counted together), where one lane's bytes alone make 1."""
    specs = ["fp16", "fp16:rounds=3", "fp16:rounds=1"]
    for auto, three, one in run_ranks(reduce_scatter_bytes, 4, 3 << 20, specs, env={"GRADZIP_NODE_SIZE": "2"}):
        assert auto == three != one, (auto, three, one)
