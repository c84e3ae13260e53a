"""Bad input gets a clear error that names the problem, on every rank, and nothing hangs."""
import os

import pytest
import torch
import torch.distributed as dist

import gradzip
from ranks import free_port, run_ranks


def test_unknown_spec_name_lists_the_valid_names():
    with pytest.raises(gradzip.SpecError, match=r"unknown aggregation 'nope'.*valid names: allreduce"):
        gradzip.canonical_spec("nope")


def test_unknown_key_lists_the_valid_keys():
    with pytest.raises(gradzip.SpecError, match=r"unknown key 'density' for aggregation 'allreduce'"):
        gradzip.canonical_spec("allreduce:density=0.1")


def test_malformed_spec_says_what_is_wrong():
    with pytest.raises(ValueError, match=r"'density' is not key=value"):
        gradzip.canonical_spec("allreduce:density")
    with pytest.raises(TypeError, match="is a string"):
        gradzip.canonical_spec(3)


def test_options_take_precedence_over_the_environment(monkeypatch):
    monkeypatch.setenv("GRADZIP_AGGREGATION", "nope")
    assert gradzip.Options(aggregation=" allreduce ").resolved_spec() == "allreduce"
    with pytest.raises(gradzip.SpecError, match="unknown aggregation 'nope'"):
        gradzip.Options().resolved_spec()
    monkeypatch.delenv("GRADZIP_AGGREGATION")
    assert gradzip.Options().resolved_spec() == "allreduce"
    monkeypatch.setenv("GRADZIP_VALIDATE", "sometimes")
    with pytest.raises(ValueError, match="GRADZIP_VALIDATE"):
        gradzip.Options().resolved_validate()
    assert gradzip.Options(validate=False).resolved_validate() is False


def init_with(rank, world, how):
    import gradzip
    if how == "env":
        os.environ["GRADZIP_AGGREGATION"] = "allreduce:density=0.1"
        gradzip.init_process_group("gradzip")
    elif how == "options":
        gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation="stc-1"))
    else:
        gradzip.init_process_group("gradzip", pg_options="allreduce")


@pytest.mark.parametrize("how, message", [
    ("env", "unknown key 'density' for aggregation 'allreduce'"),
    ("options", "the name 'stc-1' may only hold"),
    ("wrong_type", "pg_options must be a gradzip.Options, not str"),
])
def test_bad_configuration_fails_init_on_every_rank(how, message):
    with pytest.raises(AssertionError) as failure:
        run_ranks(init_with, 2, how, timeout=60)
    text = str(failure.value)
    assert text.count(message) == 2, text  # both ranks, no hang


def mismatched_calls(rank, world):
    import gradzip
    gradzip.init_process_group("gradzip")
    other = world - 1 - rank
    calls = {
        "size": lambda: dist.all_reduce(torch.ones(10 + rank)),
        "dtype": lambda: dist.all_reduce(torch.ones(10, dtype=torch.float32 if rank else torch.float64)),
        "reduce_op": lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.SUM if rank else dist.ReduceOp.MAX),
        "collective": lambda: dist.all_reduce(torch.ones(4)) if rank else dist.broadcast(torch.ones(4), src=0),
        "root": lambda: dist.broadcast(torch.ones(4), src=rank),
        "broadcast_size": lambda: dist.broadcast(torch.ones(5 + rank), src=0),
        "all_gather_size": lambda: dist.all_gather_into_tensor(torch.zeros(world * (3 + rank)), torch.ones(3 + rank)),
        "reduce_scatter_size": lambda: dist.reduce_scatter_tensor(torch.zeros(2 + rank), torch.ones(world * (2 + rank))),
        "all_to_all_splits": lambda: dist.all_to_all_single(torch.zeros(4), torch.ones(4), [2, 2], [1 + rank, 3 - rank]),
        "coalesced_sizes": lambda: dist.all_reduce_coalesced([torch.ones(2 + rank), torch.ones(3 - rank)]),
        "gather_single_output": lambda: dist.gather_single(torch.ones(3), torch.zeros(3 * world + 1), dst=0)
        if rank == 0 else dist.gather_single(torch.ones(3), dst=0),
        "gather_single_strided": lambda: dist.gather_single(torch.ones(3), torch.zeros(2 * 3 * world)[::2], dst=0)
        if rank == 0 else dist.gather_single(torch.ones(3), dst=0),
    }
    messages = {"channel": dist.group.WORLD._get_backend(torch.device("cpu")).check_channel()}
    for name, call in calls.items():
        try:
            call()
            messages[name] = None
        except RuntimeError as error:
            messages[name] = str(error)
        # The group still works after the refused call.
        x = torch.full((3,), float(rank + 1))
        dist.all_reduce(x)
        assert x.tolist() == [world * (world + 1) / 2] * 3
    return messages


