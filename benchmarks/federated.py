"""Federated reference experiments, simulated in one process with gradzip.codec.

    python benchmarks/federated.py                 # every experiment (about 8 minutes)
    python benchmarks/federated.py --quick         # a few seconds

(a) STC federated learning (Sattler et al.): logistic regression on Fashion-MNIST padded
    to 32x32 (1024 -> 10), 50 clients on an i.i.d. split, half of them drawn each round,
    1 local iteration of SGD (batch 100, lr 0.04, no momentum). Each drawn client sends
    its update through STC at density 0.001 with its own residual; the server averages
    the decoded updates and broadcasts that through STC at density 0.002 with the
    server's residual; every client applies the broadcast, so all stay in sync. Against
    the same federated averaging uncompressed, for --stc-rounds rounds (2000: both have
    converged; one round changes at most 20 of the model's weights, so STC needs many
    rounds, as the STC paper's runs of thousands of iterations have). The table gives,
    besides the accuracy after rounds 1-3 and the last, the round at which each run first
    comes within 2 points of FedAvg's final accuracy and the bits it sent until then.
(b) 8-bit federated averaging (TFF's rule): the small CNN of examples/fashion_mnist.py,
    same clients and rounds; the server broadcasts the model and the clients send their
    updates through the codec `uniform`: each variable with more than 10000 elements
    quantized to 8 bits between its min and max with stochastic rounding, the others as
    fp32. Against 32-bit.
(c) Whole-model compression for a federated server (APPFL's setting): 5 clients train the
    small CNN locally (10 iterations per round), upload their models through
    gradzip.codec.compress_model, and the server averages what it decompresses, for 20
    rounds. For each codec at the same error bound: compression ratio, the largest error
    over its bound (every lossy tensor of every upload), compress and decompress MB/s
    (model bytes over the time of the calls), and the accuracy after the last round.
    Side by side, when the package is importable, APPFL's own ZFPCompressor on the same
    models and bounds (benchmarks/appfl.sh installs it into its own environment and runs
    this experiment there).

Bits are the payloads' sizes (gradzip's 16-byte header included): "up" sums the drawn
clients' uploads, "down" the broadcasts they receive, per round. Prints a table per
experiment and writes JSON.
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import gradzip

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from fashion_mnist import SmallCNN, load  # noqa: E402


class LogisticRegression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(32 * 32, 10)

    def forward(self, x):
        return self.linear(F.pad(x, (2, 2, 2, 2)).flatten(1))


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


class Link:
    """Sends named tensors through a codec spec per tensor, with optional residuals, and
    counts the payload bits."""

    def __init__(self, spec_of, error_feedback, seed):
        self.spec_of = spec_of  # tensor -> spec, or None to send fp32 as is
        self.error_feedback = error_feedback
        self.seed = seed
        self.states = {}

    def send(self, tensors: dict, sender: int):
        """The tensors as the receiver decodes them, and the bits sent."""
        out, bits = {}, 0
        for name, t in tensors.items():
            spec = self.spec_of(t)
            if spec is None:
                out[name], bits = t.clone(), bits + 32 * t.numel()
                continue
            key = (sender, name)
            if key not in self.states:
                self.states[key] = gradzip.codec.State(seed=self.seed, rank=sender,
                                                       error_feedback=self.error_feedback)
            data = gradzip.codec.encode(t, spec, self.states[key])
            out[name], bits = gradzip.codec.decode(data, like=t), bits + 8 * len(data)
        return out, bits


def federated(make_model, up, down, args, data, label, broadcast_model=False):
    """Federated averaging; `up` and `down` are Links (or None: uncompressed fp32)."""
    train_x, train_y, test_x, test_y = data
    torch.manual_seed(args.seed)
    server = make_model()
    clients = [make_model() for _ in range(args.clients)]
    for c in clients:
        c.load_state_dict(server.state_dict())
    shards = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed)).chunk(args.clients)
    draw = torch.Generator().manual_seed(args.seed + 1)
    plain = Link(lambda t: None, False, 0)
    up, down = up or plain, down or plain
    rounds = []
    for round_ in range(1, args.rounds + 1):
        start = time.perf_counter()
        drawn = torch.randperm(args.clients, generator=draw)[: max(1, int(args.participation * args.clients))]
        bits_up = bits_down = 0
        if broadcast_model:  # the drawn clients receive the server's model through `down`
            model_state = server.state_dict()
            for c in drawn.tolist():
                received, bits = down.send(model_state, sender=0)
                clients[c].load_state_dict(received)
                bits_down += bits
        updates = []
        for c in drawn.tolist():
            model = clients[c]
            before = {k: v.clone() for k, v in model.state_dict().items()}
            opt = torch.optim.SGD(model.parameters(), lr=args.lr)
            shard = shards[c]
            for it in range(args.local_iterations):
                batch = shard[torch.randint(len(shard), (args.batch_size,), generator=draw)]
                opt.zero_grad()
                F.cross_entropy(model(train_x[batch]), train_y[batch]).backward()
                opt.step()
            delta = {k: v - before[k] for k, v in model.state_dict().items()}
            received, bits = up.send(delta, sender=c)
            updates.append(received)
            bits_up += bits
            if not broadcast_model:
                model.load_state_dict(before)  # the client applies only the broadcast, below
        average = {k: torch.stack([u[k] for u in updates]).mean(0) for k in updates[0]}
        new_state = server.state_dict()
        if broadcast_model:
            for k in new_state:
                new_state[k] = new_state[k] + average[k]
            server.load_state_dict(new_state)
        else:  # the server broadcasts the averaged update; every client applies it
            received, bits = down.send(average, sender=0)
            bits_down += bits * len(drawn)
            for k in new_state:
                new_state[k] = new_state[k] + received[k]
            server.load_state_dict(new_state)
            for c in clients:
                c.load_state_dict(new_state)
        rounds.append({"round": round_, "accuracy": accuracy(server, test_x, test_y),
                       "bits_up": bits_up, "bits_down": bits_down, "seconds": time.perf_counter() - start})
        if args.verbose:
            r = rounds[-1]
            print(f"  {label:<28} round {round_:>3}: accuracy {r['accuracy']:.2%}  up {r['bits_up'] / 8 / 2**20:8.3f} "
                  f"MiB  down {r['bits_down'] / 8 / 2**20:8.3f} MiB", flush=True)
    return rounds


class GradzipModelCodec:
    """gradzip.codec.compress_model with one spec."""

    def __init__(self, name, spec):
        self.name, self.spec = name, spec

    def compress(self, state):
        return gradzip.codec.compress_model(state, self.spec)

    def decompress(self, data, model):
        return gradzip.codec.decompress_model(data, like=model)


class AppflZfp:
    """APPFL's ZFPCompressor (REL bound, zstd, the same param_cutoff)."""

    def __init__(self, bound, cutoff):
        from appfl.compressor import ZFPCompressor
        from omegaconf import OmegaConf
        self.name = f"APPFL ZFPCompressor REL {bound:g}"
        self.compressor = ZFPCompressor(OmegaConf.create(dict(
            lossless_compressor="zstd", error_bounding_mode="REL", error_bound=bound, param_cutoff=cutoff)))

    def compress(self, state):
        return self.compressor.compress_model(state)

    def decompress(self, data, model):
        return self.compressor.decompress_model(data, model)


