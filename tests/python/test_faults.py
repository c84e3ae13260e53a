"""A rank that dies (SIGKILL) or stops (SIGSTOP) while the others are inside a collective:
every other rank raises within the group's timeout plus 5 s, with a message that names
the problem, and a new group of the survivors gives correct results; likewise inside the
collective a portable checkpoint takes. For the exact
path, both compressed exchanges, gossip and CHOCO; and under load: beside a second
gradzip group that a thread of every rank keeps busy with large compressed all-reduces
(its worker, its transport and the CPUs all taken) when the fault comes."""
import datetime
import os
import queue
import signal
import threading
import time

import pytest

from ranks import free_port, rank_processes

TIMEOUT = 5  # the groups' timeout, seconds
WORLD, VICTIM = 3, 2
SPECS = ["allreduce", "stc:density=0.01,exchange=oneshot", "stc:density=0.01,exchange=twophase",
         "fp16:exchange=twophase,rounds=4", "gossip:topology=ring", "choco:topology=ring,compress=sign,gamma=0.5"]


def _init_world(rank, world, port):
    """The default (Gloo) group with the groups' timeout for its collectives, over a store
    that waits a minute for the ranks to join: on two busy cores a rank's start can take
    longer than the 5 s under test, which are for the fault, not for the set-up."""
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT))


def _keep_busy(group):
    """All-reduces 2M elements on `group` until the group fails (once a peer is gone) or
    the process ends."""
    import torch
    import torch.distributed as dist
    x = torch.randn(2_000_000)
    try:
        while True:
            dist.all_reduce(x, group=group)
    except Exception:  # noqa: B902 - the busy group breaks with the fault; the test is the main group's
        pass


def _rank(rank, port, spec, fault, results, load=False, env=None, world=WORLD):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      OMP_NUM_THREADS="1", **(env or {}))
    import torch
    import torch.distributed as dist

    import gradzip
    timeout = datetime.timedelta(seconds=TIMEOUT)
    try:
        _init_world(rank, world, port)
        group = dist.new_group(backend="gradzip", pg_options=gradzip.Options(aggregation=spec), timeout=timeout)
        x = torch.randn(100_000)
        for _ in range(2):
            dist.all_reduce(x.clone(), group=group)
        if load:
            busy = dist.new_group(backend="gradzip", pg_options=gradzip.Options(aggregation="qsgd:bits=4"),
                                  timeout=timeout)
            threading.Thread(target=_keep_busy, args=(busy,), daemon=True).start()
            time.sleep(1.0)  # the busy group's calls are running on every rank
        if rank == VICTIM:
            results.put((rank, "fault", None))
            time.sleep(0.5)  # the others are inside the next all_reduce by now
            os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            return
        start = time.monotonic()
        try:
            dist.all_reduce(x.clone(), group=group)
            outcome = ("no error", time.monotonic() - start)
        except Exception as error:  # noqa: B902 - what the survivor sees is the result
            outcome = (str(error), time.monotonic() - start)
        os.environ.pop("GRADZIP_NODE_SIZE", None)  # the survivors no longer make whole nodes
        survivors = dist.new_group([r for r in range(world) if r != VICTIM], backend="gradzip",
                                   use_local_synchronization=True, timeout=timeout)
        ones = torch.full((1000,), float(rank + 1))
        dist.all_reduce(ones, group=survivors)
        results.put((rank, outcome, ones[0].item()))
    except BaseException as error:  # noqa: B902
        results.put((rank, ("setup failed: " + repr(error), 0.0), None))
    finally:
        results.close()
        results.join_thread()
        os._exit(0)  # the broken group is not torn down: its peer is gone


def run_fault(spec, fault, load=False, env=None, world=WORLD):
    ctx = rank_processes()
    results = ctx.Queue()
    port = free_port()
    return _outcomes(ctx, results, [(_rank, (r, port, spec, fault, results, load, env, world)) for r in range(world)])


