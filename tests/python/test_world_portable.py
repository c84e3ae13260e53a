"""Checkpoints that move between world sizes (gradzip.world_portable): state_dict(portable=True)
gives every rank the mean residual and velocity, summed in float64, a job at another world
size loads it and trains on with the mass not yet sent conserved, and a rank's own state
refuses another rank or world size by name."""
import warnings

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ranks import run_ranks

SPEC = "topk:density=0.05,momentum=0.9"


def model_and_hook(spec):
    import gradzip
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp = DDP(model)
    state = gradzip.hooks.State(spec, model=ddp)
    ddp.register_comm_hook(state, gradzip.hooks.hook)
    return ddp, state


def train(ddp, rank, steps, first=0):
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(first, first + steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        opt.zero_grad()
        ddp(torch.randn(8, 16, generator=g)).pow(2).mean().backward()
        opt.step()


def save_at(rank, world):
    dist.init_process_group("gloo")
    ddp, state = model_and_hook(SPEC)
    train(ddp, rank, 5)
    return state.state_dict(), state.state_dict(portable=True), [p.detach().clone() for p in ddp.parameters()]


def resume_at(rank, world, portable, weights, own):
    import gradzip
    dist.init_process_group("gloo")
    ddp, state = model_and_hook(SPEC)
    with torch.no_grad():
        for p, w in zip(ddp.parameters(), weights):
            p.copy_(w)
    try:
        state.load_state_dict(own)
        refused = None
    except gradzip.checkpoint.CheckpointError as error:
        refused = str(error)
    state.load_state_dict(portable)
    loaded = state.state_dict()["state"]
    train(ddp, rank, 3, first=5)
    return loaded, refused, torch.cat([p.detach().view(-1) for p in ddp.parameters()])


def test_the_hooks_state_moves_from_4_ranks_to_3_with_its_mass_conserved():
    saved = run_ranks(save_at, 4)
    own = [s[0]["state"] for s in saved]
    portable = saved[0][1]
    assert portable["portable"] and "world_size" not in portable
    for _, other, _ in saved[1:]:  # the same on every rank
        assert other.keys() == portable.keys()
        assert all(torch.equal(other["state"][k], portable["state"][k]) for k in portable["state"])
    fields = {k.rsplit("/", 1)[1] for k in portable["state"]}
    assert {"residual", "velocity", "calls", "step"} <= fields
    for name, value in portable["state"].items():
        if name.endswith(("/residual", "/velocity")):
            mean = sum(o[name].double() for o in own) / 4
            assert torch.equal(value, mean.float()), name
        else:
            assert all(torch.equal(o[name], value) for o in own), name  # counters agree across ranks

    resumed = run_ranks(resume_at, 3, portable, saved[0][2], saved[2][0])
    for rank, (loaded, refused, weights) in enumerate(resumed):
        assert "holds the error feedback of rank 2 of 4, and this is rank" in refused
        assert "state_dict(portable=True)" in refused
        for name, value in portable["state"].items():
            assert torch.equal(loaded[name], value), name
        assert torch.equal(weights, resumed[0][2]), "the resumed ranks disagree"
    # The mass not yet applied: (1/3)·Σ e' against (1/4)·Σ e_r, one float32 rounding apart.
    for name in (k for k in portable["state"] if k.endswith("/residual")):
        before = sum(o[name].double() for o in own) / 4
        after = sum(r[0][name].double() for r in resumed) / 3
        torch.testing.assert_close(after, before, rtol=2 ** -23, atol=1e-12)


def backend_portable(rank, world):
    import gradzip
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation="stc:density=0.05,exchange=twophase"))
    for step in range(3):
        x = torch.randn(4096, generator=torch.Generator().manual_seed(step * 10 + rank))
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        portable = gradzip.state_dict(portable=True)
    own = gradzip.state_dict()
    return portable, own, [str(w.message) for w in caught]


def test_the_backend_drops_the_owners_residuals_by_name():
    results = run_ranks(backend_portable, 4)
    portable, own, caught = results[0]
    assert any(k.endswith("/owner_residual") for k in own["tensors"])
    assert not any(k.endswith(("/owner_residual", "/owner_offset")) for k in portable["tensors"])
    assert len(caught) == 1 and "owner_residual" in caught[0] and "L1 mass of" in caught[0]
    assert all(torch.equal(r[0]["tensors"][k], v) for r in results for k, v in portable["tensors"].items())
    assert own["world_size"] == 4 and own["rank"] == 0