def appfl_available():
    try:
        import appfl.compressor  # noqa: F401
        import omegaconf  # noqa: F401
        return True
    except ImportError:
        return False


def federated_models(method, bound, args, data, cutoff):
    """(c): clients upload whole models through `method`; the server averages them."""
    train_x, train_y, test_x, test_y = data
    torch.manual_seed(args.seed)
    server = SmallCNN()
    shards = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed)).chunk(args.model_clients)
    draw = torch.Generator().manual_seed(args.seed + 1)
    raw_bytes = sum(t.numel() * t.element_size() for t in server.state_dict().values())
    if method is not None:  # one untimed call first: code paths, allocations, caches warm
        method.decompress(method.compress(server.state_dict()), server)
    sent = compress_s = decompress_s = 0.0
    worst = 0.0
    uploads = 0
    for round_ in range(args.rounds):
        received = []
        for c in range(args.model_clients):
            model = SmallCNN()
            model.load_state_dict(server.state_dict())
            opt = torch.optim.SGD(model.parameters(), lr=args.model_lr, momentum=0.9)
            for _ in range(args.model_local_iterations):
                batch = shards[c][torch.randint(len(shards[c]), (args.batch_size,), generator=draw)]
                opt.zero_grad()
                F.cross_entropy(model(train_x[batch]), train_y[batch]).backward()
                opt.step()
            state = model.state_dict()
            if method is None:
                received.append(state)
                sent += raw_bytes
                continue
            start = time.perf_counter()
            blob = method.compress(state)
            middle = time.perf_counter()
            back = method.decompress(blob, model)
            compress_s += middle - start
            decompress_s += time.perf_counter() - middle
            sent += len(blob)
            uploads += 1
            for name, t in state.items():
                if bound is not None and t.is_floating_point() and t.numel() >= cutoff and "weight" in name:  # lossy in both
                    eb = bound * (t.max() - t.min()).item()
                    worst = max(worst, (back[name].double() - t.double()).abs().max().item() / eb)
            received.append(back)
        server.load_state_dict({k: torch.stack([r[k].float() for r in received]).mean(0).to(v.dtype)
                                for k, v in server.state_dict().items()})
    row = {"run": method.name if method else "fp32 (uncompressed)", "bound": bound,
           "ratio": raw_bytes * args.rounds * args.model_clients / sent,
           "max_error_over_bound": worst if method and bound is not None else None,
           "compress_MBps": raw_bytes * uploads / 1e6 / compress_s if uploads else None,
           "decompress_MBps": raw_bytes * uploads / 1e6 / decompress_s if uploads else None,
           "accuracy": accuracy(server, test_x, test_y)}
    error = row["max_error_over_bound"]
    print(f"{row['run']:<34} | {row['ratio']:>6.2f}x | " + (f"{error:>9.3f}" if error is not None else f"{'-':>9}") + " | "
          + (f"{row['compress_MBps']:>8.0f} | {row['decompress_MBps']:>8.0f}" if uploads else f"{'-':>8} | {'-':>8}")
          + f" | {row['accuracy']:>7.2%}", flush=True)
    return row


