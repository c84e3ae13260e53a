"""DDP over the gradzip backend trains exactly like DDP over Gloo."""
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ranks import run_ranks

STEPS = 20


def small_cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(4 * 5 * 5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))


def ddp_sgd(group=None, hook_spec=None, bucket_view=False):
    """The small CNN in DDP over `group` (several buckets) with SGD, and, with `hook_spec`,
    gradzip's hook registered as a user would (the model and the optimizer given): the
    model, the optimizer and the hook's State (None without)."""
    import gradzip
    torch.manual_seed(0)  # the same initial model on every rank and for every group
    model = DDP(small_cnn(), process_group=group, bucket_cap_mb=0.001, gradient_as_bucket_view=bucket_view)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = None
    if hook_spec is not None:
        state = gradzip.hooks.State(hook_spec, model=model, optimizer=opt)
        model.register_comm_hook(state, gradzip.hooks.hook)
    return model, opt, state


def batches(rank, count, step0=0):
    """This rank's `count` batches of the small CNN's inputs."""
    for step in range(step0, step0 + count):
        g = torch.Generator().manual_seed(1000 * step + rank)
        yield torch.randn(8, 1, 12, 12, generator=g), torch.randint(0, 10, (8,), generator=g)


def train(rank, group, hook_spec=None, bucket_view=False):
    """STEPS of SGD with DDP over `group` (ddp_sgd)."""
    model, opt, _ = ddp_sgd(group, hook_spec, bucket_view)
    for x, y in batches(rank, STEPS):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def assert_same_bits(params, others, what):
    for a, b in zip(params, others, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), what


def assert_trained(params):
    """The parameters moved from the small CNN's initial ones."""
    torch.manual_seed(0)
    assert any(not torch.equal(p, q) for p, q in zip(small_cnn().parameters(), params))


def ddp_over_gradzip_and_gloo(rank, world):
    import gradzip
    gradzip.init_process_group("gradzip")
    gloo = dist.new_group(backend="gloo")
    return train(rank, dist.group.WORLD), train(rank, gloo)


@pytest.mark.torch_range
def test_ddp_over_gradzip_is_bitwise_ddp_over_gloo():
    results = run_ranks(ddp_over_gradzip_and_gloo, 3)
    reference = results[0][1]
    for rank, (over_gradzip, over_gloo) in enumerate(results):
        assert_same_bits(over_gradzip, over_gloo, f"rank {rank}: gradzip != gloo")
        assert_same_bits(over_gradzip, reference, f"rank {rank} != rank 0")
    assert_trained(reference)  # 20 steps of training happened


def hook_with_and_without_bucket_views(rank, world, spec):
    dist.init_process_group("gloo")
    return train(rank, None, spec, bucket_view=False), train(rank, None, spec, bucket_view=True)


@pytest.mark.parametrize("spec", ["stc:density=0.05", "topk:density=0.05,layers=off", "qsgd:bits=4"])
def test_the_hook_trains_the_same_with_gradients_as_bucket_views(spec):
    """DDP(gradient_as_bucket_view=True) makes the gradients views of the buckets the hook
    aggregates in place, and zero_grad() sets them to None between steps: the same bits
    as with DDP's copies, on every rank."""
    results = run_ranks(hook_with_and_without_bucket_views, 3, spec)
    reference = results[0][0]
    for rank, (copied, viewed) in enumerate(results):
        assert_same_bits(copied, viewed, f"rank {rank}: bucket views changed the bits")
        assert_same_bits(copied, reference, f"rank {rank} != rank 0")
    assert_trained(reference)


def one_bucket_with_a_metric_now_and_then(rank, world):
    """DDP of one bucket over a gradzip group whose spec sends the first 3 calls of a
    tensor exact, for 3 epochs of 6 steps with a metric all-reduced after each."""
    import gradzip
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation="topk:density=0.1,warmup=3"))
    torch.manual_seed(0)
    model = DDP(small_cnn())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        for step in range(6):
            g = torch.Generator().manual_seed(100 * epoch + 10 * step + rank)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(torch.randn(8, 1, 12, 12, generator=g)),
                                              torch.randint(0, 10, (8,), generator=g)).backward()
            opt.step()
        dist.all_reduce(torch.ones(3, dtype=torch.float64))  # a metric
    return gradzip.stats()["bytes_sent"], sum(p.numel() for p in model.parameters())