def _outcomes(ctx, results, targets) -> dict:
    """Runs each (function, args) in a process of `ctx` and gathers what each rank puts in
    `results` ((rank, seen, value)) as {rank: (seen, value)}, for 120 s at most; kills what
    is left."""
    procs = [ctx.Process(target=target, args=args) for target, args in targets]
    for p in procs:
        p.start()
    outcome = {}
    deadline = time.monotonic() + 120
    try:
        while len(outcome) < len(procs) and time.monotonic() < deadline:
            try:
                rank, seen, value = results.get(timeout=1)
                outcome[rank] = (seen, value)
            except queue.Empty:
                pass
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
    return outcome


@pytest.mark.parametrize("fault", ["kill", "stop"])
@pytest.mark.parametrize("spec", SPECS)
def test_survivors_raise_in_time_and_regroup(spec, fault):
    check_survivors(run_fault(spec, fault))


@pytest.mark.parametrize("fault", ["kill", "stop"])
@pytest.mark.parametrize("spec", ["allreduce", "stc:density=0.01,exchange=twophase"])
def test_survivors_raise_in_time_beside_a_busy_group(spec, fault):
    check_survivors(run_fault(spec, fault, load=True))


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_survivors_raise_in_time_with_the_check_on_the_transport(fault):
    """The ranks share a host, so their collective check runs through shared memory; with
    it on the transport (GRADZIP_NODE_SHARED_MEMORY=0, as between hosts) as well."""
    check_survivors(run_fault("allreduce", fault, env={"GRADZIP_NODE_SHARED_MEMORY": "0"}))


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_survivors_raise_in_time_inside_a_hierarchical_call(fault):
    """2 nodes × 2 ranks (GRADZIP_NODE_SIZE=2), fp16 in 4 lane rounds: the node stage runs
    in the lane's rounds, a barrier of the node per round. Without the collective check
    (which would catch the victim before the call) the survivors enter the call: the
    victim's node partner waits in those barriers, the other node in the lane, and all
    raise in time."""
    env = {"GRADZIP_NODE_SIZE": "2", "GRADZIP_VALIDATE": "0"}
    check_survivors(run_fault("fp16:exchange=twophase,rounds=4", fault, env=env, world=4), world=4)


def _saving_rank(rank, port, fault, results):
    """Two compressed calls of a gradzip.Aggregation, then a portable checkpoint (a
    collective) that the victim never joins."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    import gradzip
    try:
        _init_world(rank, WORLD, port)
        aggregation = gradzip.Aggregation("topk:density=0.05")
        for _ in range(2):
            aggregation([torch.randn(10_000)])
        if rank == VICTIM:
            results.put((rank, "fault", None))
            time.sleep(0.5)  # the others are inside state_dict(portable=True) by now
            os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            return
        start = time.monotonic()
        try:
            aggregation.state_dict(portable=True)
            outcome = ("no error", time.monotonic() - start)
        except Exception as error:  # noqa: B902 - what the survivor sees is the result
            outcome = (f"{type(error).__name__}: {error}", time.monotonic() - start)
        results.put((rank, outcome, None))
    except BaseException as error:  # noqa: B902
        results.put((rank, ("setup failed: " + repr(error), 0.0), None))
    finally:
        results.close()
        results.join_thread()
        os._exit(0)


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_rank_lost_while_a_portable_checkpoint_is_taken_makes_the_others_raise_in_time(fault):
    """state_dict(portable=True) is a collective: a rank that dies (or stops) before joining
    it makes every other rank raise a CheckpointError within the group's timeout, naming the
    collective and the transport's own words; nothing is returned half-summed."""
    ctx = rank_processes()
    results = ctx.Queue()
    port = free_port()
    outcome = _outcomes(ctx, results, [(_saving_rank, (r, port, fault, results)) for r in range(WORLD)])
    assert outcome.get(VICTIM, (None,))[0] == "fault", outcome
    for rank in (r for r in range(WORLD) if r != VICTIM):
        assert rank in outcome, f"rank {rank} never reported: {outcome}"
        message, seconds = outcome[rank][0]
        assert message.startswith("CheckpointError: gradzip.Aggregation: state_dict(portable=True) is a collective "
                                  f"over the group's {WORLD} ranks, and it failed on rank {rank}"), message
        assert seconds < TIMEOUT + 5, (rank, seconds, message)


