"""Trains a small CNN on Fashion-MNIST with DDP over the gradzip backend.

    torchrun --standalone --nproc-per-node 4 examples/train_fashion_mnist.py --epochs 3
    mpirun -np 4 python examples/train_fashion_mnist.py --epochs 3

The data are Debian's dataset-fashion-mnist IDX files (no download). Each rank trains on
its shard of the training set; the test set is evaluated by all ranks together. The
gradients are aggregated with --spec (default $GRADZIP_AGGREGATION, else exact). Rank 0
prints a progress bar per epoch, then the epoch's loss, test accuracy, time, the bytes
each rank sent in all-reduces and how many times fewer that is than dense fp32
(gradzip.stats()).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import gradzip
from fashion_mnist import SmallCNN, evaluate, load


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=None,
                        help="SGD's momentum (default 0.9; 0 when the spec's `momentum` key moves it into the aggregation)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=None, help="cut each epoch short (smoke tests)")
    parser.add_argument("--spec", default=None, help="aggregation spec (default: $GRADZIP_AGGREGATION or allreduce)")
    parser.add_argument("--door", choices=("backend", "hook"), default="backend",
                        help="backend: DDP's all-reduces go through the gradzip group's aggregation (flat "
                             "buckets); hook: gradzip's DDP comm hook with the model, which knows each bucket's "
                             "parameters (layer-aware compression, docs/spec.md `layers`)")
    args = parser.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=args.spec))
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = gradzip.Options(aggregation=args.spec).resolved_spec()

    train_x, train_y = load("train")
    test_x, test_y = load("test")
    torch.manual_seed(args.seed)
    model = DDP(SmallCNN())
    # With momentum correction (a spec's `momentum` key) the aggregation keeps the
    # velocity, so the optimizer must not keep one too.
    momentum = args.momentum if args.momentum is not None else 0.0 if "momentum" in spec.params else 0.9
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=momentum)
    counters = gradzip  # stats() and reset_stats(): the bytes each rank sent in all-reduces
    if args.door == "hook":
        # Given the optimizer, the hook moves its momentum into the aggregation where the
        # codec takes it (top-k, random-k, STC, sign): momentum correction.
        counters = gradzip.hooks.State(spec, model=model, optimizer=opt)
        model.register_comm_hook(counters, gradzip.hooks.hook)
        spec = counters.spec
    else:
        # The same at the backend: the group's aggregation takes the optimizer's momentum.
        spec = gradzip.fold_momentum(opt)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"gradzip {gradzip.__version__}: {world} ranks, aggregation '{spec}', {params} parameters, "
              f"{len(train_x)} training and {len(test_x)} test images", flush=True)

    start, accuracy = time.perf_counter(), 0.0
    for epoch in range(1, args.epochs + 1):
        counters.reset_stats()
        epoch_start = time.perf_counter()
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        shard = order[rank::world]
        steps = min(len(shard) // args.batch_size, args.max_steps or len(shard))
        loss_sum = torch.zeros(2, dtype=torch.float64)
        bar = tqdm(range(steps), desc=f"epoch {epoch}/{args.epochs}", disable=rank != 0, leave=False,
                   mininterval=1.0, ncols=80)
        for step in bar:
            batch = shard[step * args.batch_size:(step + 1) * args.batch_size]
            loss = F.cross_entropy(model(train_x[batch]), train_y[batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += torch.tensor([loss.item(), 1.0], dtype=torch.float64)
        dist.all_reduce(loss_sum)
        accuracy = evaluate(model, test_x, test_y, rank, world)
        stats = counters.stats()
        sent = torch.tensor([stats["bytes_sent"]], dtype=torch.int64)
        everyone = [torch.zeros_like(sent) for _ in range(world)]
        dist.all_gather(everyone, sent)
        if rank == 0:
            per_rank = ", ".join(f"{t.item() / 1e6:.2f}" for t in everyone)
            ratio = stats["dense_bytes"] / max(stats["bytes_sent"], 1)
            print(f"epoch {epoch}/{args.epochs}: loss {loss_sum[0] / loss_sum[1]:.4f}  test accuracy "
                  f"{accuracy:.2%}  time {time.perf_counter() - epoch_start:.1f} s  "
                  f"sent per rank [{per_rank}] MB  ({ratio:.1f}x fewer bytes than dense fp32)", flush=True)
    if rank == 0:
        print(f"final test accuracy: {accuracy:.2%} after {args.epochs} epochs in "
              f"{time.perf_counter() - start:.1f} s with '{spec}'", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
