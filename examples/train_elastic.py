"""A job that loses a rank trains on at the world size that remains: it resumes from its
last checkpoint, the hook's error feedback carried across the change of world size
(state_dict(portable=True), docs/spec.md, "Checkpoints").

    torchrun --standalone --nproc-per-node 4 examples/train_elastic.py --checkpoint /tmp/elastic.pt
    # a rank is lost: the job stops; start it again with the ranks that remain
    torchrun --standalone --nproc-per-node 3 examples/train_elastic.py --checkpoint /tmp/elastic.pt

torchrun's elastic agents (--nnodes MIN:MAX --max-restarts N, one per node) restart the
script the same way by themselves when a node is lost, given a rendezvous store that
outlives the agents (examples/rendezvous_store.py gives the commands);
tests/python/test_elastic.py runs the relaunch above, and 4 agents losing the node of rank 0.

The task is synthetic (a random teacher network labels Gaussian inputs) so that it runs
anywhere. Every step takes the same global batch whatever the world size (each rank its
equal share), so a run's trajectory depends on the world size only through rounding.
Every --every steps the ranks save one checkpoint together (rank 0 writes it); a restarted
job loads it. Rank 0 prints each start ("start at step S with W ranks") and the test
accuracy at the end.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import gradzip

GLOBAL_BATCH = 96  # divisible by 2, 3 and 4 ranks


def data(n, seed):
    """Inputs and the labels a fixed random teacher gives them."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
    with torch.no_grad():
        for p in teacher.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(7)) * 0.5)
        x = torch.randn(n, 32, generator=g)
        return x, teacher(x).argmax(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument("--spec", default=os.environ.get("GRADZIP_AGGREGATION", "topk:density=0.05"))
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = gradzip.hooks.State(args.spec, model=ddp, optimizer=opt)
    ddp.register_comm_hook(state, gradzip.hooks.hook)

    start = 0
    if os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        state.load_state_dict(saved["hook"])
        start = saved["step"]
    if rank == 0:
        print(f"start at step {start} with {world} ranks", flush=True)

    x, y = data(GLOBAL_BATCH * args.steps, seed=1)
    share = GLOBAL_BATCH // world
    for step in range(start, args.steps):
        first = step * GLOBAL_BATCH + rank * share
        opt.zero_grad()
        F.cross_entropy(ddp(x[first:first + share]), y[first:first + share]).backward()
        opt.step()
        if (step + 1) % args.every == 0:
            hook = state.state_dict(portable=True)  # a collective: every rank
            if rank == 0:
                saved = {"model": model.state_dict(), "optimizer": opt.state_dict(), "hook": hook, "step": step + 1}
                torch.save(saved, args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
            dist.barrier()

    test_x, test_y = data(4096, seed=2)
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    if rank == 0:
        print(f"finished {args.steps} steps with {world} ranks: test accuracy {100 * accuracy:.2f}%", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
