"""Asynchronous all-reduce: the backend and the DDP hook return before the exchange is
done, run calls in call order, and give the bits of the synchronous path."""
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ranks import run_ranks

SPEC = "qsgd:bits=4,exchange=twophase,seed=5"


def returns_before_the_others_arrive(rank, world):
    import gradzip
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=SPEC))
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(rank))
    if rank == 1:
        time.sleep(1.5)
    start = time.monotonic()
    work = dist.all_reduce(x, async_op=True)
    returned = time.monotonic() - start
    done_at_return = work.is_completed()
    result = work.result()  # waits for the job, as wait() does
    work.wait()
    return returned, done_at_return, x, len(result) == 1 and result[0] is not None and torch.equal(result[0], x)


def test_the_backend_returns_at_once():
    outs = run_ranks(returns_before_the_others_arrive, 2)
    returned, done, x0, _ = outs[0]
    assert returned < 0.5 and not done  # rank 0 got its Work while rank 1 still slept
    assert torch.equal(x0, outs[1][2])
    assert all(result_is_x for *_, result_is_x in outs)


def queued_against_one_by_one(rank, world):
    import gradzip
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=SPEC))
    other = dist.new_group(backend="gradzip", pg_options=gradzip.Options(aggregation=SPEC))
    tensors = [torch.randn(n, generator=torch.Generator().manual_seed(10 * rank + i))
               for i, n in enumerate([5000, 17, 3001, 5000, 64])]
    queued = [t.clone() for t in tensors]
    works = [dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True) for t in queued]
    # A collective of another kind waits for the queued all-reduces, then runs.
    flag = torch.tensor([rank], dtype=torch.int64)
    dist.broadcast(flag, src=1)
    for w in works:
        w.wait()
    one_by_one = [t.clone() for t in tensors]
    for t in one_by_one:
        dist.all_reduce(t, op=dist.ReduceOp.AVG, group=other)
    return all(torch.equal(a, b) for a, b in zip(queued, one_by_one)), int(flag), queued


def test_queued_calls_give_the_synchronous_bits():
    outs = run_ranks(queued_against_one_by_one, 3)
    for same, flag, queued in outs:
        assert same and flag == 1
        assert all(torch.equal(a, b) for a, b in zip(queued, outs[0][2]))


def train(rank, world, spec, door, wait_each_bucket):
    import gradzip
    if door == "backend":
        gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
        group = None
    else:
        dist.init_process_group("gloo")
        group = dist.group.WORLD
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.005)
    if door == "hook":
        state = gradzip.hooks.State(spec, model=ddp)
        if wait_each_bucket:  # the synchronous path: each bucket done before the hook returns
            def hook(state, bucket):
                fut = gradzip.hooks.hook(state, bucket)
                fut.wait()
                return fut
        else:
            hook = gradzip.hooks.hook
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        g = torch.Generator().manual_seed(100 * step + rank)
        opt.zero_grad()
        ddp(torch.randn(16, 32, generator=g)).pow(2).mean().backward()
        opt.step()
    return torch.cat([p.detach().view(-1) for p in model.parameters()])


def test_asynchronous_ddp_gives_the_synchronous_bits():
    spec = "stc:density=0.05,exchange=twophase"
    asynchronous = run_ranks(train, 2, spec, "hook", False)
    synchronous = run_ranks(train, 2, spec, "hook", True)
    assert torch.equal(asynchronous[0], asynchronous[1])
    assert torch.equal(asynchronous[0], synchronous[0])
    backend = run_ranks(train, 2, spec, "backend", False)
    assert torch.equal(backend[0], backend[1])


def train_with_the_hook(ddp, rank, spec, steps):
    """`steps` SGD steps of ddp (inputs of 32 features) with gradzip's hook; its parameters."""
    import gradzip
    ddp.register_comm_hook(gradzip.hooks.State(spec, model=ddp), gradzip.hooks.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        opt.zero_grad()
        ddp(torch.randn(16, 32, generator=g)).pow(2).mean().backward()
        opt.step()
    return torch.cat([p.detach().view(-1) for p in ddp.parameters()])


def hook_with_a_static_graph_over_gradzip(rank, world, spec):
    """DDP(static_graph=True) all-reduces its map of used parameters through the group (a
    gradzip group: on its backend's worker) before the first iteration's hooks, whose
    calls go to the same inner transport from the hook's worker: they must not overlap."""
    import gradzip
    # validate (the default, stated): the backend's job checks the call over the same
    # transport first, which widens the window
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation="allreduce", validate=True))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    ddp = DDP(model, bucket_cap_mb=0.05, static_graph=True)
    return train_with_the_hook(ddp, rank, spec, 4)


def test_the_hook_with_a_static_graph_over_a_gradzip_group():
    for _ in range(3):  # the overlap it guards against is a race
        outs = run_ranks(hook_with_a_static_graph_over_gradzip, 2, "stc:density=0.05,exchange=twophase", timeout=120)
        assert torch.isfinite(outs[0]).all()
        assert torch.equal(outs[0], outs[1])


