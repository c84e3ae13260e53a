"""Time- and bytes-to-accuracy on Fashion-MNIST: gradzip against PyTorch's own comm hooks.

    torchrun --standalone --nproc-per-node 4 benchmarks/train.py
    mpirun -np 4 python benchmarks/train.py
    sudo benchmarks/netns.sh --ranks 4 --rate 1gbit -- .venv/bin/python benchmarks/train.py
    torchrun --standalone --nproc-per-node 8 benchmarks/train.py --methods decentralized
    sudo benchmarks/netns.sh --ranks 4 --rate 1gbit -- .venv/bin/python benchmarks/train.py \
        --model mlp --methods network --epochs 10 --max-steps 30 --target dense-0.005 --stop-at-target
    torchrun --standalone --nproc-per-node 4 benchmarks/train.py --model mlp --methods network \
        --epochs 20 --max-steps 30 --target dense-0.005 --target-window 3 --seeds 1 2 \
        --step-times benchmarks/results/train.json --stop-at-target --out benchmarks/results/seeds
    torchrun --standalone --nproc-per-node 4 benchmarks/train.py --device cuda --model resnet \
        --methods gpu --epochs 3 --max-steps 40 --target dense-0.01 --stop-at-target

Every method trains the same model (--model: "cnn", the small CNN of
examples/fashion_mnist.py, "mlp", a 784-3072-3072-10 MLP of 11.9M parameters whose
dense gradient exchange dominates a step at 1 Gbit/s, or "resnet", a ResNet-18 of 11.2M
parameters for GPUs) from the same seed, on the same shards, for the same epochs, one
after the other in one launch, on the CPU or (--device cuda) on the GPUs: rank r on GPU
r mod the GPUs there are, so that 4 ranks on one GPU share it (a gradzip group then
carries CUDA tensors over Gloo through host memory, as NCCL refuses two ranks on one
GPU: docs/cuda.md; PyTorch's hooks and dense DDP run over such an exact gradzip group).
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
  aggregation:<spec>  no DDP: gradzip.Aggregation(spec)(model) on each parameter's
                    gradient between backward and the step, each its own tensor (no
                    bucket, so no copy of the gradients into one; nothing overlaps the
                    backward, which one core per rank cannot overlap anyway)
  METHOD@LR         any of these at its own learning rate (default: --lr)
Per epoch: test accuracy, training wall time (evaluation excluded), and bytes sent per
rank (the most any rank sent; gradzip.stats() counts PyTorch's hooks through an exact
gradzip group). Before the methods and again after them, the compute-only step time
(forward, backward and step without DDP, the slowest rank's) is measured, and the mean
of the two prices the ideal (a machine whose speed drifts during a run moves both): a
method's step time over it shows how much communication it leaves unhidden. Beside it,
the same step under DDP with a comm hook that communicates nothing: DDP's copies of each
step's fresh gradients into its buckets and its hook calls, which no DDP comm hook's step
can be under; the table gives each method's step over it too. Rank 0 shows a progress bar, prints a table,
writes JSON and two plots (accuracy against bytes, accuracy against time). The table
says where the ranks ran: one per core (a real node's picture) or several per core
(every pass a codec makes then adds to the step). DDP keeps the gradients as views of its
buckets (gradient_as_bucket_view=True) for every method, as a user minding the step would.

Time to accuracy: --target dense-0.005 is the accuracy the first method ("none", dense)
ends at, less half a point; --stop-at-target ends each later method at the first epoch
that reaches the target or whose training time has passed the first method's, however
many epochs that takes (a method no faster than dense gains nothing by running on).
--target-window N judges both by the mean accuracy of the last N evaluations: at a
constant learning rate one evaluation can sit a point above or below its neighbours,
and would otherwise set the target or reach it by chance.

Efficiency, the measure that holds on any machine: a method's time to the target over
the communication-free ideal, dense's steps to that target times the compute-only step.
--seeds 0 1 2 runs every method from each seed (each seed's target from its own dense
run) and reports the steps to the target per seed and the mean efficiency. The steps do
not depend on the network, so seeds can run on loopback with --step-times RUN.json
pricing them at the step times and compute-only step of a shaped run. A warning says
when dense's step is under 3x its compute: then the link does not dominate, and no
compression can gain much. Gradzip specs with momentum correction (a `momentum` key)
move the momentum into the aggregation: their SGD runs without its own, as
examples/train_fashion_mnist.py does.
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

try:
    from tqdm import tqdm
except ImportError:  # a Python without it (the lent GPU machines'): no progress bar
    def tqdm(iterable, **_):
        return iterable

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
              "backend:sign", "aggregation:qsgd:bits=4"],
    "network": ["none", "torch-fp16", "torch-powersgd-4", "stc:density=0.01", "topk:density=0.01", "sign",
                "qsgd:bits=4", "stc:density=0.01,momentum=0.9,density_warmup=234"],
    "gpu": ["none", "torch-fp16", "torch-powersgd-4", "stc:density=0.01", "topk:density=0.01", "sign",
            "qsgd:bits=4"],
}


class WideMLP(torch.nn.Module):
    """784-3072-3072-10: 11.9M parameters, a 47.5 MB fp32 gradient."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 3072), torch.nn.ReLU(),
                                          torch.nn.Linear(3072, 3072), torch.nn.ReLU(), torch.nn.Linear(3072, 10))

    def forward(self, x):
        return self.layers(x)