def mismatched(rank, world):
    import gradzip
    dist.init_process_group("gloo")
    agg = gradzip.Aggregation("topk:density=0.1")
    agg([torch.randn(100, generator=torch.Generator().manual_seed(rank))])
    state = agg.state_dict(portable=True)
    if rank == 1:  # a tensor the other rank never aggregated
        state["tensors"].update({"tensor:9/residual": torch.zeros(5), "tensor:9/calls": state["tensors"]["tensor:0/calls"]})
    agg.load_state_dict(state)
    try:
        agg.state_dict(portable=True)
    except gradzip.checkpoint.CheckpointError as error:
        return str(error)


def test_ranks_holding_different_state_are_refused_before_any_sum():
    for message in run_ranks(mismatched, 2):
        assert "needs the same state on every rank" in message


def membership_change(rank, world):
    """A State after 5 steps on 2 ranks moved to a group of rank 0 alone (a torchft quorum
    that lost rank 1): what set_process_group, peer_state_dict, snapshot and restore do to
    its error feedback."""
    import gradzip
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    ddp = DDP(torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4)))
    state = gradzip.hooks.State(SPEC + ",exchange=twophase", model=ddp)  # 2048 elements: compressed, not exact
    ddp.register_comm_hook(state, gradzip.hooks.hook)
    train(ddp, rank, 5)
    before = state.state_dict()["state"]
    alone = dist.new_group([0])
    if rank != 0:
        return None
    peer = state.peer_state_dict()
    snapshot = state.snapshot()
    owners = sum(float(v.abs().sum()) for k, v in before.items() if k.endswith("/owner_residual"))
    dropped = state.set_process_group(alone, previous_size=2)
    after = state.state_dict()["state"]
    moved = dict(after)
    state.restore(snapshot)
    restored = state.state_dict()["state"]
    state.set_process_group(alone, previous_size=2)
    return before, peer, owners, dropped, moved, restored, state.residual_mass()


def test_a_membership_change_rescales_the_error_feedback_and_a_peer_gives_no_residuals():
    """set_process_group(group, previous_size=W) multiplies each residual and velocity by
    W'/W and drops the two-phase owners' residuals, returning their L1 mass; a peer's state
    has zero residuals and velocities and the same counters; restore() puts a snapshot back
    bit for bit."""
    before, peer, owners, dropped, moved, restored, mass = run_ranks(membership_change, 2)[0]
    rescaled = [k for k in before if k.endswith(("/residual", "/velocity"))]
    assert rescaled and any(before[k].abs().sum() > 0 for k in rescaled)
    for k in rescaled:
        assert torch.equal(moved[k], before[k] * 0.5), k
    assert owners > 0 and dropped == pytest.approx(owners)
    assert not any(k.endswith(("/owner_residual", "/owner_offset")) for k in moved)
    for k, v in peer["state"].items():
        if k.endswith(("/residual", "/velocity")):
            assert not v.any(), k
        else:
            assert torch.equal(v, before[k]), k
    assert "rank" not in peer and "world_size" not in peer
    assert before.keys() == restored.keys() and all(torch.equal(before[k], restored[k]) for k in before)
    assert mass == pytest.approx(sum(float(moved[k].abs().sum()) for k in moved if k.endswith("/residual")))


def save_with_dcp(rank, world, path):
    import torch.distributed.checkpoint as dcp
    dist.init_process_group("gloo")
    ddp, state = model_and_hook(SPEC)
    train(ddp, rank, 5)
    own = state.state_dict()["state"]
    portable = state.state_dict(portable=True)
    dcp.save({"model": ddp.module.state_dict(), "gradzip": portable}, checkpoint_id=path)
    return own, portable


def load_with_dcp(rank, world, path):
    import torch.distributed.checkpoint as dcp
    import gradzip
    dist.init_process_group("gloo")
    ddp, state = model_and_hook(SPEC)
    saved = {"model": ddp.module.state_dict(), "gradzip": gradzip.world_portable.dcp_destination(path)}
    dcp.load(saved, checkpoint_id=path)
    ddp.module.load_state_dict(saved["model"])
    state.load_state_dict(saved["gradzip"])
    loaded = state.state_dict()["state"]
    train(ddp, rank, 3, first=5)
    try:
        gradzip.world_portable.dcp_destination(path, "optimizer")
        missing = None
    except gradzip.checkpoint.CheckpointError as error:
        missing = str(error)
    return loaded, torch.cat([p.detach().view(-1) for p in ddp.parameters()]), missing


