"""A job that loses a rank trains on at another world size (examples/train_elastic.py): a 4-rank
job loses one rank (SIGKILL) after its second checkpoint, and is started again with the 3 ranks
left; it resumes from that checkpoint, the hook's error feedback moved across the world sizes
(state_dict(portable=True)), and finishes within the accuracy band of an uninterrupted run."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_elastic.py"
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


def test_a_job_that_loses_a_rank_resumes_at_3_ranks_and_trains_on(tmp_path):
    reference = launch(4, tmp_path / "reference.pt")
    _, uninterrupted = finished(reference.communicate(timeout=300)[0])

    checkpoint = tmp_path / "elastic.pt"
    job = launch(4, checkpoint)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # the 4-rank job's second checkpoint
        if checkpoint.exists() and torch.load(checkpoint, weights_only=False)["step"] >= 2 * EVERY:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the 4-rank job wrote no second checkpoint")
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