class BasicBlock(torch.nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut (He et al., 2016)."""

    def __init__(self, inputs, outputs, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(outputs)
        self.conv2 = torch.nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(outputs)
        self.shortcut = torch.nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = torch.nn.Sequential(torch.nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False),
                                                torch.nn.BatchNorm2d(outputs))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet18(torch.nn.Module):
    """ResNet-18 for 28x28 images: a 3x3 stem, four stages of two basic blocks (64, 128,
    256, 512 channels; the last three halve the resolution), global average pooling:
    11.2M parameters, a 44.7 MB fp32 gradient."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(1, 64, 3, padding=1, bias=False), torch.nn.BatchNorm2d(64),
                                        torch.nn.ReLU())
        blocks, channels = [], 64
        for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(channels, width, stride), BasicBlock(width, width, 1)]
            channels = width
        self.blocks = torch.nn.Sequential(*blocks)
        self.head = torch.nn.Linear(512, 10)

    def forward(self, x):
        return self.head(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1))


MODELS = {"cnn": SmallCNN, "mlp": WideMLP, "resnet": ResNet18}


class Method:
    """One way to train: wraps the model and counts the bytes it sends."""

    def __init__(self, name, group, lr):
        self.name = name
        self.kind = name.partition("@")[0]
        self.lr = Method.lr_of(name, lr)
        name = self.kind  # what follows reads the method, not its learning rate
        self.group = group
        self.gossip = None
        self.aggregation = None  # aggregation:<spec>, applied to the gradients before each step
        self.hook_spec = None  # the DDP hook's spec; its State is made in wrap(), with the model
        self.hook_state = None
        if name.startswith("backend:"):
            self.group = dist.new_group(backend="gradzip",
                                        pg_options=gradzip.Options(aggregation=name.split(":", 1)[1]))
        elif name.startswith(("gossip", "choco")):
            self.gossip = gradzip.Aggregation(name, group=group)
        elif name.startswith("aggregation:"):
            self.aggregation = gradzip.Aggregation(name.split(":", 1)[1], group=group)
        elif name not in ("none", "torch-fp16") and not name.startswith(("torch-powersgd-", "backend:")):
            self.hook_spec = gradzip.Spec(name)

    @staticmethod
    def lr_of(name, lr):
        """The learning rate of "METHOD@LR" (the method at its own), else lr."""
        own = name.partition("@")[2]
        return float(own) if own else lr

    def wrap(self, model, device):
        """The model to train and its SGD, the comm hook registered."""
        opt = torch.optim.SGD(model.parameters(), lr=self.lr, momentum=self.momentum())
        if self.gossip is not None or self.aggregation is not None:
            return model, opt
        # The gradients as views of DDP's buckets, for every method alike: no copy of the
        # averaged bucket back into them (each step's fresh gradients are still copied in).
        ddp = DDP(model, process_group=self.group, gradient_as_bucket_view=True,
                  device_ids=[device.index] if device.type == "cuda" else None)
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

    def before_step(self, model):
        if self.aggregation is not None:
            self.aggregation(model)

    def after_step(self, model):
        if self.gossip is not None:
            self.gossip(model)

    def momentum(self):
        """SGD's momentum: none where the spec moves it into the aggregation."""
        kind = self.kind
        spec = kind.split(":", 1)[1] if kind.startswith(("backend:", "aggregation:")) else kind
        if kind in ("none", "torch-fp16") or kind.startswith("torch-powersgd-") or self.gossip is not None:
            return 0.9
        return 0.0 if "momentum" in gradzip.Spec(spec).params else 0.9

    def bytes_sent(self):
        if self.gossip is not None:
            return self.gossip.stats()["bytes_sent"]
        if self.aggregation is not None:
            return self.aggregation.stats()["bytes_sent"]
        if self.hook_state is not None:
            return self.hook_state.stats()["bytes_sent"]
        return gradzip.stats(self.group)["bytes_sent"]


