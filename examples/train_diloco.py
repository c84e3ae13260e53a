"""Trains a small CNN on Fashion-MNIST with DiLoCo: local AdamW steps, then a compressed
outer step (gradzip.diloco).

    torchrun --standalone --nproc-per-node 4 examples/train_diloco.py --spec qsgd:bits=4,norm=max,ef=1
    torchrun --standalone --nproc-per-node 4 examples/train_diloco.py --spec allreduce   # uncompressed

Each rank trains its own replica on its shard for --local-steps steps with no
communication; then the ranks average their pseudo-gradients (θ_start − θ) with --spec and
take an outer Nesterov step. Epochs end on an outer step, so the test accuracy is the
shared model's. Rank 0 prints each epoch's loss, accuracy and time, and the bytes each
rank sent against what DDP with a dense fp32 all-reduce of every step's gradients sends
for the same samples; the last line is a JSON summary.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import gradzip
from fashion_mnist import SmallCNN, evaluate, load


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3, help="inner AdamW")
    parser.add_argument("--local-steps", type=int, default=20, help="H: inner steps between outer steps")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=None, help="cut each epoch short (smoke tests)")
    parser.add_argument("--spec", default="qsgd:bits=4,norm=max,ef=1", help="outer aggregation spec (allreduce: exact)")
    args = parser.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    gradzip.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    train_x, train_y = load("train")
    test_x, test_y = load("test")

    torch.manual_seed(args.seed)
    model = SmallCNN()
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    outer = gradzip.diloco.DiLoCo(model, args.spec, local_steps=args.local_steps, outer_lr=args.outer_lr)
    params = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"gradzip {gradzip.__version__}: DiLoCo on {world} ranks, H={args.local_steps}, outer "
              f"'{outer.aggregation.spec}', {params} parameters", flush=True)

    start, accuracy, inner_steps = time.perf_counter(), 0.0, 0
    for epoch in range(1, args.epochs + 1):
        epoch_start = time.perf_counter()
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        shard = order[rank::world]
        steps = min(len(shard) // args.batch_size, args.max_steps or len(shard))
        steps -= steps % args.local_steps  # the epoch ends on an outer step
        loss_sum = torch.zeros(2, dtype=torch.float64)
        for step in range(steps):
            batch = shard[step * args.batch_size:(step + 1) * args.batch_size]
            loss = F.cross_entropy(model(train_x[batch]), train_y[batch])
            inner.zero_grad(set_to_none=True)
            loss.backward()
            inner.step()
            outer.step()
            loss_sum += torch.tensor([loss.item(), 1.0], dtype=torch.float64)
        inner_steps += steps
        dist.all_reduce(loss_sum)
        accuracy = evaluate(model, test_x, test_y, rank, world)
        sent = outer.stats()["bytes_sent"]
        ddp = inner_steps * 2 * (world - 1) * params * 4 // world
        if rank == 0:
            print(f"epoch {epoch}/{args.epochs}: loss {loss_sum[0] / loss_sum[1]:.4f}  test accuracy {accuracy:.2%}  "
                  f"time {time.perf_counter() - epoch_start:.1f} s  sent {sent / 1e6:.2f} MB per rank so far, "
                  f"{ddp / max(sent, 1):.0f}x fewer bytes than DDP dense fp32", flush=True)
    if rank == 0:
        print(json.dumps({"spec": str(outer.aggregation.spec), "ranks": world, "local_steps": args.local_steps,
                          "epochs": args.epochs, "accuracy": accuracy, "bytes_sent": sent, "ddp_dense_bytes": ddp,
                          "seconds": time.perf_counter() - start}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