def model_compression(args, data):
    cutoff = 1024
    have_appfl = appfl_available()
    if args.require_appfl and not have_appfl:
        sys.exit("federated.py: --require-appfl, but appfl (with omegaconf, zfpy, zstd) is not importable")
    print(f"\n(c) whole-model compression: small CNN, {args.model_clients} clients, {args.rounds} rounds of "
          f"{args.model_local_iterations} local iterations, uploads through each codec (REL bounds, "
          f"param_cutoff {cutoff}, zstd)" + ("" if have_appfl else "; APPFL not installed: benchmarks/appfl.sh"))
    header = f"{'run':<34} | {'ratio':>7} | {'err/bound':>9} | {'comp MB/s':>8} | {'dec MB/s':>8} | {'final':>7}"
    print(header)
    print("-" * len(header))
    rows = [federated_models(None, None, args, data, cutoff)]
    for bound in [float(b) for b in args.bounds.split(",")]:
        methods = [GradzipModelCodec(f"gradzip sz REL {bound:g}", f"sz:mode=rel,bound={bound:g},param_cutoff={cutoff}"),
                   GradzipModelCodec(f"gradzip zfp REL {bound:g}", f"zfp:mode=rel,bound={bound:g},param_cutoff={cutoff}")]
        if have_appfl:
            methods.append(AppflZfp(bound, cutoff))
        rows += [federated_models(m, bound, args, data, cutoff) for m in methods]
    rows.append(federated_models(GradzipModelCodec("gradzip uniform (TFF 8-bit)", f"uniform:param_cutoff={cutoff}"),
                                 None, args, data, cutoff))
    return rows


def reaching(rounds, target):
    """(the first round whose accuracy is at least target, the bits sent up to and in it),
    or (None, None)."""
    bits = 0
    for r in rounds:
        bits += r["bits_up"] + r["bits_down"]
        if r["accuracy"] >= target:
            return r["round"], bits
    return None, None


