"""Runs a test function on real ranks: one process per rank on this machine.

run_ranks(fn, world_size, *args) calls fn(rank, world_size, *args) in every rank with
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set, and returns the values
the ranks returned, in rank order. A rank that raises fails the call with its traceback;
ranks that have not finished within `timeout` seconds (15 s after another rank failed)
are killed and the call fails: a test never hangs.

The rank processes are started once per world size and kept for the next call (starting
a rank, mostly importing torch, is most of a short test's time on two cores). Each call
starts like a fresh process: its own MASTER_PORT, the environment as it was plus `env`,
torch's default generator at its initial seed, no process group (destroyed after every
call). A call that fails in any way ends the processes; the next call starts new ones.

rank_processes() is the multiprocessing context that starts them (and the fault tests'
ranks): forked from a server that imported torch and gradzip once, which takes a rank's
start from about 4 CPU-seconds to a fork.
"""
import io
import multiprocessing
import multiprocessing.util
import os
import queue
import random
import socket
import time
import traceback


def _ephemeral_ports_start() -> int:
    """The first port of the range the kernel hands out by itself (32768 by default)."""
    try:
        return int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port that no socket holds now, drawn at random from the 12000 below the kernel's
    ephemeral range. A port from that range (what a bind to port 0 returns) is handed out
    again by the kernel to any socket bound to port 0 or connecting out, another pytest
    worker's Gloo among them, before the ranks listen on it: a rank's store then failed
    to start (EADDRINUSE)."""
    end = _ephemeral_ports_start()
    draw = random.SystemRandom()
    for _ in range(200):
        port = draw.randrange(max(1024, end - 12000), end)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port below {end} after 200 draws")


def rank_processes():
    """multiprocessing's forkserver context, its server preloading torch and gradzip.
    Nothing in them starts a thread at import, so the forks are clean; the server (and
    so every rank) runs with OMP_NUM_THREADS=1, which OpenMP reads when it is loaded."""
    os.environ["OMP_NUM_THREADS"] = "1"
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "gradzip"])
    return ctx


def _rank_loop(rank, world_size, tasks, results):
    import torch
    import torch.distributed as dist
    initial_seed = torch.initial_seed()
    while True:
        task = tasks.get()
        if task is None:
            return
        fn, port, args, env = task
        saved = dict(os.environ)
        os.environ.update(env)
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        torch.manual_seed(initial_seed)
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
            os.environ.clear()
            os.environ.update(saved)


class _Ranks:
    """world_size processes running _rank_loop."""

    def __init__(self, world_size):
        ctx = rank_processes()
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(world_size)]
        self.procs = [ctx.Process(target=_rank_loop, args=(r, world_size, self.tasks[r], self.results))
                      for r in range(world_size)]
        for p in self.procs:
            p.start()

    def close(self, kill):
        for q, p in zip(self.tasks, self.procs):
            if not kill and p.is_alive():
                q.put(None)
        for p in self.procs:
            if not kill:
                p.join(timeout=30)
            if p.is_alive():
                p.kill()
            p.join()


_kept = {}


def _close_all():
    for ranks in _kept.values():
        ranks.close(kill=False)
    _kept.clear()


# At exit, multiprocessing joins every child it started; an atexit hook registered before
# its own would run after that join and never tell the kept ranks to stop. A finalizer
# with an exit priority runs first.
multiprocessing.util.Finalize(None, _close_all, exitpriority=100)


def run_ranks(fn, world_size, *args, timeout=240, env=None):
    ranks = _kept.pop(world_size, None) or _Ranks(world_size)
    port = free_port()
    for q in ranks.tasks:
        q.put((fn, port, args, env or {}))
    procs, results = ranks.procs, ranks.results
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
        clean = len(outcome) == world_size and all(ok for ok, _ in outcome.values())
        if clean:
            _kept[world_size] = ranks
        else:
            ranks.close(kill=True)
    problems += [f"--- rank {r} ---\n{value}" for r, (ok, value) in sorted(outcome.items()) if not ok]
    if problems:
        raise AssertionError("\n".join(problems))
    import torch
    return [torch.load(io.BytesIO(outcome[r][1]), weights_only=False) for r in range(world_size)]