@pytest.mark.parametrize("channel", ["shared memory", "transport"])
def test_mismatched_calls_are_refused_on_every_rank_without_hanging(channel):
    """Through shared memory (ranks on one host, the default) and over the transport
    (GRADZIP_NODE_SHARED_MEMORY=0, as between hosts): the same words."""
    env = {} if channel == "shared memory" else {"GRADZIP_NODE_SHARED_MEMORY": "0"}
    results = run_ranks(mismatched_calls, 2, timeout=120, env=env)
    assert [r.pop("channel") for r in results] == [channel, channel]
    expected = {
        "size": "rank 0 called all_reduce of Float with 10 elements, SUM; rank 1 called all_reduce of Float with 11",
        "dtype": "rank 0 called all_reduce of Double",
        "reduce_op": "rank 0 called all_reduce of Float with 4 elements, MAX; rank 1 called all_reduce of Float with 4 elements, SUM",
        "collective": "rank 0 called broadcast",
        "root": "root 0; rank 1 called broadcast of Float with 4 elements, root 1",
        "broadcast_size": "with 5 elements",
        "all_gather_size": "all_gather_into_tensor of Float with 3 elements",
        "reduce_scatter_size": "reduce_scatter_tensor of Float with 2 elements",
        "all_to_all_splits": "split sizes disagree: rank 0 sends 1 elements to rank 0, which expects 2",
        "coalesced_sizes": "all_reduce_coalesced of Float with 5 elements in 2 tensors",
        "gather_single_output": "rank 0 called gather_single of Float with 3 elements, root 0, gathering into 7 "
                                "elements; rank 1 called gather_single of Float with 3 elements, root 0, gathering into 6",
        "gather_single_strided": "rank 0 called gather_single of Float with 3 elements, root 0, gathering into an output "
                                 "not contiguous or on another device",
    }
    for rank, messages in enumerate(results):
        for name, fragment in expected.items():
            assert messages[name] is not None, f"rank {rank}: {name} was accepted"
            assert fragment in messages[name], f"rank {rank}: {name}: {messages[name]}"
    assert results[0] == results[1]  # the same words on every rank


def mismatched_point_to_point(rank, world):
    """Sends and receives that disagree: the receiver raises naming both sides, its tensor
    unchanged, and the pair goes on exchanging in step; matching ones arrive intact."""
    import gradzip
    gradzip.init_process_group("gradzip")
    cases = [(10, torch.float32, 11, torch.float32), (11, torch.float32, 10, torch.float32),
             (10, torch.float32, 10, torch.int32), (6, torch.float16, 3, torch.float32)]
    seen = []
    for sent_n, sent_dtype, want_n, want_dtype in cases:
        if rank == 0:
            dist.send(torch.arange(sent_n).to(sent_dtype), 1)
        else:
            out = torch.full((want_n,), 7).to(want_dtype)
            try:
                dist.recv(out, 0)
                seen.append(None)
            except RuntimeError as error:
                assert torch.equal(out, torch.full((want_n,), 7).to(want_dtype))
                seen.append(str(error))
        # in step afterwards: a matching exchange both ways, irecv posted before isend
        mine = torch.full((5,), float(rank))
        theirs = torch.empty(5)
        works = [dist.irecv(theirs, 1 - rank), dist.isend(mine, 1 - rank)]
        for w in works:
            w.wait()
        assert theirs.tolist() == [float(1 - rank)] * 5
    any_source = torch.empty(4)
    if rank == 0:
        dist.send(torch.ones(4), 1)
    else:
        dist.recv(any_source)  # from any rank
        assert any_source.tolist() == [1.0] * 4
    return seen


