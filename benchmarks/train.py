"""Time- and bytes-to-accuracy on Fashion-MNIST: gradzip against PyTorch's own comm hooks.

    torchrun --standalone --nproc-per-node 4 benchmarks/train.py
    mpirun -np 4 python benchmarks/train.py
    sudo benchmarks/netns.sh --ranks 4 --rate 1gbit -- .venv/bin/python benchmarks/train.py
    torchrun --standalone --nproc-per-node 8 benchmarks/train.py --methods decentralized
    sudo benchmarks/netns.sh --ranks 4 --rate 1gbit -- .venv/bin/python benchmarks/train.py \
        --model mlp --methods network --epochs 10 --max-steps 30 --target dense-0.005 --stop-at-target

Every method trains the same model (--model: "cnn", the small CNN of
examples/fashion_mnist.py, or "mlp", a 784-3072-3072-10 MLP of 11.9M parameters whose
dense gradient exchange dominates a step at 1 Gbit/s) from the same seed, on the same
shards, for the same epochs, one after the other in one launch:
  none              DDP, dense all-reduce (no hook)
  torch-fp16        DDP with PyTorch's fp16_compress_hook
  torch-powersgd-R  DDP with PyTorch's powerSGD_hook, rank R (error feedback, warm start,
                    compressing from iteration 2)
  <gradzip spec>    DDP with gradzip.hooks (e.g. stc:density=0.01), given the model and
                    the optimizer as a user would (SGD's momentum folds into momentum
                    correction where the codec takes it); or, for gossip and choco specs,
                    no DDP: gradzip.Aggregation(spec)(model) after each step, and the
                    accuracy is that of the ranks' averaged model
  backend:<spec>    DDP over a gradzip process group whose all_reduce is <spec> (no hook)
  METHOD@LR         any of these at its own learning rate (default: --lr)
Per epoch: test accuracy, training wall time (evaluation excluded), and bytes sent per
rank (the most any rank sent; gradzip.stats() counts PyTorch's hooks through an exact
gradzip group). Before the methods, the compute-only step time (forward, backward and
step without DDP, the slowest rank's) is measured: a method's step time over it shows
how much communication it leaves unhidden. With --target, the table gives the training
time at the first epoch whose accuracy reaches it. Rank 0 shows a progress bar, prints
a table, writes JSON and two plots (accuracy against bytes, accuracy against time).

Time to accuracy: --target dense-0.005 is the accuracy the first method ("none", dense)
ends at, less half a point; --stop-at-target ends each later method at the first epoch
that reaches the target or whose training time has passed the first method's, however
many epochs that takes (a method no faster than dense gains nothing by running on).
--target-window N judges both by the mean accuracy of the last N evaluations: at a
constant learning rate one evaluation can sit a point above or below its neighbours,
and would otherwise set the target or reach it by chance. Gradzip specs with momentum
correction (a `momentum` key) move the momentum into the aggregation: their SGD runs
without its own, as examples/train_fashion_mnist.py does.
"""
import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import gradzip

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from fashion_mnist import SmallCNN, evaluate, load  # noqa: E402

METHODS = {
    "hooks": ["none", "torch-fp16", "torch-powersgd-1", "torch-powersgd-4", "topk:density=0.01",
              "stc:density=0.01", "sign", "qsgd:bits=4"],
    "decentralized": ["none", "gossip:topology=exp", "gossip:topology=onepeer", "gossip:topology=ring",
                      "choco:topology=exp,compress=sign,block=64,gamma=0.5",
                      "choco:topology=exp,compress=topk,density=0.1,gamma=0.2"],
    "quick": ["none", "torch-fp16", "torch-powersgd-1", "stc:density=0.01", "gossip:topology=ring",
              "backend:sign"],
    "network": ["none", "torch-fp16", "torch-powersgd-4", "stc:density=0.01", "topk:density=0.01", "sign",
                "qsgd:bits=4", "stc:density=0.01,momentum=0.9,density_warmup=234"],
}


