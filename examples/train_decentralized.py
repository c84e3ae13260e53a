"""Trains a small CNN on Fashion-MNIST decentralized: no all-reduce, each rank gossips.

    torchrun --standalone --nproc-per-node 8 examples/train_decentralized.py --spec gossip:topology=exp
    torchrun --standalone --nproc-per-node 8 examples/train_decentralized.py \\
        --spec choco:topology=ring,compress=sign,block=64,gamma=0.5
    mpirun -np 8 python examples/train_decentralized.py --spec gossip:topology=onepeer

Each rank keeps its own model and trains on its shard; after every optimizer step it
averages its parameters with its neighbours only (gradzip.Aggregation(spec)(model): D-PSGD
for gossip specs, CHOCO-SGD for choco specs). The replicas differ, so rank 0 reports the
test accuracy of their average (computed for the report only, not sent in training), how
far the replicas are from it (consensus distance), and the bytes each rank sent.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import gradzip
from fashion_mnist import SmallCNN, evaluate, load


def averaged_copy(model, world):
    """The average of every rank's model (exact, for evaluation) and the replicas' RMS
    distance to it."""
    average = SmallCNN()
    average.load_state_dict(model.state_dict())
    distance = torch.zeros(1, dtype=torch.float64)
    for mine, mean in zip(model.parameters(), average.parameters()):
        dist.all_reduce(mean.data, op=dist.ReduceOp.AVG)
        distance += (mine.detach() - mean.detach()).double().pow(2).sum()
    dist.all_reduce(distance, op=dist.ReduceOp.AVG)
    return average, distance.sqrt().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="gossip:topology=exp", help="a gossip or choco spec (docs/spec.md)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=None, help="cut each epoch short (smoke tests)")
    args = parser.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    gradzip.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    gossip = gradzip.Aggregation(args.spec)
    if not gossip.decentralized:
        raise SystemExit(f"--spec {args.spec!r} is not decentralized: give a gossip or choco spec")
    train_x, train_y = load("train")
    test_x, test_y = load("test")
    torch.manual_seed(args.seed)  # every replica starts from the same weights
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if rank == 0:
        print(f"gradzip {gradzip.__version__}: {world} ranks, decentralized '{gossip.spec}'", flush=True)

    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        gossip.reset_stats()
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        shard = order[rank::world]
        steps = min(len(shard) // args.batch_size, args.max_steps or len(shard))
        for step in range(steps):
            batch = shard[step * args.batch_size:(step + 1) * args.batch_size]
            loss = F.cross_entropy(model(train_x[batch]), train_y[batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            gossip(model)  # average the parameters with the neighbours
        average, distance = averaged_copy(model, world)
        accuracy = evaluate(average, test_x, test_y, rank, world)
        sent = gossip.stats()["bytes_sent"]
        if rank == 0:
            print(f"epoch {epoch}/{args.epochs}: test accuracy of the averaged model {accuracy:.2%}  consensus "
                  f"distance {distance:.4f}  sent by rank 0 {sent / 1e6:.2f} MB  "
                  f"time {time.perf_counter() - start:.1f} s", flush=True)
    if rank == 0:
        print(f"final test accuracy: {accuracy:.2%} after {args.epochs} epochs with '{gossip.spec}'", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