def test_mismatched_send_and_recv_raise_on_the_receiver():
    _, seen = run_ranks(mismatched_point_to_point, 2, timeout=120)
    assert "expects 11 elements of Float, rank 0 sent 10 elements of Float" in seen[0], seen[0]
    assert "expects 10 elements of Float, rank 0 sent 11 elements of Float" in seen[1], seen[1]
    assert "expects 10 elements of Int, rank 0 sent 10 elements of Float" in seen[2], seen[2]
    assert "expects 3 elements of Float, rank 0 sent 6 elements of Half" in seen[3], seen[3]


def cuda_without_cuda(rank, world):
    import gradzip
    gradzip.init_process_group("gradzip")
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert isinstance(backend, gradzip._C.Backend), type(backend)
    assert backend is dist.group.WORLD._get_backend(torch.device("cuda"))  # one object for both devices
    assert not backend.has_cuda_transport
    try:
        dist.all_reduce(torch.ones(3, device="cuda"))
    except (RuntimeError, AssertionError) as error:
        return str(error)
    return None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_tensor_without_cuda_is_refused_clearly():
    for message in run_ranks(cuda_without_cuda, 2, timeout=60):
        assert message is not None
        assert "CUDA" in message or "NVIDIA" in message, message


def shutdown_twice(rank, world, second_port):
    import os

    import gradzip
    gradzip.init_process_group("gradzip")
    dist.group.WORLD.shutdown()
    dist.group.WORLD.shutdown()
    try:
        dist.all_reduce(torch.ones(2))
        refused = None
    except RuntimeError as error:
        refused = str(error)
    dist.destroy_process_group()
    gradzip.register()  # idempotent
    # A new group after destroy works. On a new port: rank 0 serves the store, and a rank
    # that reconnects to the old port before rank 0 has replaced its server would lose.
    os.environ["MASTER_PORT"] = str(second_port)
    gradzip.init_process_group("gradzip")
    x = torch.ones(2)
    dist.all_reduce(x)
    return refused, x.tolist()


def test_shutdown_is_idempotent_and_refuses_later_collectives():
    for refused, value in run_ranks(shutdown_twice, 2, free_port(), timeout=60):
        assert refused is not None and "shut down" in refused, refused
        assert value == [2.0, 2.0]


def test_the_bound_device_is_read_from_whatever_the_backend_options_carry():
    """The creator's device binding must not fail on torch versions whose options or
    process groups lack the attributes (it runs for every group on a GPU machine)."""
    from types import SimpleNamespace

    from gradzip.backend import bound_device
    assert bound_device(SimpleNamespace()) is None  # no process_group attribute
    assert bound_device(SimpleNamespace(process_group=None)) is None
    assert bound_device(SimpleNamespace(process_group=SimpleNamespace())) is None  # no bound_device_id
    assert bound_device(SimpleNamespace(process_group=SimpleNamespace(bound_device_id=None))) is None
    cpu = SimpleNamespace(process_group=SimpleNamespace(bound_device_id=torch.device("cpu")))
    assert bound_device(cpu) is None
    gpu = torch.device("cuda", 1)
    assert bound_device(SimpleNamespace(process_group=SimpleNamespace(bound_device_id=gpu))) == gpu


