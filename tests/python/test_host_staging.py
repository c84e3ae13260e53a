"""The host-staged transport (gradzip._C.HostStagedBackend), which carries a gradzip
group's CUDA tensors where its ranks share a GPU, and the choice of it
(gradzip/cuda_transport.py).

On real ranks, through torch.distributed's own functions: a group whose backend is the
staged transport over Gloo gives every collective Gloo's bytes, every point-to-point
pattern in every order of posting and waiting, futures and polling; a failed host call
leaves the outputs untouched. It stages CPU tensors here (the same code as for GPU
tensors but for the copies' device; tests/python/test_gpu_ranks.py runs it on a GPU)."""
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import p2p_patterns
from collective_calls import collectives
from ranks import run_ranks

STAGED = "staged-for-tests"


def staged_group():
    """A process group of every rank whose backend is HostStagedBackend over its own Gloo."""
    from gradzip import _C

    def create(store, rank, size, group_timeout):
        return _C.HostStagedBackend(dist.ProcessGroupGloo(store, rank, size, group_timeout))

    if STAGED not in dist.Backend.backend_list:
        dist.Backend.register_backend(STAGED, create, devices=["cpu"])
    return dist.new_group(backend=STAGED, timeout=timedelta(seconds=60))


def as_gloo(rank, world):
    dist.init_process_group("gloo")
    staged, gloo = staged_group(), dist.new_group(backend="gloo")
    ours, theirs = collectives(rank, world, staged), collectives(rank, world, gloo)
    assert list(ours) == list(theirs)
    # Staged, a transposed tensor travels in its logical order: Gloo's result for the
    # contiguous copy (Gloo reduces the storage's order; with 3 ranks its ring rounds
    # another way).
    theirs["all_reduce of a transposed tensor"] = theirs["all_reduce of its contiguous copy"]
    for what in ours:
        assert torch.equal(ours[what].contiguous().view(torch.uint8), theirs[what].contiguous().view(torch.uint8)), what
    return len(ours)


@pytest.mark.parametrize("world", [2, 3])
def test_every_collective_gives_gloos_bytes(world):
    assert run_ranks(as_gloo, world) == [19] * world


def p2p_as_gloo(rank, world):
    dist.init_process_group("gloo")
    staged, gloo = staged_group(), dist.new_group(backend="gloo")
    cases = [(name, n, post, wait) for name in p2p_patterns.PATTERNS for n in (0, 1, 1000)
             for post in p2p_patterns.POST_ORDERS for wait in p2p_patterns.WAIT_ORDERS]
    for name, n, post, wait in cases:
        what = f"{name}, {n} elements, posted {post}, waited {wait}"
        results = []
        for group in (staged, gloo):
            sends, receives = p2p_patterns.PATTERNS[name](rank, world, n)
            results.append(p2p_patterns.exchange(group, sends, receives, post, wait))
        p2p_patterns.check(rank, receives, results[0], what + " (staged)")
        for ours, theirs in zip(*results):
            assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8)), what
    if rank == 0:  # a receive from any source names its source
        got = torch.empty(4)
        work = staged._get_backend(torch.device("cpu")).recv_anysource([got], 9)
        work.wait()
        assert work._source_rank() == 1 and torch.equal(got, torch.full((4,), 7.0))
    elif rank == 1:
        dist.send(torch.full((4,), 7.0), 0, group=staged, tag=9)
    return len(cases)


@pytest.mark.parametrize("world", [2, 3])
def test_every_point_to_point_pattern_in_every_order_completes_as_on_gloo(world):
    assert run_ranks(p2p_as_gloo, world) == [len(p2p_patterns.PATTERNS) * 3 * 12] * world


def chained(rank, world):
    """Collectives issued with async_op=True, each reading what the one before wrote,
    waited for only at the end (NCCL's stream orders them): each sees the one before."""
    dist.init_process_group("gloo")
    staged = staged_group()
    x = torch.full((1000,), float(rank + 1))
    works = [dist.broadcast(x, src=world - 1, group=staged, async_op=True)]
    gathered = torch.empty(world * 1000)
    works.append(dist.all_gather_into_tensor(gathered, x, group=staged, async_op=True))
    works.append(dist.all_reduce(gathered, group=staged, async_op=True))
    for work in reversed(works):
        work.wait()
    return torch.equal(x, torch.full((1000,), float(world))) and torch.equal(gathered, torch.full((world * 1000,),
                                                                                              float(world * world)))


def test_async_collectives_see_the_results_of_those_issued_before():
    assert run_ranks(chained, 3) == [True] * 3


def failed_call(rank, world):
    """Rank 0 all-reduces alone: the host call times out; wait raises, the tensor is untouched."""
    dist.init_process_group("gloo")
    staged = staged_group()  # made with a minute to connect; the call below times out after 2 s
    errors = []
    if rank == 0:
        t = torch.full((8,), 3.0)
        opts = dist.AllreduceOptions()
        opts.timeout = timedelta(seconds=2)
        try:
            staged._get_backend(torch.device("cpu")).allreduce([t], opts).wait()
        except RuntimeError as error:
            errors.append(str(error))
        assert torch.equal(t, torch.full((8,), 3.0))
        sparse = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,))
        with pytest.raises(RuntimeError, match="only dense tensors"):
            staged._get_backend(torch.device("cpu")).allreduce([sparse]).wait()
    dist.barrier()
    return errors