def test_torch_distributed_checkpoint_carries_the_portable_state_from_4_ranks_to_3(tmp_path):
    """dcp.save of state_dict(portable=True) from 4 ranks, dcp.load at 3 into the destination
    dcp_destination() shapes from the checkpoint's metadata: every rank gets the saved mean
    residuals, velocities and counters bit for bit, and trains on in agreement."""
    path = str(tmp_path / "dcp")
    saved = run_ranks(save_with_dcp, 4, path)
    portable = saved[0][1]
    resumed = run_ranks(load_with_dcp, 3, path)
    for loaded, weights, missing in resumed:
        assert loaded.keys() == portable["state"].keys()
        for name, value in portable["state"].items():
            assert torch.equal(loaded[name], value), name
        assert torch.equal(weights, resumed[0][1]), "the resumed ranks disagree"
        assert "holds nothing under 'optimizer'" in missing and "'gradzip'" in missing
    for name in (k for k in portable["state"] if k.endswith("/residual")):
        before = sum(s[0][name].double() for s in saved) / 4
        after = sum(r[0][name].double() for r in resumed) / 3
        torch.testing.assert_close(after, before, rtol=2 ** -23, atol=1e-12)


def diloco_at(rank, world, path, resume=False):
    """DiLoCo with error feedback (QSGD 4-bit, ef=1): two outer steps from scratch, rank 0
    saving the portable state to `path` (torch.save), or one outer step from that file."""
    import gradzip
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    outer = gradzip.diloco.DiLoCo(model, "qsgd:bits=4,norm=max,ef=1", local_steps=2)
    if resume:
        state = torch.load(path, weights_only=False)
        outer.load_state_dict(state)
        loaded = outer.state_dict()["aggregation"]["tensors"]
        with torch.no_grad():
            for p, start in zip(model.parameters(), state["start"].values()):
                p.copy_(start)
    for step in range(2 if resume else 4):
        g = torch.Generator().manual_seed(1000 * step + rank)
        inner.zero_grad()
        model(torch.randn(8, 16, generator=g)).pow(2).mean().backward()
        inner.step()
        outer.step()
    own = outer.state_dict()["aggregation"]["tensors"]
    if resume:
        return loaded, torch.cat([p.detach().view(-1) for p in model.parameters()])
    portable = outer.state_dict(portable=True)
    if rank == 0:
        torch.save(portable, path)
    return own, portable


def test_diloco_resumes_at_another_world_size_with_its_error_feedback_mass(tmp_path):
    """DiLoCo's state_dict(portable=True), saved at 4 ranks with torch.save, resumes at 3:
    θ_start and the outer optimizer as saved, the error feedback at the mean of the 4
    ranks', and the next outer step the same on every rank."""
    path = str(tmp_path / "diloco.pt")
    saved = run_ranks(diloco_at, 4, path)
    portable = saved[0][1]
    assert portable["aggregation"]["portable"] and portable["steps"] == 4
    residuals = [k for k in portable["aggregation"]["tensors"] if k.endswith("/residual")]
    assert residuals and any(portable["aggregation"]["tensors"][k].any() for k in residuals)
    for name in residuals:
        mean = sum(s[0][name].double() for s in saved) / 4
        assert torch.equal(portable["aggregation"]["tensors"][name], mean.float()), name
    resumed = run_ranks(diloco_at, 3, path, True)
    for loaded, weights in resumed:  # every rank resumes with the mean: (1/3)·Σ e' = (1/4)·Σ e_r
        assert loaded.keys() == portable["aggregation"]["tensors"].keys()
        assert all(torch.equal(v, portable["aggregation"]["tensors"][k]) for k, v in loaded.items())
        assert torch.equal(weights, resumed[0][1]), "the resumed ranks disagree"


def resumed_from_different_steps(rank, world, door):
    """Each rank saves its own state after every step; at step 4 rank 0 resumes from its
    latest (step 3) and rank 1 from an older one (step 1): still in the density warm-up, and
    its layer levels chosen at other calls. Returns what the next step raised."""
    import copy
    import gradzip
    dist.init_process_group("gloo")
    spec = "topk:density=0.05,density_warmup=3"
    if door == "hook":
        torch.manual_seed(0)
        ddp = DDP(torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4)))
        aggregation = gradzip.hooks.State(spec, model=ddp)  # layers=adapt: levels agreed at set calls
        ddp.register_comm_hook(aggregation, gradzip.hooks.hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)

        def step(i):
            opt.zero_grad()
            ddp(torch.randn(8, 16, generator=torch.Generator().manual_seed(1000 * i + rank))).pow(2).mean().backward()
            opt.step()
    else:
        aggregation = gradzip.Aggregation(spec)

        def step(i):
            aggregation({"a": torch.randn(20000, generator=torch.Generator().manual_seed(10 * i + rank))})
    saved = []
    for i in range(6):
        if i == 4:
            aggregation.load_state_dict(saved[1] if rank == 1 else saved[3])
        try:
            step(i)
        except ValueError as error:
            return i, str(error)
        saved.append(copy.deepcopy(aggregation.state_dict()))
    return None


