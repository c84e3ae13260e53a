"""The main job and the benchmark run end to end (short versions)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def torchrun(script, *args, nproc=2):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), str(ROOT / script), *args],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_training_example_learns_on_fashion_mnist():
    out = torchrun("examples/train_fashion_mnist.py", "--epochs", "1", "--max-steps", "60",
                   "--spec", "stc:density=0.01")
    accuracy = float(re.search(r"final test accuracy: ([\d.]+)%", out).group(1))
    assert accuracy > 60, out  # 60 steps of 2 x 64 images: well above chance (10%)
    sent = re.search(r"sent per rank \[([\d.]+), ([\d.]+)\] MB  \(([\d.]+)x fewer", out)
    assert sent and sent.group(1) == sent.group(2) and float(sent.group(1)) > 0, out
    assert float(sent.group(3)) > 50, out  # STC at 1%: far fewer bytes than dense


def test_collectives_benchmark_quick(tmp_path):
    out = torchrun("benchmarks/collectives.py", "--quick", "--json", str(tmp_path / "c.json"))
    assert "gradzip / gloo" in out and "1 MB" in out, out
    result = json.loads((tmp_path / "c.json").read_text())
    assert result["world_size"] == 2 and len(result["rows"]) == 2
    for row in result["rows"]:
        assert set(row["median_s"]) == {"gloo", "gradzip", "gradzip (validate=False)"}
        assert all(t > 0 for t in row["median_s"].values())


def test_codecs_benchmark_quick(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/codecs.py"), "--quick", "--json",
                           str(tmp_path / "codecs.json")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "faster" in done.stdout and "of memcpy" in done.stdout, done.stdout
    result = json.loads((tmp_path / "codecs.json").read_text())
    assert {row["codec"] for row in result["rows"]} >= {"topk:density=0.01", "stc:density=0.01", "sign",
                                                          "qsgd:bits=4"}
    assert all(row["encode_s"] > 0 and row["decode_s"] > 0 for row in result["rows"])