def check_survivors(outcome, world=WORLD):
    assert outcome.get(VICTIM, (None,))[0] == "fault", outcome
    survivors = [r for r in range(world) if r != VICTIM]
    for rank in survivors:
        assert rank in outcome, f"rank {rank} never reported: {outcome}"
        (message, seconds), regrouped = outcome[rank]
        assert message != "no error" and not message.startswith("setup failed"), (rank, message)
        assert seconds < TIMEOUT + 5, (rank, seconds, message)
        named = ["timed out", "timeout", "closed", "reset", "connection", "peer", "rank"]
        assert any(word in message.lower() for word in named), (rank, message)
        # gradzip names the call that failed, then gives the transport's own words.
        assert message.startswith("gradzip: all_reduce") and f"on rank {rank} of {world}" in message, (rank, message)
        assert regrouped == sum(r + 1 for r in survivors), f"rank {rank}: the survivors' group summed to {regrouped}"


def blocked_call(rank, world, how):
    """Rank 1 never joins the second all_reduce: rank 0's wait ends by abort() from another
    thread, or by Work.wait's own timeout, long before the group's (60 s). Rank 1 then
    destroys its group, which ends the call rank 0 still has running at once: the next
    test's ranks do not wait for it."""
    import threading

    import torch
    import torch.distributed as dist

    import gradzip
    dist.init_process_group("gloo")
    group = dist.new_group(backend="gradzip", pg_options=gradzip.Options(aggregation="stc:density=0.01"),
                           timeout=datetime.timedelta(seconds=60))
    dist.all_reduce(torch.ones(1000), group=group)
    if rank == 1:
        dist.barrier()  # the default group's: rank 0's wait has ended
        return None
    start = time.monotonic()
    try:
        if how == "abort":
            threading.Timer(1.0, group.abort).start()
            dist.all_reduce(torch.ones(100_000), group=group)
        else:
            work = dist.all_reduce(torch.ones(100_000), group=group, async_op=True)
            work.wait(timeout=datetime.timedelta(seconds=1))
        outcome = "no error", time.monotonic() - start
    except Exception as error:  # noqa: B902
        outcome = str(error), time.monotonic() - start
    dist.barrier()
    return outcome


@pytest.mark.parametrize("how,words", [("abort", "aborted"), ("timeout", "timeout of 1000 ms")])
def test_a_waiting_all_reduce_ends_by_abort_or_by_its_wait_timeout(how, words):
    from ranks import run_ranks
    (message, seconds), _ = run_ranks(blocked_call, 2, how)
    assert words in message, message
    assert 0.9 < seconds < 3, seconds


def peer_destroys_its_group(rank, world):
    """Rank 1 destroys its gradzip group (60 s timeout) and lets go of it instead of making
    the call rank 0 waits in: rank 0 raises at once, as a Gloo group's peer does when the
    connections close."""
    import torch
    import torch.distributed as dist

    import gradzip
    dist.init_process_group("gloo")
    group = dist.new_group(backend="gradzip", pg_options=gradzip.Options(aggregation="stc:density=0.01"),
                           timeout=datetime.timedelta(seconds=60))
    dist.all_reduce(torch.ones(1000), group=group)
    if rank == 1:
        dist.destroy_process_group(group)
        del group
        dist.barrier()
        return None
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(100_000), group=group)
        outcome = "no error", time.monotonic() - start
    except Exception as error:  # noqa: B902
        outcome = str(error), time.monotonic() - start
    dist.barrier()
    return outcome


@pytest.mark.parametrize("shared_memory", ["1", "0"])
def test_a_peer_that_destroys_its_group_ends_the_others_wait(shared_memory):
    from ranks import run_ranks
    (message, seconds), _ = run_ranks(peer_destroys_its_group, 2, env={"GRADZIP_NODE_SHARED_MEMORY": shared_memory})
    assert message.startswith("gradzip: all_reduce") and "on rank 0 of 2" in message, message
    if shared_memory == "1":
        assert "rank 1 shut down or aborted its process group" in message, message
    assert seconds < 5, (seconds, message)
