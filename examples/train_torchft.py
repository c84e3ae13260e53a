"""Fashion-MNIST across torchft replica groups, aggregated by gradzip's hook (gradzip.torchft).

    python examples/train_torchft.py --steps 300 --kill-at 100 200

starts a torchft lighthouse and two replica groups of one rank each (this script again, with
--replica-id), each training a small MLP on its own batches, started together once both have
imported torch and loaded the data; with --kill-at K replica 1
SIGKILLs itself inside step K (after the quorum, before its gradients are sent), so the
survivor's step K fails and is not committed; a standby replica 1, started beforehand and
waiting with torch imported, then joins, heals from the survivor and trains on, and dies in
turn at the next step given, if any. It prints one JSON summary: each replica's final step,
parameter hash, test accuracy and stats, and the time lost to each failure (detection,
reconfiguration, healing).
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def replica(args) -> None:
    import hashlib
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import torchft

    import gradzip.torchft
    from fashion_mnist import load

    def emit(**event):
        print(json.dumps({"replica": args.replica_id, "t": time.time(), **event}), flush=True)

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    x_train, y_train = load("train")
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if args.wait_for:
        emit(event="standby")
        while not os.path.exists(args.wait_for):
            time.sleep(0.01)
    emit(event="join")

    def save():  # torchft serves CPU tensors by reference while this replica trains on: copies
        return {"model": {k: v.clone() for k, v in model.state_dict().items()}, "optim": opt.state_dict()}

    def load_state(state):
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])

    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    pg = torchft.ProcessGroupGloo(timeout=timedelta(seconds=10))
    manager = torchft.Manager(pg=pg, min_replica_size=1, load_state_dict=load_state, state_dict=save,
                              replica_id=f"replica_{args.replica_id}", store_addr="localhost", store_port=store.port,
                              rank=0, world_size=1, lighthouse_addr=args.lighthouse, use_async_quorum=False,
                              timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=60))
    ddp = gradzip.torchft.DistributedDataParallel(manager, pg, model, args.spec, optimizer=opt)

    while manager.current_step() < args.steps:
        start = time.time()
        manager.start_quorum()
        opt.zero_grad()
        quorum_s = time.time() - start
        step = manager.current_step()
        batch = torch.randint(0, len(x_train), (args.batch,),
                              generator=torch.Generator().manual_seed(args.seed * 1_000_003 + 2 * step + args.replica_id))
        loss = F.cross_entropy(ddp(x_train[batch]), y_train[batch])
        if step == args.die_at:
            emit(event="die", step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()
        committed = manager.should_commit()
        if committed:
            opt.step()
        time.sleep(max(0.0, args.step_time - (time.time() - start)))
        emit(event="step", step=step, committed=committed, participants=manager.num_participants(),
             quorum_s=quorum_s, start=start, loss=loss.item(),
             params=hashlib.md5(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest())
    x_test, y_test = load("test")
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    emit(event="final", step=manager.current_step(), accuracy=accuracy, stats=ddp.stats(),
         params=hashlib.md5(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest())
    manager.shutdown(wait=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lost_to_failure(events: list, died: dict) -> dict:
    """For the death `died`: detection, the kill to the end of the survivor's failed step;
    reconfiguration, the survivor's next quorum (without the dead replica); healing, the
    joiner's first quorum (joining and loading the survivor's state), and the survivor's
    quorum in that step."""
    survivor = [e for e in events if e["event"] == "step" and e["replica"] == 0 and e["t"] > died["t"]]
    failed = next(e for e in survivor if not e["committed"])
    after = survivor[survivor.index(failed) + 1]
    joined = next(e for e in events if e["event"] == "join" and e["t"] > died["t"])
    first = next(e for e in events if e["event"] == "step" and e["replica"] == 1 and e["t"] > joined["t"])
    beside = next((e for e in survivor if e["step"] == first["step"]), None)
    if beside is None:
        raise SystemExit("train_torchft.py: the survivor finished before the new replica joined: "
                         "more --steps, a shorter --restart-delay or a longer --step-time")
    return {"failed_step": failed["step"], "detection_s": failed["t"] - died["t"],
            "reconfiguration_s": after["quorum_s"], "alone_steps": first["step"] - failed["step"],
            "healing_joiner_quorum_s": first["quorum_s"], "healing_survivor_quorum_s": beside["quorum_s"],
            "uncommitted_steps": sum(not e["committed"] for e in survivor if e["t"] < first["t"])}


def run(args) -> dict:
    lighthouse_bin = shutil.which("torchft_lighthouse", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if lighthouse_bin is None:
        raise SystemExit("train_torchft.py: torchft_lighthouse not found (pip install torchft-nightly)")
    port = _free_port()
    lighthouse = subprocess.Popen([lighthouse_bin, "--min_replicas", "1", "--bind", f"[::]:{port}",
                                   "--join_timeout_ms", "1000", "--heartbeat_timeout_ms", "1000",
                                   "--quorum_tick_ms", "100"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    events, threads, lock = [], [], threading.Lock()
    files = tempfile.TemporaryDirectory()
    ready, go = Path(files.name) / "ready", Path(files.name) / "go"

    def start(replica_id: int, *extra: str) -> subprocess.Popen:
        command = [sys.executable, __file__, "--replica-id", str(replica_id), "--lighthouse", f"http://localhost:{port}",
                   "--steps", str(args.steps), "--spec", args.spec, "--seed", str(args.seed), "--lr", str(args.lr),
                   "--batch", str(args.batch), "--step-time", str(args.step_time), *extra]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=sys.stderr if args.verbose else subprocess.DEVNULL,
                                   text=True)

        def read():
            for line in process.stdout:
                if line.startswith("{"):
                    with lock:
                        events.append(json.loads(line))
        thread = threading.Thread(target=read)
        thread.start()
        threads.append(thread)
        return process

    began, processes = time.time(), []
    try:
        def dies(i):  # the arguments of replica 1's i-th incarnation: its death, if it has one
            return ["--die-at", str(args.kill_at[i])] if i < len(args.kill_at) else []
        processes += [start(0, "--wait-for", str(ready)), start(1, "--wait-for", str(ready), *dies(0))]
        for i in range(len(args.kill_at)):  # a standby for each death, the next one's victim
            processes.append(start(1, "--wait-for", str(go.with_suffix(f".{i}")), *dies(i + 1)))
        while sum(e["event"] == "standby" for e in list(events)) < len(processes):  # torch imported, data loaded
            if any(p.poll() is not None for p in processes):
                raise SystemExit("train_torchft.py: a replica exited before training")
            time.sleep(0.05)
        ready.touch()  # the two replicas start together
        for i in range(len(args.kill_at)):
            processes[1 + i].wait()
            time.sleep(args.restart_delay)
            go.with_suffix(f".{i}").touch()
        codes = [p.wait() for p in processes]
    finally:
        for p in [lighthouse, *processes]:
            if p.poll() is None:
                p.kill()
        for thread in threads:
            thread.join()
        files.cleanup()
    finals = {e["replica"]: e for e in events if e["event"] == "final"}
    summary = {"spec": args.spec, "steps": args.steps, "seed": args.seed, "wall_s": time.time() - began,
               "exit_codes": codes, "final": [finals.get(r) for r in (0, 1)]}
    ordered = sorted(events, key=lambda e: e["t"])
    summary["failures"] = [_lost_to_failure(ordered, died) for died in ordered if died["event"] == "die"]
    if args.events:
        Path(args.events).write_text("\n".join(json.dumps(e) for e in events) + "\n")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--spec", default="topk:density=0.1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--step-time", type=float, default=0.0, help="each step lasts at least this (s)")
    parser.add_argument("--kill-at", type=int, nargs="*", default=[],
                        help="replica 1 dies inside each of these steps, in turn (none: no failure)")
    parser.add_argument("--restart-delay", type=float, default=0.0, help="s between the death and the standby's join")
    parser.add_argument("--events", help="write every replica's JSON events here")
    parser.add_argument("--verbose", action="store_true", help="the replicas' stderr (torchft's logs)")
    parser.add_argument("--replica-id", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--lighthouse", help=argparse.SUPPRESS)
    parser.add_argument("--die-at", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--wait-for", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replica_id is not None:
        replica(args)
    else:
        print(json.dumps(run(args), indent=1))


if __name__ == "__main__":
    main()