def test_a_failed_host_call_raises_and_copies_nothing_back():
    errors = run_ranks(failed_call, 2)
    assert len(errors[0]) == 1 and "Timed out" in errors[0][0] and errors[1] == [], errors


def test_the_choice_follows_bound_gpus_then_counts():
    from gradzip.cuda_transport import decide

    def entry(node, bound, *visible):
        return "|".join(["auto", "1", node, bound, ",".join(visible)])

    assert decide([entry("a", "g0", "g0", "g1"), entry("a", "g1", "g0", "g1")])[0] == "nccl"
    choice, why = decide([entry("a", "g0", "g0", "g1"), entry("a", "g0", "g0", "g1")])
    assert choice == "host" and "ranks 0, 1 are bound to one GPU" in why
    assert decide([entry("a", "g0", "g0"), entry("b", "g0", "g0")])[0] == "nccl"  # same UUID digest, other node
    # Unbound: four ranks on one node that sees one GPU share it.
    choice, why = decide([entry("a", "-", "g0")] * 4)
    assert choice == "host" and "node a holds 4 ranks (0, 1, 2, 3) and its ranks see 1 GPU" in why
    # CUDA_VISIBLE_DEVICES gives each rank its own GPU: four GPUs between them.
    assert decide([entry("a", "-", f"g{r}") for r in range(4)])[0] == "nccl"
    assert decide([entry("a", "-", "g0", "g1"), entry("a", "-", "g0", "g1"), entry("b", "-", "g2")])[0] == "nccl"
    assert decide([entry("a", "-", "g0", "g1"), entry("b", "g2", "g2"), entry("b", "-", "g2")])[0] == "host"
    assert decide([entry("a", "-", "g0"), "auto"])[0] == "nccl"  # a rank without CUDA takes no part


def test_a_rank_describes_its_node_bound_gpu_and_the_gpus_it_sees(monkeypatch):
    from types import SimpleNamespace

    from gradzip import cuda_transport
    uuids = {0: "GPU-aaaa", 1: "GPU-bbbb"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=uuids[i]))
    monkeypatch.setattr(cuda_transport.dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(cuda_transport, "node_identity", lambda: "host-a/0")
    asked, nccl, node, bound, visible = cuda_transport.describe_rank("auto", None).split("|")
    assert (asked, nccl, node, bound) == ("auto", "1", "host-a/0", "-")
    assert visible == ",".join(sorted(cuda_transport._gpu_id(i) for i in (0, 1)))
    assert cuda_transport._gpu_id(0) != cuda_transport._gpu_id(1) and len(cuda_transport._gpu_id(0)) == 12
    on_one = cuda_transport.describe_rank("auto", torch.device("cuda", 0)).split("|")[3]
    assert on_one == cuda_transport._gpu_id(0)
    assert cuda_transport.describe_rank("auto", torch.device("cuda")).split("|")[3] == cuda_transport._gpu_id(1)
    assert cuda_transport.describe_rank("host", None) == "host|1"  # nothing to decide: no GPU read
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: 1 / 0)
    said = cuda_transport.describe_rank("auto", None)  # sent to the others, who then fail with it
    assert said.startswith("its GPUs could not be read (") and "division by zero" in said
    with pytest.raises(ValueError, match="its GPUs could not be read"):
        cuda_transport.require_one_request(["auto|1|a|-|g0", said])
    with pytest.raises(ValueError, match="cannot be chosen: its GPUs could not be read"):
        cuda_transport.choose("auto", [said, said], 0)
    monkeypatch.setattr(cuda_transport.dist, "is_nccl_available", lambda: False)
    assert cuda_transport.describe_rank("auto", None) == "auto|0"


def test_an_explicit_choice_wins_and_without_nccl_auto_is_host():
    from gradzip.cuda_transport import choose, requested

    shared = ["auto|1|a|-|g0"] * 2
    assert choose("auto", shared, 0) == "host"
    assert choose("nccl", ["nccl|1"] * 2, 0) == "nccl"
    assert choose("host", ["host|1"] * 2, 1) == "host"
    assert choose("auto", ["auto|1|a|-|g0,g1"] * 2, 1) == "nccl"
    # One rank's torch without NCCL: every rank takes the host, or refuses "nccl" alike.
    assert choose("auto", ["auto|1|a|-|g0,g1", "auto|0"], 0) == "host"
    assert choose("auto", ["auto|1|a|-|g0,g1", "auto|0"], 1) == "host"
    with pytest.raises(ValueError, match="the torch of rank 1 has no NCCL"):
        choose("nccl", ["nccl|1", "nccl|0"], 0)
    assert requested(None) == "auto" and requested(" HOST ") == "host"
    with pytest.raises(ValueError, match="must be one of auto, nccl, host, not 'gloo'"):
        requested("gloo")


def disagreeing(rank, world):
    """Rank 1 asks for an unknown CUDA transport: every rank's init raises, naming it."""
    import os

    import gradzip
    if rank == 1:
        os.environ["GRADZIP_CUDA_TRANSPORT"] = "ncl"
    try:
        gradzip.init_process_group("gradzip")
    except ValueError as error:
        return str(error)
    return "no error"


def test_ranks_that_ask_for_different_cuda_transports_fail_on_every_rank():
    for message in run_ranks(disagreeing, 2):
        assert "asked for different CUDA transports" in message, message
        assert "rank 0: auto" in message and "rank 1: an invalid request" in message and "'ncl'" in message