@pytest.mark.parametrize("door", ["hook", "Aggregation"])
def test_ranks_resumed_from_different_steps_are_refused_before_any_payload_moves(door):
    """A rank that comes back with an older checkpoint than the others: at the hook with
    layers=adapt the ranks would choose levels at different calls and wait for each other
    for ever; every rank raises at the first step instead, naming where each rank is."""
    for outcome in run_ranks(resumed_from_different_steps, 2, door, timeout=60):
        assert outcome is not None, "the ranks went on from different steps"
        at, message = outcome
        assert at == 4, message
        assert "not at the same point of their aggregation's state" in message
        assert "resume every rank from the same checkpoint" in message
        if door == "hook":
            assert "rank 0: iteration 4" in message and "rank 1: iteration 2" in message, message


def fsdp_at(rank, world, path, resume=False):
    """FSDP2 over an MLP whose layers' 61 and 80 rows shard unevenly (padded at 4 ranks or at
    3; the second layer's weight shards compressed at a level of their own), STC with layer
    adaptation: three steps and the own and portable states (rank 0
    saving the portable one), or, resumed from it, the state as loaded, portable again, and
    after two more steps."""
    import gradzip
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 61), torch.nn.Tanh(), torch.nn.Linear(61, 80))
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    state = gradzip.fsdp.compress(model, "stc:adapt_every=1,density=0.1")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def steps(first, count):
        for i in range(first, first + count):
            opt.zero_grad()
            model(torch.randn(8, 40, generator=torch.Generator().manual_seed(100 * i + rank))).square().mean().backward()
            opt.step()

    if resume:
        state.load_state_dict(torch.load(path, weights_only=False))
        loaded, again = state.state_dict()["state"], state.state_dict(portable=True)
        steps(3, 2)
        return loaded, again, state.state_dict()["state"]
    steps(0, 3)
    own, portable = state.state_dict(), state.state_dict(portable=True)
    if rank == 0:
        torch.save(portable, path)
    return own, portable


def test_the_fsdp_doors_state_moves_from_4_ranks_to_3_cut_by_parameter(tmp_path):
    """The FSDP door's residuals have the reduce-scatter input's layout (each rank's padded
    shard of every parameter); state_dict(portable=True) cuts them by parameter and averages
    them, and a job at 3 ranks lays them out for its own shards: the mass not yet sent is
    conserved, and the loaded state, made portable again at 3 ranks, is the saved one bit
    for bit."""
    path = str(tmp_path / "fsdp.pt")
    saved = run_ranks(fsdp_at, 4, path)
    own, portable = saved[0]
    assert own["world_size"] == 4 and portable["portable"]
    tensors = portable["state"]
    assert {"0:0.weight,0.bias/0.weight/residual", "2:2.weight,2.bias/2.weight/level"} <= set(tensors)
    for module, parameters in (("0", "0.weight,0.bias"), ("2", "2.weight,2.bias")):
        mean = sum(float(o["state"][k].double().sum()) for o, _ in saved for k in o["state"]
                   if k.startswith(f"{module}:") and k.endswith("/residual")) / 4
        cut = sum(float(v.double().sum()) for k, v in tensors.items()
                  if k.startswith(f"{module}:{parameters}/") and k.endswith("/residual"))
        assert cut == pytest.approx(mean, rel=1e-6, abs=1e-9), module
        assert (mean != 0) == (module == "2"), module  # the first layer's shards go exact (under 1024 elements)
    assert tensors["0:0.weight,0.bias/0.weight/residual"].numel() == 61 * 40

    resumed = run_ranks(fsdp_at, 3, path, True)
    for loaded, again, after in resumed:
        assert set(loaded) == {"0:2583/calls", "0:2583/residual", "0:2583/step", "2:5022/2.weight/level",
                               "2:5022/calls", "2:5022/residual", "2:5022/step"}  # 3 × (21·40 + 21), 3 × (27·61 + 27)
        assert again["state"].keys() == tensors.keys()
        for name, value in tensors.items():
            assert torch.equal(again["state"][name], value), name
        assert after["0:2583/calls"] == loaded["0:2583/calls"] + 2
