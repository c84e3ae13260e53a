"""The launchers users already drive: a PyTorch Lightning script (DDPStrategy(process_group_backend=
"gradzip")) and a Hugging Face Accelerate script, neither importing gradzip, each at 2 CPU ranks
with the aggregation set on the launch line (examples/lightning_by_name.py, accelerate_by_name.py)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BIN = Path(sys.executable).parent


def launch(command, spec, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(GRADZIP_AGGREGATION=spec, OMP_NUM_THREADS="1", HF_HOME=str(tmp_path), ACCELERATE_USE_CPU="1",
               CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    ranks = dict(re.findall(r"rank (\d) backend gradzip checksum ([^;]+);", done.stdout))
    assert set(ranks) == {"0", "1"}, done.stdout
    assert ranks["0"] == ranks["1"], f"the ranks' weights differ: {ranks}"
    return float(ranks["0"])


@pytest.mark.parametrize("command", [
    [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(EXAMPLES / "lightning_by_name.py")],
    [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port", "0",
     str(EXAMPLES / "accelerate_by_name.py")],
], ids=["lightning", "accelerate"])
def test_a_launcher_trains_over_gradzip_by_name(command, tmp_path):
    compressed = launch(command, "topk:density=0.01", tmp_path)
    exact = launch(command, "allreduce", tmp_path)
    assert compressed != exact, "the aggregation on the launch line changed nothing"