def hook_with_unused_parameters(rank, world, spec):
    """DDP(find_unused_parameters=True) all-reduces its map of used parameters on the
    group's own backend right after the last bucket's hook returns: the hook's queued
    collectives must not be issued concurrently with it (Gloo matches by sequence)."""
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.Linear(32, 256), torch.nn.Linear(256, 256), torch.nn.Linear(256, 10),
                                  torch.nn.Linear(32, 10)])  # the last one unused

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = layers

        def forward(self, x):
            return self.layers[2](torch.relu(self.layers[1](torch.relu(self.layers[0](x)))))

    ddp = DDP(Net(), bucket_cap_mb=0.05, find_unused_parameters=True)
    return train_with_the_hook(ddp, rank, spec, 6)


def test_the_hook_with_unused_parameters():
    outs = run_ranks(hook_with_unused_parameters, 2, "stc:density=0.05,exchange=twophase", timeout=120)
    assert torch.isfinite(outs[0]).all()
    assert torch.equal(outs[0], outs[1])


def powersgd_over_gradzip(rank, world, bucket_cap_mb):
    """PyTorch's PowerSGD hook waits for a second all-reduce inside a future's callback,
    which runs on gradzip's worker thread or Gloo's: that must not deadlock, with one
    bucket or with several whose callbacks overlap."""
    import gradzip
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation="allreduce"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                        orthogonalization_epsilon=1e-8)
    ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        opt.zero_grad()
        ddp(torch.randn(8, 32, generator=torch.Generator().manual_seed(step + 10 * rank))).mean().backward()
        opt.step()
    return torch.cat([p.detach().view(-1) for p in model.parameters()])


@pytest.mark.parametrize("bucket_cap_mb", [25, 0.02])
def test_powersgd_runs_over_the_gradzip_backend(bucket_cap_mb):
    outs = run_ranks(powersgd_over_gradzip, 2, bucket_cap_mb, timeout=120)
    assert torch.isfinite(outs[0]).all()
    assert torch.equal(outs[0], outs[1])


def broadcast_in_a_callback(rank, world):
    """A future's callback (on the worker thread) that issues a collective other than
    all_reduce: it must not wait for the queue to drain, since its own job is in it."""
    import gradzip
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=SPEC))
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(rank))
    if rank == 1:
        time.sleep(1.0)  # rank 0's future is still pending when its callback is added

    def broadcast_then(future):
        b = torch.full((3,), float(rank))
        dist.broadcast(b, src=0)
        return b

    b = dist.all_reduce(x, async_op=True).get_future().then(broadcast_then).wait()
    return b, x


def test_a_callback_may_issue_another_collective():
    outs = run_ranks(broadcast_in_a_callback, 2, timeout=120)
    assert all(torch.equal(b, torch.zeros(3)) for b, _ in outs)
    assert torch.equal(outs[0][1], outs[1][1])


def group_let_go_of_by_a_callback(rank, world, spec):
    """A future's callback that holds the group, let go of on the thread that completed the
    future (Gloo's for the exact path, the worker's otherwise) after the caller destroyed the
    group: the group's last reference dies on a thread its destructor joins."""
    import gradzip
    dist.init_process_group("gloo")
    group = dist.new_group(backend="gradzip", pg_options=gradzip.Options(aggregation=spec))
    x = torch.full((1000,), float(rank + 1))
    if rank == 1:
        time.sleep(1.0)  # rank 0's future is still pending when its callbacks are added

    def keep_the_group(future, group=group):
        return future.value()

    done = dist.all_reduce(x, group=group, async_op=True).get_future().then(keep_the_group)
    # Runs on the completing thread once `done` is complete, before that thread lets go of
    # keep_the_group: the caller destroys the group meanwhile.
    done.add_done_callback(lambda _: time.sleep(1.0))
    del keep_the_group
    done.wait()
    dist.destroy_process_group()
    del group
    time.sleep(2.0)  # the completing thread lets go of the group's last reference
    return x


@pytest.mark.parametrize("spec", ["allreduce", "fp16"])
def test_the_group_may_die_on_a_thread_it_joins(spec):
    for x in run_ranks(group_let_go_of_by_a_callback, 2, spec):
        assert torch.equal(x, torch.full((1000,), 3.0))


def test_a_rank_may_end_right_after_its_last_wait():
    """No cleanup at the end of a script: the worker keeps the last job's tensors until it
    is destroyed, instead of dropping them on its own thread while the interpreter shuts
    down (which aborted the process: "terminate called without an active exception")."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from ranks import free_port
    script = Path(__file__).with_name("exit_after_wait.py")
    for attempt in range(2):
        env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   OMP_NUM_THREADS="1")
        procs = [subprocess.Popen([sys.executable, str(script)], env=dict(env, RANK=str(r)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=120)
            assert "finished" in out, (attempt, rank, err[-2000:])
            assert proc.returncode == 0 and "terminate" not in err, (attempt, rank, proc.returncode, err[-2000:])


@pytest.mark.parametrize("call", ["recv", "all_reduce"])
def test_a_rank_may_end_while_a_callback_runs_on_a_gradzip_thread(call):
    """The script ends while a callback on the call's future sleeps on gradzip's thread:
    the exit waits for the callback, and the process ends cleanly (it died of SIGSEGV or
    "terminate called without an active exception")."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from ranks import free_port
    script = Path(__file__).with_name("exit_in_callback.py")
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), call], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    for rank, proc in enumerate(procs):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "terminate" not in err, (rank, proc.returncode, err[-2000:])
        if call == "all_reduce" or rank == 1:
            assert out.split() == ["exiting", "callback", "finished"], (rank, out)