def averaged(model, world, make, device):
    """The average of every rank's replica, for evaluating decentralized training."""
    average = make().to(device)
    average.load_state_dict(model.state_dict())
    for p in average.parameters():
        dist.all_reduce(p.data, op=dist.ReduceOp.AVG)
    return average


def synchronized(device):
    """Waits for the GPU's queued work, so that a timer read next counts it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def no_communication(_, bucket):
    """A DDP comm hook that returns each rank's own bucket: DDP's machinery without a network."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def compute_only(args, data, rank, device, ddp_group=None):
    """Seconds per step of forward, backward and step (the slowest rank's, median of 20
    steps after 2 of warm-up), every rank computing at once: without DDP, or under DDP
    over `ddp_group` as the methods run it, with a comm hook that communicates nothing
    (its copies of the fresh gradients into the buckets and its hook calls: the least a
    DDP comm hook's step can take)."""
    train_x, train_y = data[0], data[1]
    torch.manual_seed(args.seeds[0])
    model = MODELS[args.model]().to(device)
    if ddp_group is not None:
        model = DDP(model, process_group=ddp_group, gradient_as_bucket_view=True,
                    device_ids=[device.index] if device.type == "cuda" else None)
        model.register_comm_hook(None, no_communication)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    times = []
    for step in range(22):
        batch = torch.arange(step * args.batch_size, (step + 1) * args.batch_size) + rank * 22 * args.batch_size
        dist.barrier()
        start = time.perf_counter()
        loss = F.cross_entropy(model(train_x[batch]), train_y[batch])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        synchronized(device)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if step >= 2:
            times.append(elapsed.item())
    return sorted(times)[len(times) // 2]


def train(name, seed, args, data, rank, world, group, device, target=None, budget=None, step_time=None):
    """Trains `name` from `seed` for args.epochs epochs; with `target` and `budget`, until
    the first epoch that reaches the target accuracy or ends past `budget` seconds (its
    steps times `step_time` where given, else its own training time), however many
    epochs that takes."""
    train_x, train_y, test_x, test_y = data
    torch.manual_seed(seed)
    method = Method(name, group, args.lr)
    base = MODELS[args.model]().to(device)
    model, opt = method.wrap(base, device)
    per_epoch = min(len(train_x) // world // args.batch_size, args.max_steps or len(train_x))
    schedule = learning_rate_schedule(opt, args.lr_schedule, args.epochs * per_epoch)
    epochs, elapsed, steps_done = [], 0.0, 0
    epoch = 0
    while epoch < args.epochs or target is not None:
        epoch += 1
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
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
            method.before_step(base)
            opt.step()
            schedule.step()
            method.after_step(base)
        steps_done += steps
        synchronized(device)
        seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        elapsed += seconds.item()
        sent = torch.tensor([method.bytes_sent()], dtype=torch.int64)
        dist.all_reduce(sent, op=dist.ReduceOp.MAX)
        scored = averaged(base, world, MODELS[args.model], device) if method.gossip is not None else base
        accuracy = evaluate(scored, test_x, test_y, rank, world)
        epochs.append({"epoch": epoch, "steps": steps_done, "accuracy": accuracy, "seconds": elapsed,
                       "bytes_sent": sent.item(), "step_seconds": elapsed / max(steps_done, 1)})
        if rank == 0:
            print(f"  {name:<52} seed {seed} epoch {epoch}: accuracy {accuracy:.2%}  time {elapsed:7.1f} s  "
                  f"sent per rank {sent.item() / 1e6:9.2f} MB", flush=True)
        spent = steps_done * step_time if step_time is not None else elapsed
        if target is not None and (windowed(epochs, args.target_window)[-1] >= target or spent >= budget):
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


def steps_to(epochs, target, window=1):
    """Steps at the first epoch whose accuracy (its mean over `window` evaluations)
    reaches target, or None."""
    return next((e["steps"] for e, a in zip(epochs, windowed(epochs, window)) if a >= target), None)


def summarize(runs, targets, compute, step_times, window):
    """Per method, over the seeds: steps to each seed's target, the step time, and the
    efficiency: time to the target over the communication-free ideal, dense's steps to
    the same target times the compute-only step (`runs` holds each seed's methods, dense
    first). A seed where a method misses its target makes its efficiency unknown."""
    methods = list(next(iter(runs.values())))
    dense_steps = {seed: steps_to(by_method[methods[0]], targets[seed], window) for seed, by_method in runs.items()}
    summary = {}
    for name in methods:
        steps = {seed: steps_to(by_method[name], targets[seed], window) for seed, by_method in runs.items()}
        per_seed = {seed: reached * step_times[name] / (dense_steps[seed] * compute)
                    if reached and dense_steps[seed] else None for seed, reached in steps.items()}
        known = [e for e in per_seed.values() if e is not None]
        ratios = [steps[seed] / dense_steps[seed] for seed in runs if steps[seed] and dense_steps[seed]]
        summary[name] = {
            "step_seconds": step_times[name], "steps_to_target": steps, "efficiency_per_seed": per_seed,
            "efficiency": sum(known) / len(known) if len(known) == len(per_seed) else None,
            "steps_over_dense": sum(ratios) / len(ratios) if len(ratios) == len(per_seed) else None,
            "missed_seeds": [seed for seed, reached in steps.items() if reached is None],
            "bytes_sent_per_step": max(by_method[name][-1]["bytes_sent"] / by_method[name][-1]["steps"]
                                       for by_method in runs.values()),
        }
    return summary


def shaped_step(shaped, name):
    """A method's step time in an earlier run's JSON (--step-times)."""
    try:
        return shaped["step_seconds"][name]
    except KeyError:
        raise SystemExit(f"train.py: --step-times run has no step time for {name!r} "
                         f"(it ran {', '.join(shaped['step_seconds'])})") from None


def print_table(runs, summary, step_times, compute, ddp_own, targets, methods, title):
    """Each method's step (over the compute-only step, and over DDP's own step where
    known), steps to each seed's target, efficiency against the ideal."""
    seeds = list(runs)
    header = (f"{'method':<40} | {'accuracy':>8} | {'step':>7} | {'step/compute':>12} | {'step/DDP own':>12} | "
              f"{'steps to target (' + ' / '.join(map(str, seeds)) + ')':>24} | {'steps/dense':>11} | "
              f"{'efficiency':>10} | {'vs dense':>8} | {'sent per step':>13}")
    print(f"\n{title}\ntargets: " + ", ".join(f"seed {seed} {t:.2%}" if t is not None else f"seed {seed} none"
                                         for seed, t in targets.items()))
    print("efficiency: time to the target over the communication-free ideal (dense's steps to it times the "
          "compute-only step), the mean over the seeds; step/DDP own: the step over DDP's with a hook that "
          "communicates nothing")
    print(header)
    print("-" * len(header))
    dense_efficiency = summary[methods[0]]["efficiency"] if summary else None
    for name in methods:
        accuracy = sum(runs[seed][name][-1]["accuracy"] for seed in seeds) / len(seeds)
        over_ddp = f"{step_times[name] / ddp_own:.2f}" if ddp_own else "-"
        row = (f"{name:<40} | {accuracy:>7.2%} | {step_times[name] * 1e3:>4.0f} ms | {step_times[name] / compute:>12.2f} | "
               f"{over_ddp:>12} | ")
        if summary is None:
            row += f"{'-':>24} | {'-':>11} | {'-':>10} | {'-':>8}"
        else:
            m = summary[name]
            steps = " / ".join(str(s) if s else "miss" for s in m["steps_to_target"].values())
            over = f"{m['steps_over_dense']:.2f}" if m["steps_over_dense"] else "-"
            eff = f"{m['efficiency']:.2f}" if m["efficiency"] else f"{len(m['missed_seeds'])} missed"
            faster = f"{dense_efficiency / m['efficiency']:.2f}x" if m["efficiency"] and dense_efficiency else "-"
            row += f"{steps:>24} | {over:>11} | {eff:>10} | {faster:>8}"
        sent = max(runs[seed][name][-1]["bytes_sent"] / runs[seed][name][-1]["steps"] for seed in seeds)
        print(row + f" | {sent / 1e6:>10.3f} MB")


def plot(runs, path, title):
    """Accuracy against bytes and against time, every seed (one colour per method); none
    where matplotlib is missing (the lent GPU machines' Python). Whether it drew them."""
    try:
        import matplotlib
    except ImportError:
        print(f"no matplotlib here: {path} not drawn")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for s, (seed, by_method) in enumerate(runs.items()):
        for i, (name, epochs) in enumerate(by_method.items()):
            accuracy = [100 * e["accuracy"] for e in epochs]
            style = {"color": colours[i % len(colours)], "marker": "o", "markersize": 3,
                     "label": name if s == 0 else None, "alpha": 1.0 if s == 0 else 0.5}
            axes[0].plot([max(e["bytes_sent"], 1) / 1e6 for e in epochs], accuracy, **style)
            axes[1].plot([e["seconds"] for e in epochs], accuracy, **style)
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
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="hooks",
                        help="'hooks', 'decentralized', or methods separated by ';' (default: hooks)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant",
                        help="cosine: each method's learning rate falls to zero over --epochs")
    parser.add_argument("--seeds", "--seed", type=int, nargs="+", default=[0],
                        help="run every method from each seed in turn; steps to the target are per seed")
    parser.add_argument("--step-times", default=None,
                        help="an earlier run's JSON (e.g. on the shaped link) whose step times and compute-only "
                             "step price this run's steps (e.g. more seeds on loopback)")
    parser.add_argument("--max-steps", type=int, default=None, help="cut each epoch short")
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: rank r on GPU r mod the GPUs there are (several ranks may share one)")
    parser.add_argument("--target", default=None,
                        help="a test accuracy (e.g. 0.8), or dense-D: the first method's final accuracy less D; "
                             "the table gives the time to reach it")
    parser.add_argument("--target-window", type=int, default=1,
                        help="judge the target by the mean accuracy of the last N evaluations (dense-D too): "
                             "one evaluation's noise then neither sets the target nor reaches it")
    parser.add_argument("--stop-at-target", action="store_true",
                        help="end each method after the first one at the target or at the first method's time")
    parser.add_argument("--quick", action="store_true",
                        help="7 methods, 1 epoch of 5 steps, accuracy on 2000 test images (seconds)")
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
    fixed_target = float(args.target) if args.target is not None and below_first is None else None

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    device = torch.device("cpu")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: no GPU is visible here")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    gradzip.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend="gradzip", pg_options=gradzip.Options(aggregation="allreduce"))
    network = os.environ.get("GRADZIP_NETWORK", "loopback")
    data = (*load("train"), *load("test"))
    if args.quick:  # evaluation would be most of a short run
        data = (data[0], data[1], data[2][:2000], data[3][:2000])
    data = tuple(t.to(device) for t in data)
    if rank == 0:
        print(f"Fashion-MNIST, {world} ranks, {args.epochs} epochs, batch {args.batch_size} per rank, {network}",
              flush=True)
    compute = compute_only(args, data, rank, device)
    ddp_local = compute_only(args, data, rank, device, ddp_group=group)
    cores = os.cpu_count()
    placement = (f"{world} ranks, one per core" if world == cores else
                 f"{world} ranks on {cores} cores" if world > cores else f"{world} ranks, {cores} cores")
    if device.type == "cuda":
        gpus = torch.cuda.device_count()
        placement = (f"{world} ranks on {min(gpus, world)} {torch.cuda.get_device_name(device)} GPU"
                     f"{'s' if min(gpus, world) > 1 else ''}, {cores} cores")
    if rank == 0:
        print(f"compute-only step ({args.model}, {placement}): {compute * 1e3:.1f} ms; under DDP with a hook that "
              f"communicates nothing: {ddp_local * 1e3:.1f} ms", flush=True)
    shaped = json.loads(Path(args.step_times).read_text()) if args.step_times else None
    runs, targets = {}, {}
    for seed in args.seeds:
        runs[seed] = {}
        target = fixed_target
        for i, name in enumerate(methods):
            gradzip.reset_stats(group)
            stop = args.stop_at_target and i > 0 and target is not None
            budget = runs[seed][methods[0]][-1]["seconds"] if stop else None
            if stop and shaped is not None:  # the first method's steps at the shaped run's step times
                budget = runs[seed][methods[0]][-1]["steps"] * shaped_step(shaped, methods[0])
            runs[seed][name] = train(name, seed, args, data, rank, world, group, device, target if stop else None,
                                     budget, shaped_step(shaped, name) if stop and shaped is not None else None)
            if i == 0 and below_first is not None:
                target = windowed(runs[seed][name], args.target_window)[-1] - below_first
                if rank == 0:
                    print(f"  seed {seed} target: {name}'s final accuracy (mean of its last {args.target_window} "
                          f"evaluations) less {below_first:g}: {target:.2%}", flush=True)
        targets[seed] = target
    before, after = compute, compute_only(args, data, rank, device)
    compute = (before + after) / 2
    ddp_local_before_after = [ddp_local, compute_only(args, data, rank, device, ddp_group=group)]
    ddp_local = sum(ddp_local_before_after) / 2
    if rank == 0:
        print(f"compute-only step again after the methods: {after * 1e3:.1f} ms (before them {before * 1e3:.1f} ms); "
              f"their mean prices the ideal: {compute * 1e3:.1f} ms; under DDP without communication "
              f"{ddp_local * 1e3:.1f} ms ({ddp_local / compute:.2f}x: no DDP comm hook's efficiency can be lower)",
              flush=True)

    if rank == 0:
        if shaped is not None:
            step_times = {name: shaped_step(shaped, name) for name in methods}
            efficiency_compute = shaped["compute_only_step_seconds"]
            ddp_own = shaped.get("ddp_without_communication_step_seconds")  # absent from older runs' JSON
            timing = f"step times from {args.step_times} ({shaped['network']}, {shaped['placement']})"
        else:
            step_times = {name: sum(r[name][-1]["seconds"] for r in runs.values())
                          / sum(r[name][-1]["steps"] for r in runs.values()) for name in methods}
            efficiency_compute = compute
            ddp_own = ddp_local
            timing = f"step times from this run ({network})"
        dense_bound = step_times[methods[0]] / efficiency_compute
        if methods[0].partition("@")[0] == "none" and dense_bound < 3:
            print(f"WARNING: dense's step is only {dense_bound:.2f}x the compute-only step: the link does not "
                  "dominate here, so no compression can gain more than that; shape a slower link or run fewer "
                  "ranks per core", flush=True)
        summary = summarize(runs, targets, efficiency_compute, step_times, args.target_window) \
            if all(t is not None for t in targets.values()) else None
        print_table(runs, summary, step_times, efficiency_compute, ddp_own, targets, methods,
                    f"{args.model}; {placement}; compute-only step {efficiency_compute * 1e3:.1f} ms; {timing}; "
                    f"seeds {' '.join(map(str, args.seeds))}; {platform.node()}")
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"world_size": world, "cores": cores, "placement": placement, "model": args.model,
                "compute_only_step_seconds": compute, "compute_only_step_seconds_before_after": [before, after],
                "ddp_without_communication_step_seconds": ddp_local,
                "ddp_without_communication_step_seconds_before_after": ddp_local_before_after,
                "targets": targets, "epochs": args.epochs,
                "batch_size": args.batch_size, "lr": args.lr, "lr_schedule": args.lr_schedule,
                "target_window": args.target_window, "lrs": {name: Method.lr_of(name, args.lr) for name in methods},
                "seeds": args.seeds, "max_steps": args.max_steps, "network": network, "step_times_from": args.step_times,
                "host": platform.node(), "torch": torch.__version__, "device": args.device}
        out.with_suffix(".json").write_text(json.dumps(
            {**meta, "summary": summary, "step_seconds": step_times,
             "step_over_ddp_without_communication": {name: step_times[name] / ddp_own for name in methods}
             if ddp_own else None,
             "results": {name: {seed: runs[seed][name] for seed in runs} for name in methods}}, indent=2))
        drawn = plot(runs, out.with_suffix(".png"), f"Fashion-MNIST, {args.model}, {placement}, {network}, "
                                                    f"seeds {' '.join(map(str, args.seeds))}, {platform.node()}")
        print(f"wrote {out.with_suffix('.json')}" + (f" and {out.with_suffix('.png')}" if drawn else ""))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
