"""CPU a rank spends waiting for a late peer over the MPI transport.

    mpirun --allow-run-as-root --oversubscribe -np 4 .venv/bin/python benchmarks/late_peer.py
    mpiexec.mpich -n 4 .venv/bin/python benchmarks/late_peer.py      (a build against MPICH)

Rank 0 sleeps --late seconds before an all_reduce of 10 elements, then before sending 10
elements to every other rank; each other rank prints the process CPU time
(time.process_time(), every thread) it used over each wait, and the wait's length. With
--check F (tests/python/test_mpi.py), a wait that used more than F of a core fails the run.
"""
import argparse
import time

import torch
import torch.distributed as dist

import gradzip


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--late", type=float, default=2.0, help="seconds rank 0 joins late")
    parser.add_argument("--check", type=float, default=None, metavar="F",
                        help="exit 1 when a wait used more than F CPU seconds per second")
    args = parser.parse_args()
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(transport="mpi"))
    rank, size = dist.get_rank(), dist.get_world_size()
    for call in ("all_reduce", "recv"):
        dist.barrier()
        t = torch.ones(10)
        if rank == 0:
            time.sleep(args.late)
            if call == "all_reduce":
                dist.all_reduce(t)
            else:
                for peer in range(1, size):
                    dist.send(t, peer, tag=7)
            continue
        start, cpu = time.monotonic(), time.process_time()
        if call == "all_reduce":
            dist.all_reduce(t)
        else:
            dist.recv(t, 0, tag=7)
        wall, cpu = time.monotonic() - start, time.process_time() - cpu
        print(f"{call} wait, rank {rank}: {cpu:.3f} CPU s in {wall:.3f} s", flush=True)
        if args.check is not None and not (wall > args.late / 2 and cpu <= args.check * wall):
            raise SystemExit(f"rank {rank}: the {call} wait used {cpu:.3f} CPU s in {wall:.3f} s "
                             f"(at most {args.check} of a core allowed, a wait of about {args.late} s expected)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
