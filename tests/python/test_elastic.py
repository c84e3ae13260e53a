"""A job that loses a rank trains on at another world size (examples/train_elastic.py): a 4-rank
job loses one rank (SIGKILL) after its second checkpoint, and is started again with the 3 ranks
left, or torchrun's elastic agents (4 of them, --nnodes 3:4) lose one with its worker and
restart the other workers at 3 ranks by themselves; either resumes from that checkpoint, the
hook's error feedback moved across the world sizes (state_dict(portable=True)), and finishes
within the accuracy band of an uninterrupted run."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ranks import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_elastic.py"
STORE = EXAMPLE.with_name("rendezvous_store.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")
STEPS, EVERY = 200, 20


def environment():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def launch(ranks, checkpoint, **popen):
    return subprocess.Popen([str(TORCHRUN), "--standalone", "--nproc-per-node", str(ranks), str(EXAMPLE),
                             "--checkpoint", str(checkpoint), "--steps", str(STEPS), "--every", str(EVERY)],
                            env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


def finished(output):
    found = re.findall(r"finished \d+ steps with (\d) ranks: test accuracy ([\d.]+)%", output)
    assert len(found) == 1, output[-4000:]
    return int(found[0][0]), float(found[0][1])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The test accuracy of the job run through at 4 ranks."""
    reference = launch(4, tmp_path_factory.mktemp("reference") / "reference.pt")
    return finished(reference.communicate(timeout=300)[0])[1]


def wait_for_checkpoint(checkpoint, step):
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            if torch.load(checkpoint, weights_only=False)["step"] >= step:
                return
        except (FileNotFoundError, EOFError, RuntimeError):  # not written yet, or being written
            pass
        time.sleep(0.05)
    raise AssertionError(f"the 4-rank job wrote no checkpoint of step {step}")


def worker_rank(agent_pid):
    """The RANK of the worker an agent started (its child), or None."""
    for pid in process_tree(agent_pid)[1:]:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"RANK="):
                return entry[5:].decode()
    return None


def process_tree(pid):
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid] + [p for child in children for p in process_tree(int(child))]


def test_a_job_that_loses_a_rank_resumes_at_3_ranks_and_trains_on(tmp_path, uninterrupted):
    checkpoint = tmp_path / "elastic.pt"
    job = launch(4, checkpoint)
    wait_for_checkpoint(checkpoint, 2 * EVERY)
    ranks = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()
    assert len(ranks) == 4, ranks
    os.kill(int(ranks[-1]), signal.SIGKILL)  # one rank lost
    output = job.communicate(timeout=300)[0]
    assert job.returncode != 0 and "finished" not in output, output[-4000:]
    lost_at = torch.load(checkpoint, weights_only=False)["step"]

    again = launch(3, checkpoint)
    output = again.communicate(timeout=300)[0]
    assert again.returncode == 0, output[-4000:]
    assert f"start at step {lost_at} with 3 ranks" in output
    world, accuracy = finished(output)
    assert world == 3
    assert abs(accuracy - uninterrupted) <= 2.0, (accuracy, uninterrupted)


def test_torchruns_elastic_agents_lose_a_node_and_restart_the_rest_at_3_ranks(tmp_path, uninterrupted):
    """4 agents (one per "node", --nnodes 3:4, --max-restarts 3) around a rendezvous store of
    their own (examples/rendezvous_store.py); after the second checkpoint one agent and its
    worker are killed. The others' workers fail in their next collective, their agents
    rendezvous again without the lost node and restart them at 3 ranks, which resume from the
    checkpoint and finish. The node lost is rank 0's."""
    port = free_port()
    store = subprocess.Popen([sys.executable, str(STORE), str(port), "--host", "127.0.0.1"], env=environment(),
                             stdout=subprocess.PIPE, text=True)
    assert "rendezvous store" in store.stdout.readline()
    checkpoint = tmp_path / "elastic.pt"
    logs = [tmp_path / f"agent{i}.log" for i in range(4)]  # files: a full pipe would stall an agent
    agents = [subprocess.Popen(
        [str(TORCHRUN), "--nnodes", "3:4", "--nproc-per-node", "1", "--max-restarts", "3", "--rdzv-backend", "c10d",
         "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "elastic", "--monitor-interval", "0.5",
         "--rdzv-conf", "is_host=false,join_timeout=60,last_call_timeout=2,close_timeout=10",
         str(EXAMPLE), "--checkpoint", str(checkpoint), "--steps", str(STEPS), "--every", str(EVERY)],
        env={**environment(), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},  # each round's own workers' store
        stdout=log.open("w"), stderr=subprocess.STDOUT) for log in logs]
    try:
        wait_for_checkpoint(checkpoint, 2 * EVERY)
        # The node lost is the one whose worker is rank 0: its agent served the first round's
        # workers' store by default, the hard case.
        victim = next(i for i, agent in enumerate(agents) if worker_rank(agent.pid) == "0")
        for pid in process_tree(agents[victim].pid):  # its agent and its worker
            os.kill(pid, signal.SIGKILL)
        left = [i for i in range(4) if i != victim]
        for i in left:
            agents[i].wait(timeout=300)
        outputs = [logs[i].read_text() for i in left]
    finally:
        for process in (*agents, store):
            if process.poll() is None:
                process.kill()
    assert [agents[i].returncode for i in left] == [0, 0, 0], "\n".join(o[-3000:] for o in outputs)
    output = "".join(outputs)
    lost_at = torch.load(checkpoint, weights_only=False)["step"]
    assert "start at step 0 with 4 ranks" in logs[victim].read_text()  # rank 0 prints, until it is lost
    restarts = re.findall(r"start at step (\d+) with (\d) ranks", output)
    assert restarts[-1] == (str(lost_at), "3") or int(restarts[-1][0]) <= lost_at, restarts
    assert restarts[-1][1] == "3", restarts
    world, accuracy = finished(output)
    assert world == 3
    assert abs(accuracy - uninterrupted) <= 2.0, (accuracy, uninterrupted)
