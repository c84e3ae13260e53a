"""Runs a test function on real ranks: one spawned process per rank on this machine.

run_ranks(fn, world_size, *args) calls fn(rank, world_size, *args) in every rank with
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set, and returns the values
the ranks returned, in rank order. A rank that raises fails the call with its traceback;
ranks that have not finished within `timeout` seconds (15 s after another rank failed)
are killed and the call fails: a test never hangs.
"""
import io
import multiprocessing
import os
import queue
import socket
import time
import traceback


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn, rank, world_size, port, args, env, results):
    os.environ.update(env)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist
    try:
        # Results travel as torch.save bytes: a tensor put on the queue directly would be
        # shared through memory that disappears when this process exits.
        value = io.BytesIO()
        torch.save(fn(rank, world_size, *args), value)
        results.put((rank, True, value.getvalue()))
    except BaseException:  # noqa: B902 - every failure goes back to the test
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn, world_size, *args, timeout=240, env=None):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, port, args, env or {}, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    outcome, deadline, problems = {}, time.monotonic() + timeout, []
    try:
        while len(outcome) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world_size)) - set(outcome))
                problems.append(f"ranks {missing} did not finish in time (killed)")
                break
            try:
                rank, ok, value = results.get(timeout=min(left, 1.0))
                outcome[rank] = (ok, value)
                if not ok:  # the others may be blocked on the failed rank: give them a little while
                    deadline = min(deadline, time.monotonic() + 15)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in outcome and p.exitcode is not None]
                if dead:
                    time.sleep(0.5)  # a result may still be in flight
                    while not results.empty():
                        rank, ok, value = results.get()
                        outcome[rank] = (ok, value)
                    dead = [r for r in dead if r not in outcome]
                    if dead:
                        problems.append(f"ranks {dead} died with exit codes {[procs[r].exitcode for r in dead]}")
                        break
    finally:
        finished = len(outcome) == world_size
        for p in procs:
            if finished:
                p.join(timeout=30)
            if p.is_alive():
                p.kill()
            p.join()
    problems += [f"--- rank {r} ---\n{value}" for r, (ok, value) in sorted(outcome.items()) if not ok]
    if problems:
        raise AssertionError("\n".join(problems))
    import torch
    return [torch.load(io.BytesIO(outcome[r][1]), weights_only=False) for r in range(world_size)]