def test_ddp_keeps_its_bucket_state_across_other_all_reduces():
    for sent, numel in run_ranks(one_bucket_with_a_metric_now_and_then, 2):
        # Of 18 bucket calls only the first 3 go exact (a 2-rank ring sends 4n bytes, top-k
        # at 10% about 0.8n). A bucket keyed anew after each metric would go exact 3 times
        # per epoch: 9·4n + 9·0.8n.
        dense = numel * 4
        assert 3 * dense < sent < 3 * dense + 15 * 0.3 * dense, (sent, dense)


def uneven_inputs_joined(rank, world, backend, hook_spec):
    """DDP's Join for uneven inputs: rank r has 4 + 2r batches; ranks that run out shadow
    the others' all-reduces (with a comm hook: the hook on zero buckets). `backend` may
    be "gradzip:SPEC", a gradzip group that compresses all_reduce with SPEC."""
    import gradzip
    from torch.distributed.algorithms.join import Join
    backend, _, aggregation = backend.partition(":")
    gradzip.init_process_group(backend, pg_options=gradzip.Options(aggregation=aggregation) if aggregation else None)
    model, opt, state = ddp_sgd(hook_spec=hook_spec)
    with Join([model]):
        for x, y in batches(rank, 4 + 2 * rank):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    dist.all_reduce(torch.ones(2))  # the group still works after the join
    sent = gradzip.stats()["bytes_sent"] if aggregation else None
    return [p.detach().clone() for p in model.parameters()], None if state is None else state.iteration, sent


def test_ddp_join_with_uneven_inputs_on_a_gradzip_group_is_bitwise_gloos():
    over_gradzip = run_ranks(uneven_inputs_joined, 3, "gradzip", None, timeout=120)
    over_gloo = run_ranks(uneven_inputs_joined, 3, "gloo", None, timeout=120)
    for rank in range(3):
        assert_same_bits(over_gradzip[rank][0], over_gloo[rank][0], f"rank {rank}: gradzip != gloo")
        assert_same_bits(over_gradzip[rank][0], over_gloo[0][0], f"rank {rank} != rank 0")


@pytest.mark.parametrize("backend, spec", [("gloo", "stc:density=0.05"), ("gloo", "qsgd:bits=4"),
                                           ("gradzip:stc:density=0.05", None)])
def test_compression_under_ddp_join_with_uneven_inputs(backend, spec):
    """The hook, or a compressing gradzip group: every rank ends with the same bits, and
    the hook ran once per step of the rank with the most batches (8): the joined ranks'
    shadow steps go through it too."""
    outs = run_ranks(uneven_inputs_joined, 3, backend, spec, timeout=120)
    for rank, (params, iterations, sent) in enumerate(outs):
        assert iterations == (8 if spec else None), (rank, iterations)
        if sent is not None:  # the group compressed: under half a ring's bytes for 8 steps
            dense = 8 * 2 * 2 / 3 * 4 * sum(p.numel() for p in params)
            assert sent < dense / 2, (rank, sent, dense)
        assert all(torch.isfinite(p).all() for p in params)
        assert_same_bits(params, outs[0][0], f"rank {rank} != rank 0")
    assert_trained(outs[0][0])


def accumulated_with_no_sync(rank, world, backend, hook_spec):
    """Gradient accumulation: 3 micro-batches per step, the first 2 under DDP's no_sync()."""
    import gradzip
    gradzip.init_process_group(backend)
    model, opt, state = ddp_sgd(hook_spec=hook_spec)
    for step in range(5):
        opt.zero_grad()
        micro = list(batches(rank, 3, 3 * step))
        with model.no_sync():
            for x, y in micro[:2]:
                torch.nn.functional.cross_entropy(model(x), y).backward()
        torch.nn.functional.cross_entropy(model(micro[2][0]), micro[2][1]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], None if state is None else state.iteration


def test_gradient_accumulation_with_no_sync_on_a_gradzip_group_is_bitwise_gloos():
    over_gradzip = run_ranks(accumulated_with_no_sync, 3, "gradzip", None)
    over_gloo = run_ranks(accumulated_with_no_sync, 3, "gloo", None)
    for rank in range(3):
        assert_same_bits(over_gradzip[rank][0], over_gloo[rank][0], f"rank {rank}: gradzip != gloo")


def test_the_hook_with_gradient_accumulation_under_no_sync():
    """The hook runs once per optimizer step (not per micro-batch), on the accumulated
    gradients, with the same bits on every rank."""
    outs = run_ranks(accumulated_with_no_sync, 3, "gloo", "stc:density=0.05")
    for rank, (params, iterations) in enumerate(outs):
        assert iterations == 5, (rank, iterations)
        assert_same_bits(params, outs[0][0], f"rank {rank} != rank 0")
    assert_trained(outs[0][0])