class WideMLP(torch.nn.Module):
    """784-3072-3072-10: 11.9M parameters, a 47.5 MB fp32 gradient."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 3072), torch.nn.ReLU(),
                                          torch.nn.Linear(3072, 3072), torch.nn.ReLU(), torch.nn.Linear(3072, 10))

    def forward(self, x):
        return self.layers(x)


MODELS = {"cnn": SmallCNN, "mlp": WideMLP}


class Method:
    """One way to train: wraps the model and counts the bytes it sends."""

    def __init__(self, name, group, lr):
        self.name = name
        self.kind = name.partition("@")[0]
        self.lr = Method.lr_of(name, lr)
        name = self.kind  # what follows reads the method, not its learning rate
        self.group = group
        self.gossip = None
        self.hook_spec = None  # the DDP hook's spec; its State is made in wrap(), with the model
        self.hook_state = None
        if name.startswith("backend:"):
            self.group = dist.new_group(backend="gradzip",
                                        pg_options=gradzip.Options(aggregation=name.split(":", 1)[1]))
        elif name.startswith(("gossip", "choco")):
            self.gossip = gradzip.Aggregation(name, group=group)
        elif name not in ("none", "torch-fp16") and not name.startswith(("torch-powersgd-", "backend:")):
            self.hook_spec = gradzip.Spec(name)

    @staticmethod
    def lr_of(name, lr):
        """The learning rate of "METHOD@LR" (the method at its own), else lr."""
        own = name.partition("@")[2]
        return float(own) if own else lr

    def wrap(self, model):
        """The model to train and its SGD, the comm hook registered."""
        opt = torch.optim.SGD(model.parameters(), lr=self.lr, momentum=self.momentum())
        if self.gossip is not None:
            return model, opt
        ddp = DDP(model, process_group=self.group)
        kind = self.kind
        if kind == "torch-fp16":
            ddp.register_comm_hook(self.group, default_hooks.fp16_compress_hook)
        elif kind.startswith("torch-powersgd-"):
            state = powerSGD_hook.PowerSGDState(process_group=self.group,
                                                matrix_approximation_rank=int(kind.rsplit("-", 1)[1]),
                                                start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        elif self.hook_spec is not None:
            # As a user would: the optimizer given, its momentum folds into momentum
            # correction where the codec takes it (gradzip.hooks.fold_optimizer_momentum).
            self.hook_state = gradzip.hooks.State(self.hook_spec, process_group=self.group, model=ddp,
                                                  optimizer=opt)
            ddp.register_comm_hook(self.hook_state, gradzip.hooks.hook)
        return ddp, opt

    def after_step(self, model):
        if self.gossip is not None:
            self.gossip(model)

    def momentum(self):
        """SGD's momentum: none where the spec moves it into the aggregation."""
        kind = self.kind
        spec = kind.split(":", 1)[1] if kind.startswith("backend:") else kind
        if kind in ("none", "torch-fp16") or kind.startswith("torch-powersgd-") or self.gossip is not None:
            return 0.9
        return 0.0 if "momentum" in gradzip.Spec(spec).params else 0.9

    def bytes_sent(self):
        if self.gossip is not None:
            return self.gossip.stats()["bytes_sent"]
        if self.hook_state is not None:
            return self.hook_state.stats()["bytes_sent"]
        return gradzip.stats(self.group)["bytes_sent"]


def averaged(model, world, make):
    """The average of every rank's replica, for evaluating decentralized training."""
    average = make()
    average.load_state_dict(model.state_dict())
    for p in average.parameters():
        dist.all_reduce(p.data, op=dist.ReduceOp.AVG)
    return average