def table(title, results, baseline, within=0.02):
    """Accuracy after rounds 1-3 and the last; bits per round; and the round and bits at
    which each run first comes within `within` of the baseline's final accuracy, with how
    many fewer bits than the baseline took to reach that same accuracy."""
    print(f"\n{title}")
    base = results[baseline]
    target = base[-1]["accuracy"] - within
    header = f"{'run':<28} | {'acc r1':>7} | {'acc r2':>7} | {'acc r3':>7} | {'final':>7} | " \
             f"{'up/round':>12} | {'down/round':>12} | {'fewer bits':>10} | {f'round to {target:.2%}':>16} | " \
             f"{'bits to there':>13} | {'fewer to there':>14}"
    print(header)
    print("-" * len(header))
    base_bits = sum(r["bits_up"] + r["bits_down"] for r in base)
    _, base_to_target = reaching(base, target)
    for name, rounds in results.items():
        acc = [f"{rounds[i]['accuracy']:.2%}" if i < len(rounds) else "-" for i in range(3)]
        up = sum(r["bits_up"] for r in rounds) / len(rounds)
        down = sum(r["bits_down"] for r in rounds) / len(rounds)
        fewer = base_bits / max(1, sum(r["bits_up"] + r["bits_down"] for r in rounds))
        round_, bits = reaching(rounds, target)
        there = f"{round_:>16} | {bits / 8 / 2**20:>9.3f} MiB | {base_to_target / bits:>13.1f}x" if round_ else \
            f"{'not reached':>16} | {'-':>13} | {'-':>14}"
        print(f"{name:<28} | {acc[0]:>7} | {acc[1]:>7} | {acc[2]:>7} | {rounds[-1]['accuracy']:>7.2%} | "
              f"{up / 8 / 2**20:>8.3f} MiB | {down / 8 / 2**20:>8.3f} MiB | {fewer:>9.1f}x | {there}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="(b) and (c): rounds")
    parser.add_argument("--stc-rounds", type=int, default=2000, help="(a): rounds")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--participation", type=float, default=0.5)
    parser.add_argument("--local-iterations", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.04)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--experiments", default="stc,8bit,model", help="stc, 8bit, model (comma-separated)")
    parser.add_argument("--bounds", default="1e-2,1e-3", help="(c): REL error bounds")
    parser.add_argument("--require-appfl", action="store_true", help="(c): fail when APPFL is not importable")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, 10 clients (3 of 2 local steps in (c)), 1000 test images (seconds)")
    parser.add_argument("--model-clients", type=int, default=5, help="(c): clients, all drawn every round")
    parser.add_argument("--model-local-iterations", type=int, default=10, help="(c): local SGD steps per round")
    parser.add_argument("--model-lr", type=float, default=0.02, help="(c): local SGD (momentum 0.9) learning rate")
    parser.add_argument("--verbose", action="store_true", help="a line per round")
    parser.add_argument("--json", default="benchmarks/results/federated.json")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.stc_rounds, args.clients, args.model_clients, args.model_local_iterations = 3, 3, 10, 3, 2
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    data = (*load("train"), *load("test"))
    if args.quick:  # accuracy on the first 1000 test images: evaluation is most of a short run
        data = (data[0], data[1], data[2][:1000], data[3][:1000])
    out = {"host": platform.node(), "cores": os.cpu_count(), "args": vars(args)}
    print(f"federated simulation: {args.clients} clients, participation {args.participation}, {args.stc_rounds} rounds "
          f"for (a) and {args.rounds} for (b) and (c), "
          f"{args.local_iterations} local iteration(s) of batch {args.batch_size}, lr {args.lr}")

    if "stc" in args.experiments:
        long = argparse.Namespace(**{**vars(args), "rounds": args.stc_rounds})
        stc = {
            "fedavg (fp32)": federated(LogisticRegression, None, None, long, data, "fedavg (fp32)"),
            "stc up 0.001 / down 0.002": federated(
                LogisticRegression, Link(lambda t: "stc:density=0.001", True, args.seed),
                Link(lambda t: "stc:density=0.002", True, args.seed), long, data, "stc"),
        }
        table(f"(a) STC federated, logistic regression 1024 -> 10, {args.stc_rounds} rounds", stc, "fedavg (fp32)")
        out["stc"] = stc

    if "8bit" in args.experiments:
        def eight_bit(t):
            return "uniform"  # TFF's rule: 8 bits above 10000 elements, fp32 below
        fedavg8 = {
            "fedavg (fp32)": federated(SmallCNN, None, None, args, data, "fedavg (fp32)", broadcast_model=True),
            "8-bit broadcast + updates": federated(
                SmallCNN, Link(eight_bit, False, args.seed), Link(eight_bit, False, args.seed), args, data,
                "8-bit", broadcast_model=True),
        }
        table("(b) 8-bit federated averaging, small CNN (tensors > 10000 elements quantized)", fedavg8,
              "fedavg (fp32)")
        out["8bit"] = fedavg8

    if "model" in args.experiments:
        out["model"] = model_compression(args, data)

    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
