"""Trains a small CNN on Fashion-MNIST with FSDP2 and gradzip's compressed reduce-scatter.

    torchrun --standalone --nproc-per-node 4 examples/train_fsdp.py --spec qsgd:bits=4
    torchrun --standalone --nproc-per-node 4 examples/train_fsdp.py --spec allreduce   # exact

Every layer is its own FSDP module (fully_shard over a CPU mesh on a Gloo group), and
gradzip.fsdp.compress() gives each one the compressed reduce-scatter with error feedback
(the spec "allreduce" keeps the transport's exact reduce-scatter and counts its bytes).
Rank 0 prints each epoch's loss, test accuracy, time, and the bytes each rank sent in
reduce-scatters against a dense fp32 ring's; the last line is a JSON summary.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import gradzip
from fashion_mnist import SmallCNN, evaluate, load


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=None, help="cut each epoch short (smoke tests)")
    parser.add_argument("--spec", default="qsgd:bits=4", help="reduce-scatter spec (allreduce: exact)")
    args = parser.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    gradzip.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    train_x, train_y = load("train")
    test_x, test_y = load("test")

    torch.manual_seed(args.seed)
    model = SmallCNN()
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model.conv1, model.conv2, model.fc1, model.fc2):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # With momentum correction (a spec's `momentum` key) the reduce-scatter keeps the
    # velocity, so the optimizer must not keep one too. Given the optimizer, compress()
    # moves its momentum into the reduce-scatter where the codec takes it (STC, top-k).
    momentum = 0.0 if "momentum" in gradzip.Spec(args.spec).params else 0.9
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=momentum)
    state = gradzip.fsdp.compress(model, args.spec, optimizer=opt)
    if rank == 0:
        print(f"gradzip {gradzip.__version__}: FSDP2 on {world} ranks, reduce-scatter '{state.spec}'", flush=True)

    start, accuracy, sent, dense = time.perf_counter(), 0.0, 0, 0
    for epoch in range(1, args.epochs + 1):
        epoch_start = time.perf_counter()
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        shard = order[rank::world]
        steps = min(len(shard) // args.batch_size, args.max_steps or len(shard))
        loss_sum = torch.zeros(2, dtype=torch.float64)
        for step in range(steps):
            batch = shard[step * args.batch_size:(step + 1) * args.batch_size]
            loss = F.cross_entropy(model(train_x[batch]), train_y[batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += torch.tensor([loss.item(), 1.0], dtype=torch.float64)
        dist.all_reduce(loss_sum)
        accuracy = evaluate(model, test_x, test_y, rank, world)
        stats = state.stats()
        sent, dense = stats["bytes_sent"], stats["dense_bytes"]
        if rank == 0:
            print(f"epoch {epoch}/{args.epochs}: loss {loss_sum[0] / loss_sum[1]:.4f}  test accuracy {accuracy:.2%}  "
                  f"time {time.perf_counter() - epoch_start:.1f} s  reduce-scatter sent {sent / 1e6:.2f} MB per "
                  f"rank so far ({dense / max(sent, 1):.1f}x fewer bytes than dense fp32)", flush=True)
    if rank == 0:
        print(json.dumps({"spec": str(state.spec), "ranks": world, "epochs": args.epochs, "accuracy": accuracy,
                          "bytes_sent": sent, "dense_bytes": dense, "seconds": time.perf_counter() - start}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