def test_a_group_bound_after_its_backend_was_made_binds_its_transport(monkeypatch):
    """Where torch sets the group's bound device only after the backend exists (2.11),
    gradzip.init_process_group binds the NCCL transport then: once, and only a gradzip
    group's, only to a GPU."""
    from types import SimpleNamespace

    import gradzip.backend as backend_module

    class FakeBackend:
        def __init__(self):
            self.nccl = SimpleNamespace(bound_device_id=None)

        def transport(self, device_type):
            assert device_type == "cuda"
            return self.nccl

    made = FakeBackend()
    monkeypatch.setattr(backend_module._C, "Backend", FakeBackend)
    name = {"value": "gradzip"}
    monkeypatch.setattr(backend_module.dist, "get_backend", lambda group: name["value"])

    def group(bound):
        return SimpleNamespace(bound_device_id=bound, _get_backend=lambda device: made)

    backend_module.bind_transport_to_bound_device(group(None))
    backend_module.bind_transport_to_bound_device(group(torch.device("cpu")))
    assert made.nccl.bound_device_id is None
    name["value"] = "gloo"
    backend_module.bind_transport_to_bound_device(group(torch.device("cuda", 1)))
    assert made.nccl.bound_device_id is None
    name["value"] = "gradzip"
    backend_module.bind_transport_to_bound_device(group(torch.device("cuda", 1)))
    assert made.nccl.bound_device_id == torch.device("cuda", 1)
    backend_module.bind_transport_to_bound_device(group(torch.device("cuda", 0)))  # already bound: kept
    assert made.nccl.bound_device_id == torch.device("cuda", 1)


def init_with_own_spec(rank, world, specs):
    import gradzip
    os.environ["GRADZIP_AGGREGATION"] = specs[rank]
    gradzip.init_process_group("gradzip")
    x = torch.ones(4096)
    dist.all_reduce(x)


@pytest.mark.parametrize("specs", [
    ("stc:density=0.01", "topk:density=0.01"),
    ("topk:density=0.01", "topk:density=0.02"),
    ("topk:density=0.01", "nope"),
])
def test_ranks_given_different_specs_refuse_to_start_on_every_rank(specs):
    with pytest.raises(AssertionError) as failure:
        run_ranks(init_with_own_spec, 2, specs, timeout=60)
    text = str(failure.value)
    assert text.count("the ranks of this group were configured differently") == 2, text  # both ranks, no abort
    assert f"rank 0: spec '{specs[0]}'" in text
    if specs[1] == "nope":
        assert "rank 1: an invalid spec (gradzip: unknown aggregation 'nope'" in text
    else:
        assert f"rank 1: spec '{specs[1]}'" in text


def hook_and_aggregation_with_own_spec(rank, world, specs):
    import gradzip
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    messages = []
    try:
        gradzip.Aggregation(specs[rank])([torch.ones(4096)])
    except ValueError as error:
        messages.append(str(error))
    model = DDP(torch.nn.Linear(64, 64))
    model.register_comm_hook(gradzip.hooks.State(specs[rank]), gradzip.hooks.hook)
    for _ in range(2):  # the ranks compare specs at the first iteration's first bucket, before it moves
        try:
            model(torch.ones(4, 64)).sum().backward()
        except ValueError as error:  # raised by the hook, through backward()
            messages.append(str(error))
            break  # DDP cannot go on after a hook raised in its first iteration
    return messages


def test_the_hook_and_aggregation_refuse_ranks_with_different_specs():
    for messages in run_ranks(hook_and_aggregation_with_own_spec, 2, ("stc:density=0.01", "topk:density=0.01")):
        assert len(messages) == 2, messages
        for message in messages:
            assert "configured differently" in message and "rank 0: spec 'stc:density=0.01'" in message
            assert "rank 1: spec 'topk:density=0.01'" in message