def compute_only(args, data, rank):
    """Seconds per step of forward, backward and step without DDP (the slowest rank's,
    median of 10 steps after 2 of warm-up), every rank computing at once."""
    train_x, train_y = data[0], data[1]
    torch.manual_seed(args.seed)
    model = MODELS[args.model]()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    times = []
    for step in range(12):
        batch = torch.arange(step * args.batch_size, (step + 1) * args.batch_size) + rank * 12 * args.batch_size
        dist.barrier()
        start = time.perf_counter()
        loss = F.cross_entropy(model(train_x[batch]), train_y[batch])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if step >= 2:
            times.append(elapsed.item())
    return sorted(times)[len(times) // 2]


def train(name, args, data, rank, world, group, target=None, budget=None):
    """Trains `name` for args.epochs epochs; with `target` and `budget`, until the first
    epoch that reaches the target accuracy or ends past `budget` seconds, however many
    epochs that takes."""
    train_x, train_y, test_x, test_y = data
    torch.manual_seed(args.seed)
    method = Method(name, group, args.lr)
    base = MODELS[args.model]()
    model, opt = method.wrap(base)
    per_epoch = min(len(train_x) // world // args.batch_size, args.max_steps or len(train_x))
    schedule = learning_rate_schedule(opt, args.lr_schedule, args.epochs * per_epoch)
    epochs, elapsed, steps_done = [], 0.0, 0
    epoch = 0
    while epoch < args.epochs or target is not None:
        epoch += 1
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        shard = order[rank::world]
        steps = min(len(shard) // args.batch_size, args.max_steps or len(shard))
        dist.barrier()
        start = time.perf_counter()
        for step in tqdm(range(steps), desc=f"{name} {epoch}", disable=rank != 0, leave=False,
                         mininterval=1.0, ncols=100):
            batch = shard[step * args.batch_size:(step + 1) * args.batch_size]
            loss = F.cross_entropy(model(train_x[batch]), train_y[batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            schedule.step()
            method.after_step(base)
        steps_done += steps
        seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        elapsed += seconds.item()
        sent = torch.tensor([method.bytes_sent()], dtype=torch.int64)
        dist.all_reduce(sent, op=dist.ReduceOp.MAX)
        scored = averaged(base, world, MODELS[args.model]) if method.gossip is not None else base
        accuracy = evaluate(scored, test_x, test_y, rank, world)
        epochs.append({"epoch": epoch, "accuracy": accuracy, "seconds": elapsed, "bytes_sent": sent.item(),
                       "step_seconds": elapsed / max(steps_done, 1)})
        if rank == 0:
            print(f"  {name:<52} epoch {epoch}: accuracy {accuracy:.2%}  time {elapsed:7.1f} s  "
                  f"sent per rank {sent.item() / 1e6:9.2f} MB", flush=True)
        if target is not None and (windowed(epochs, args.target_window)[-1] >= target or elapsed >= budget):
            break
    return epochs


def learning_rate_schedule(opt, kind, steps):
    """constant: the learning rate throughout; cosine: from it to zero along half a cosine
    over `steps` steps (the --epochs of a run), zero after (a method run on past them by
    --stop-at-target no longer moves)."""
    if kind == "constant":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps)))


def windowed(epochs, window):
    """Each epoch's accuracy as the mean over it and the window − 1 evaluations before
    it (fewer at the start)."""
    accuracy = [e["accuracy"] for e in epochs]
    means = []
    for i in range(len(accuracy)):
        last = accuracy[max(0, i + 1 - window):i + 1]
        means.append(sum(last) / len(last))
    return means


def time_to(epochs, target, window=1):
    """Training seconds at the first epoch whose accuracy (its mean over `window`
    evaluations) reaches target, or None."""
    if target is None:
        return None
    return next((e["seconds"] for e, a in zip(epochs, windowed(epochs, window)) if a >= target), None)


def plot(results, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for name, epochs in results.items():
        accuracy = [100 * e["accuracy"] for e in epochs]
        axes[0].plot([max(e["bytes_sent"], 1) / 1e6 for e in epochs], accuracy, marker="o", label=name)
        axes[1].plot([e["seconds"] for e in epochs], accuracy, marker="o", label=name)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("MB sent per rank (log)")
    axes[1].set_xlabel("training time (s)")
    for ax in axes:
        ax.set_ylabel("test accuracy (%)")
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="hooks",
                        help="'hooks', 'decentralized', or methods separated by ';' (default: hooks)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant",
                        help="cosine: each method's learning rate falls to zero over --epochs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=None, help="cut each epoch short")
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn")
    parser.add_argument("--target", default=None,
                        help="a test accuracy (e.g. 0.8), or dense-D: the first method's final accuracy less D; "
                             "the table gives the time to reach it")
    parser.add_argument("--target-window", type=int, default=1,
                        help="judge the target by the mean accuracy of the last N evaluations (dense-D too): "
                             "one evaluation's noise then neither sets the target nor reaches it")
    parser.add_argument("--stop-at-target", action="store_true",
                        help="end each method after the first one at the target or at the first method's time")
    parser.add_argument("--quick", action="store_true",
                        help="6 methods, 1 epoch of 5 steps, accuracy on 2000 test images (seconds)")
    parser.add_argument("--out", default="benchmarks/results/train", help="prefix of the .json and .png written")
    args = parser.parse_args()
    if args.quick:
        args.methods, args.epochs, args.max_steps = "quick", 1, 5
    methods = METHODS.get(args.methods) or [m for m in args.methods.split(";") if m]
    if args.stop_at_target and args.target is None:
        parser.error("--stop-at-target needs --target")
    if args.target_window < 1:
        parser.error("--target-window must be at least 1")
    # "dense-D": D below the first method's final accuracy, known once it has run.
    below_first = float(args.target[len("dense-"):]) if args.target and args.target.startswith("dense-") else None
    target = float(args.target) if args.target is not None and below_first is None else None

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    gradzip.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend="gradzip", pg_options=gradzip.Options(aggregation="allreduce"))
    network = os.environ.get("GRADZIP_NETWORK", "loopback")
    data = (*load("train"), *load("test"))
    if args.quick:  # evaluation would be most of a short run
        data = (data[0], data[1], data[2][:2000], data[3][:2000])
    if rank == 0:
        print(f"Fashion-MNIST, {world} ranks, {args.epochs} epochs, batch {args.batch_size} per rank, {network}",
              flush=True)
    compute = compute_only(args, data, rank)
    if rank == 0:
        print(f"compute-only step ({args.model}): {compute * 1e3:.1f} ms", flush=True)
    results = {}
    for i, name in enumerate(methods):
        gradzip.reset_stats(group)
        stop = args.stop_at_target and i > 0 and target is not None
        results[name] = train(name, args, data, rank, world, group, target if stop else None,
                              results[methods[0]][-1]["seconds"] if stop else None)
        if i == 0 and below_first is not None:
            target = windowed(results[name], args.target_window)[-1] - below_first
            if rank == 0:
                print(f"  target: {name}'s final accuracy (mean of its last {args.target_window} evaluations) "
                      f"less {below_first:g}: {target:.2%}", flush=True)

    if rank == 0:
        first = results[methods[0]]  # the reference: dense, where the run starts with it
        dense = first[-1]["bytes_sent"] if methods[0].partition("@")[0] == "none" else None
        none_to_target = time_to(first, target, args.target_window) if target else None
        header = (f"{'method':<40} | {'accuracy':>8} | {'time':>8} | {'step':>8} | {'step/compute':>12} | "
                  f"{'to target':>9} | {'speedup':>7} | {'sent per rank':>13} | {'fewer bytes':>11}")
        print(f"\nlast epoch of each method; {args.model}; compute-only step {compute * 1e3:.1f} ms; "
              f"target {target}; {platform.node()}, {os.cpu_count()} cores, {network}")
        print(header)
        print("-" * len(header))
        for name, epochs in results.items():
            last = epochs[-1]
            fewer = f"{dense / max(last['bytes_sent'], 1):10.1f}x" if dense else "-"
            reached = time_to(epochs, target, args.target_window)
            to_target = f"{reached:7.1f} s" if reached is not None else "-"
            speedup = f"{none_to_target / reached:6.2f}x" if reached and none_to_target else "-"
            print(f"{name:<40} | {last['accuracy']:>7.2%} | {last['seconds']:>6.1f} s | "
                  f"{last['step_seconds'] * 1e3:>5.0f} ms | {last['step_seconds'] / compute:>12.2f} | "
                  f"{to_target:>9} | {speedup:>7} | {last['bytes_sent'] / 1e6:>10.2f} MB | {fewer:>11}")
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"world_size": world, "model": args.model, "compute_only_step_seconds": compute, "target": target,
                "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                "lr_schedule": args.lr_schedule, "target_window": args.target_window,
                "lrs": {name: Method.lr_of(name, args.lr) for name in results},
                "seed": args.seed, "max_steps": args.max_steps, "network": network, "host": platform.node(),
                "cores": os.cpu_count(), "torch": torch.__version__}
        out.with_suffix(".json").write_text(json.dumps({**meta, "results": results}, indent=2))
        plot(results, out.with_suffix(".png"),
             f"Fashion-MNIST, {world} ranks, {network}, {platform.node()} ({os.cpu_count()} cores)")
        print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
