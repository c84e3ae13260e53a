"""The main job and the benchmark run end to end (short versions)."""
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from script_ranks import ROOT, run_script

TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def torchrun(script, *args, nproc=2):
    """The main job's way: torchrun itself (the benchmarks run under run_script, its variables
    without its start-up)."""
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
    out = run_script("benchmarks/collectives.py", "--quick", "--json", tmp_path / "c.json", workdir=tmp_path)
    assert "speedup" in out and "stc:density=0.01" in out, out
    result = json.loads((tmp_path / "c.json").read_text())
    assert result["world_size"] == 2 and result["network"] == "loopback"
    methods = {row["method"]: row for row in result["rows"]}
    assert set(methods) == {"gloo", "allreduce", "allreduce unchecked", "fp16", "topk:density=0.01",
                            "topk:density=0.01,values=fp16", "stc:density=0.01", "sign", "qsgd:bits=4", "qsgd:bits=8"}
    assert all(row["median_s"] > 0 for row in methods.values())
    # Bytes per rank, 2 ranks, 1M fp32: the ring sends 4 MB; STC at 1% well under 1% of that.
    assert methods["gloo"]["bytes_sent"] == methods["allreduce"]["bytes_sent"] == 4_000_000
    assert methods["allreduce unchecked"]["bytes_sent"] == 4_000_000
    assert methods["stc:density=0.01"]["bytes_sent"] < 40_000
    assert methods["topk:density=0.01,values=fp16"]["bytes_sent"] < 0.5 * methods["topk:density=0.01"]["bytes_sent"]
    assert 8 < methods["sign"]["fewer_bytes_than_gloo"] < 32
    assert methods["gloo"]["exchange"] == "dense" and methods["sign"]["exchange"] in ("oneshot", "twophase")
    # On loopback the floor is memory traffic alone: none for the dense methods.
    assert all((row["floor_s"] > 0) == (name not in ("gloo", "allreduce", "allreduce unchecked"))
               for name, row in methods.items())
    # No link time: the floor that overlap cannot beat (the larger of link and memory time) is the same.
    assert all(row["overlapped_floor_s"] == row["floor_s"] for row in methods.values())


def test_cuda_allreduce_benchmark_runs_its_rows_on_cpu(tmp_path):
    # benchmarks/gpu.sh runs it on GPUs (NCCL); --device cpu checks the script here.
    out = run_script("benchmarks/cuda_allreduce.py", "--device", "cpu", "--quick", "--json", tmp_path / "a.json",
                     workdir=tmp_path)
    result = json.loads((tmp_path / "a.json").read_text())
    assert result["baseline"] == "gloo" and result["world"] == 2 and result["numel"] == 100_000, out
    methods = {row["method"]: row for row in result["rows"]}
    assert set(methods) == {"gloo", "gloo fp16 copy"} | {f"gradzip {s}" for s in
                                                         ("fp16", "topk:density=0.01", "stc:density=0.01", "sign",
                                                          "qsgd:bits=4", "qsgd:bits=8", "qsgd:bits=4,exchange=twophase",
                                                          "qsgd:bits=4,exchange=twophase,rounds=4")}
    assert methods["gloo"]["bytes_sent"] == 400_000  # 2 ranks: the ring sends 2(P-1)/P x 4n
    assert 150_000 < methods["gradzip fp16"]["bytes_sent"] < 250_000
    assert methods["gradzip stc:density=0.01"]["bytes_sent"] < 8_000
    assert all(row["seconds"] > 0 and row["floor_seconds"] > 0 for row in methods.values())


FAKE_PYTHON = """#!/bin/bash
case "$1" in
  -c) [[ "$2" == *device_count* ]] && echo 2; exit 0 ;;
  -m) echo "3 passed"; exit 0 ;;
  *) echo "ran $*"; [[ "$1" == *cuda_kernels.py ]] && exit 1; exit 0 ;;
esac
"""


def test_gpu_script_runs_every_stage_and_names_what_failed(tmp_path):
    # benchmarks/gpu.sh's own flow, with stand-ins for the GPU machine's tools: a python
    # that sees 2 GPUs and whose kernels' table misses a target, a compute-sanitizer that
    # reports, a ctest and a torchrun that pass. Every stage still runs; the summary
    # names the failed steps.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"python": FAKE_PYTHON, "torchrun": "#!/bin/bash\necho ran torchrun $*\n",
                       "compute-sanitizer": "#!/bin/bash\nexit 1\n", "ctest": "#!/bin/bash\nexit 0\n"}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, GRADZIP_VENV=str(tmp_path), PATH=f"{bin_dir}:{os.environ['PATH']}")
    stages = "test,cputest,sanitize,kernels,allreduce"
    out_dir = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "benchmarks/gpu.sh"), "--quick", "--only", stages, "--out", str(out_dir)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    summary = [line for line in out.splitlines() if line.startswith("gpu.sh: FAILED: ")]
    assert len(summary) == 1, out
    failed = summary[0].removeprefix("gpu.sh: FAILED: ").split(";")
    assert {"compute-sanitizer memcheck", "compute-sanitizer racecheck", "compute-sanitizer synccheck",
            "benchmarks/cuda_kernels.py (targets met)"} <= set(failed), out
    assert "ctest (CPU)" not in failed and "benchmarks/cuda_allreduce.py" not in failed, out
    assert "ran torchrun --standalone --nproc-per-node 2 benchmarks/cuda_allreduce.py --numel 4000000" in out
    assert f"ran benchmarks/cuda_kernels.py --quick --out {out_dir}/cuda_kernels.json" in out
    # The logs and the summary stay in the output folder.
    assert (out_dir / "summary.txt").read_text() == summary[0] + "\n"
    assert {"gpu.log", "gtest_cuda.log", "test_cuda.log", "sanitize_memcheck.log"} <= {p.name for p in out_dir.iterdir()}
    bad = subprocess.run(["bash", str(ROOT / "benchmarks/gpu.sh"), "--fast"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "unknown argument '--fast'" in bad.stdout
    bad = subprocess.run(["bash", str(ROOT / "benchmarks/gpu.sh"), "--only", "test,bench"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "unknown stage 'bench'" in bad.stdout


def test_gpu_script_stops_starting_steps_at_its_deadline(tmp_path):
    # A machine lent for minutes: with the deadline spent, no step starts, each is named
    # as not run, and the run fails; a chosen sanitizer subset is the only one asked for.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"python": FAKE_PYTHON, "compute-sanitizer": "#!/bin/bash\necho sanitizer $*\nexit 0\n"}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, GRADZIP_VENV=str(tmp_path), PATH=f"{bin_dir}:{os.environ['PATH']}")
    gpu_sh = ["bash", str(ROOT / "benchmarks/gpu.sh"), "--out", str(tmp_path / "out"), "--only", "sanitize"]
    done = subprocess.run(gpu_sh + ["--deadline", "0"], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "gpu.sh: NOT RUN: compute-sanitizer memcheck;compute-sanitizer racecheck;compute-sanitizer synccheck" in out
    done = subprocess.run(gpu_sh + ["--deadline", "120", "--sanitize-tools", "racecheck", "--sanitize-filter", "A.*"],
                          env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    log = (tmp_path / "out" / "sanitize_racecheck.log").read_text()
    assert "sanitizer --tool racecheck --error-exitcode 1 ./build/gradzip_tests --gtest_filter=A.*" in log, log
    assert "memcheck" not in out.replace("sanitize-tools", ""), out


def test_gpu_script_names_a_sanitizer_the_gpu_does_not_support_as_not_run(tmp_path):
    # compute-sanitizer answers "Device not supported" on some GPU machine types: those
    # steps are not run, not failed, and a tool that reports errors still fails.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sanitizer = ('#!/bin/bash\n[[ "$*" == *memcheck* ]] && { echo "========= Error: Device not supported"; exit 1; }\n'
                 'echo "========= ERROR SUMMARY: 1 error"; exit 1\n')
    for name, text in {"python": FAKE_PYTHON, "compute-sanitizer": sanitizer}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, GRADZIP_VENV=str(tmp_path), PATH=f"{bin_dir}:{os.environ['PATH']}")
    done = subprocess.run(["bash", str(ROOT / "benchmarks/gpu.sh"), "--out", str(tmp_path / "out"), "--only", "sanitize",
                           "--sanitize-tools", "memcheck,racecheck"],
                          env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "gpu.sh: NOT RUN: compute-sanitizer memcheck" in out, out
    assert "gpu.sh: FAILED: compute-sanitizer racecheck" in out, out


def test_gpu_script_takes_a_python_and_debian_packages(tmp_path):
    # The path for a GPU machine without network: --python puts that Python's directory
    # (its ctest, cmake, ninja) first on PATH, and --debs unpacks the packages into a
    # private prefix that the build (CMAKE_PREFIX_PATH) and the tests (LD_LIBRARY_PATH) see.
    bin_dir = tmp_path / "env" / "bin"
    bin_dir.mkdir(parents=True)
    tools = {"python": FAKE_PYTHON,
             "ctest": '#!/bin/bash\necho "ctest sees LD_LIBRARY_PATH=$LD_LIBRARY_PATH CMAKE_PREFIX_PATH=$CMAKE_PREFIX_PATH"\n'}
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    arch = subprocess.run(["uname", "-m"], capture_output=True, text=True).stdout.strip()
    package = tmp_path / "package"
    (package / "DEBIAN").mkdir(parents=True)
    (package / "DEBIAN" / "control").write_text(
        "Package: gradzip-fake\nVersion: 1\nArchitecture: all\nMaintainer: gradzip\nDescription: a test\n")
    lib = package / "usr" / "lib" / f"{arch}-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libgradzipfake.so.1").write_text("not a library")
    (lib / "libz.so.1").write_text("the system has its own")
    debs = tmp_path / "debs"
    debs.mkdir()
    subprocess.run(["dpkg-deb", "--build", str(package), str(debs / "fake.deb")], check=True, capture_output=True)
    env = dict(os.environ, TMPDIR=str(tmp_path))
    done = subprocess.run(["bash", str(ROOT / "benchmarks/gpu.sh"), "--python", str(bin_dir / "python"),
                           "--debs", str(debs), "--only", "cputest", "--out", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = done.stdout + done.stderr
    prefix = tmp_path / "gradzip-debs"
    assert (prefix / "usr" / "lib" / f"{arch}-linux-gnu" / "libgradzipfake.so.1").exists(), out
    # At run time only what the system lacks: its own zlib comes first.
    assert f"ctest sees LD_LIBRARY_PATH={prefix}/runtime" in out, out
    assert (prefix / "runtime" / "libgradzipfake.so.1").exists() and not (prefix / "runtime" / "libz.so.1").exists()
    assert f"CMAKE_PREFIX_PATH={prefix}/usr" in out, out
    assert "=== gpu.sh: ctest (CPU): ok" in out, out
    missing = subprocess.run(["bash", str(ROOT / "benchmarks/gpu.sh"), "--python", str(tmp_path / "nothing")],
                             capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 2 and "is not an executable" in missing.stdout


def test_train_benchmark_quick(tmp_path):
    out = run_script("benchmarks/train.py", "--quick", "--seeds", "0", "1", "--target", "0.15",
                     "--out", tmp_path / "train", workdir=tmp_path)
    result = json.loads((tmp_path / "train.json").read_text())
    assert list(result["results"]) == ["none", "torch-fp16", "torch-powersgd-1", "stc:density=0.01",
                                       "gossip:topology=ring", "backend:sign",
                                       "aggregation:qsgd:bits=4"], out
    compute = result["compute_only_step_seconds"]
    assert compute > 0 and result["placement"] in out
    # DDP's own step, with a hook that communicates nothing: measured before and after the
    # methods like the compute-only step, and reported beside it.
    ddp_local = result["ddp_without_communication_step_seconds_before_after"]
    assert len(ddp_local) == 2 and min(ddp_local) > 0 and "communicates nothing" in out
    assert result["ddp_without_communication_step_seconds"] == pytest.approx(sum(ddp_local) / 2)
    assert result["step_over_ddp_without_communication"] == pytest.approx(
        {name: step / result["ddp_without_communication_step_seconds"] for name, step in result["step_seconds"].items()})
    for name, by_seed in result["results"].items():
        assert list(by_seed) == ["0", "1"], (name, out)
        for epochs in by_seed.values():
            assert epochs[0]["accuracy"] > 0.15 and epochs[0]["bytes_sent"] > 0 and epochs[0]["steps"] == 5, \
                (name, epochs)
        assert by_seed["0"] != by_seed["1"], name  # each seed its own run
        # Every method reaches 15% in its first epoch, dense too: efficiency is then its
        # step over the compute-only step, the same steps as dense.
        summary = result["summary"][name]
        step = sum(e[-1]["seconds"] for e in by_seed.values()) / sum(e[-1]["steps"] for e in by_seed.values())
        assert summary["steps_to_target"] == {"0": 5, "1": 5} and summary["steps_over_dense"] == 1.0, summary
        assert summary["efficiency"] == pytest.approx(step / compute), (summary, step, compute)
    sent = {name: by_seed["0"][0]["bytes_sent"] for name, by_seed in result["results"].items()}
    assert sent["torch-fp16"] < sent["none"] and sent["stc:density=0.01"] < sent["none"]
    assert sent["backend:sign"] < sent["none"] / 8
    assert sent["aggregation:qsgd:bits=4"] < sent["none"] / 4
    assert (tmp_path / "train.png").stat().st_size > 10_000


def test_train_benchmarks_resnet_and_its_gpu_refusal():
    # The GPU run's model (benchmarks/gpu.sh's train stage): ResNet-18 for 28x28 images.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train
    import torch
    model = train.ResNet18()
    assert sum(p.numel() for p in model.parameters()) == 11_172_810
    out = model(torch.randn(2, 1, 28, 28))
    assert out.shape == (2, 10)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    if not torch.cuda.is_available():
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks/train.py"), "--device", "cuda"],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert done.returncode == 2 and "--device cuda: no GPU is visible here" in done.stderr, done.stderr


def test_decentralized_example_learns(tmp_path):
    out = run_script("examples/train_decentralized.py", "--epochs", "1", "--max-steps", "40",
                     "--spec", "choco:topology=ring,compress=sign,block=64,gamma=0.5", workdir=tmp_path)
    accuracy = float(re.search(r"final test accuracy: ([\d.]+)%", out).group(1))
    assert accuracy > 50, out


def test_consensus_benchmark_quick(tmp_path):
    run_script("benchmarks/consensus.py", "--quick", "--json", tmp_path / "c.json", nproc=4, workdir=tmp_path)
    rows = {row["spec"]: row for row in json.loads((tmp_path / "c.json").read_text())["rows"]}
    assert rows["gossip:topology=onepeer"]["steps_to_1e-3"] == 2  # exact after log2 4 steps
    ring = rows["gossip:topology=ring"]
    assert ring["measured_rate"] <= ring["predicted_rate"] * (1 + 1e-3)  # fp32 rounding
    assert len(rows) == 7


def test_federated_benchmark_quick(tmp_path):
    run_script("benchmarks/federated.py", "--quick", "--json", tmp_path / "f.json", nproc=1, workdir=tmp_path)
    result = json.loads((tmp_path / "f.json").read_text())
    stc = result["stc"]["stc up 0.001 / down 0.002"]
    dense = result["stc"]["fedavg (fp32)"]
    assert len(stc) == 3 and sum(r["bits_up"] for r in stc) * 100 < sum(r["bits_up"] for r in dense)
    eight = result["8bit"]["8-bit broadcast + updates"]
    ratio = sum(r["bits_up"] + r["bits_down"] for r in result["8bit"]["fedavg (fp32)"]) / \
        sum(r["bits_up"] + r["bits_down"] for r in eight)
    assert 3.0 < ratio < 4.0, ratio
    assert abs(eight[-1]["accuracy"] - result["8bit"]["fedavg (fp32)"][-1]["accuracy"]) < 0.05
    models = {row["run"]: row for row in result["model"]}  # (c): whole models through compress_model
    for bound in ("0.01", "0.001"):
        for codec in ("sz", "zfp"):
            row = models[f"gradzip {codec} REL {bound}"]
            assert row["max_error_over_bound"] <= 1.0 and row["ratio"] > 1.5, row
    assert models["gradzip sz REL 0.01"]["ratio"] > models["gradzip zfp REL 0.01"]["ratio"]
    assert 3.0 < models["gradzip uniform (TFF 8-bit)"]["ratio"] < 4.5


def test_decoder_cost_benchmark_quick(tmp_path):
    run_script("benchmarks/decoder_cost.py", "--quick", "--json", tmp_path / "d.json", nproc=1, workdir=tmp_path)
    rows = {row["codec"]: row for row in json.loads((tmp_path / "d.json").read_text())["rows"]}
    assert {"identity", "sz", "zfp", "polar", "polar, hostile, block 65536"} <= set(rows)
    hostile = next(row for name, row in rows.items() if name.startswith("polar, hostile"))
    assert hostile["numel"] == 1 << 16 and hostile["payload_bytes"] < 64  # a few dozen bytes for 2^16 elements
    assert rows["identity"]["payload_bytes"] == 16 + 4 * (1 << 16)


def test_model_codecs_benchmark_quick(tmp_path):
    run_script("benchmarks/model_codecs.py", "--quick", "--bounds", "1e-3", "--json", tmp_path / "m.json", nproc=1,
               workdir=tmp_path)
    rows = {row["method"]: row for row in json.loads((tmp_path / "m.json").read_text())["rows"]}
    assert {"libzfp alone", "gradzip zfp codec, each tensor", "gradzip zfp, lossless=none",
            "gradzip sz (zstd after)"} <= set(rows)
    # The codec writes libzfp's stream: the same bytes but for its header and corrections.
    alone, codec = rows["libzfp alone"], rows["gradzip zfp codec, each tensor"]
    assert abs(codec["ratio"] - alone["ratio"]) < 0.02 * alone["ratio"], (codec, alone)
    assert rows["gradzip sz (zstd after)"]["ratio"] > codec["ratio"]


@functools.cache
def _netns_usable():
    """None when this machine lets netns.sh build its network (root, namespaces, veth, tbf);
    else why not. Probed once per process, in a namespace named after it: pytest's workers
    collect this file at the same time, and a shared name would fail one of them."""
    if os.geteuid() != 0:
        return "benchmarks/netns.sh needs root"
    probe = f"gradzip-test-probe-{os.getpid()}"
    steps = [["ip", "netns", "add", probe],
             ["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"],
             ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "p0", "root", "tbf",
              "rate", "1gbit", "burst", "128kb", "latency", "50ms"]]
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is missing"
    try:
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                return f"this machine cannot build netns.sh's network: {' '.join(step[:4])}: {done.stderr.strip()}"
        return None
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)


@pytest.mark.skipif(_netns_usable() is not None, reason=str(_netns_usable()))
def test_netns_runs_ranks_on_a_shaped_network(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(ROOT / "benchmarks/netns.sh"), "--ranks", "2", "--rate", "1gbit", "--",
                           sys.executable, str(ROOT / "benchmarks/collectives.py"), "--quick", "--specs",
                           "stc:density=0.01", "--json", str(tmp_path / "n.json")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "n.json").read_text())
    assert result["network"].startswith("netns: 1gbit"), result["network"]
    # 4 MB of ring traffic per rank at 1 Gbit/s takes at least 32 ms.
    gloo = next(row for row in result["rows"] if row["method"] == "gloo")
    assert gloo["median_s"] > 0.032, gloo
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "gz" not in listed, listed  # everything it created is gone


@pytest.mark.skipif(_netns_usable() is not None, reason=str(_netns_usable()))
def test_netns_nodes_share_a_namespace_and_a_shaped_link(tmp_path):
    """--nodes 2 with 4 ranks: two ranks per namespace, the variables of a multi-node
    torchrun, and the hierarchical benchmark counts the bytes each node's link sent:
    fewer for the hierarchical exchange than for the flat one."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(ROOT / "benchmarks/netns.sh"), "--ranks", "4", "--nodes", "2", "--rate", "1gbit", "--",
                           sys.executable, str(ROOT / "benchmarks/hierarchy.py"), "--quick", "--specs",
                           "qsgd:bits=4", "--json", str(tmp_path / "h.json")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "h.json").read_text())
    assert (result["nodes"], result["per_node"]) == (2, 2) and "2 nodes of 2 ranks" in result["network"]
    link = result["rows"][0]["link_bytes_per_node"]
    assert 0 < link["hierarchical"] < 0.75 * link["flat"], link
    bad = subprocess.run([str(ROOT / "benchmarks/netns.sh"), "--ranks", "4", "--nodes", "3", "--", "true"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--nodes must divide" in bad.stderr


def test_hierarchy_benchmark_quick_and_its_model(tmp_path):
    """The benchmark on one machine playing 2 nodes of 2 ranks (no link to count: the
    model's bytes), and the model alone at a scale: the hierarchical exchange's node
    link carries at most 1/L of the flat one's plus framing."""
    env = {"GRADZIP_NODE_SIZE": "2"}
    run_script("benchmarks/hierarchy.py", "--quick", "--specs", "stc:density=0.01;fp16", "--rate", "1gbit", "--json",
               tmp_path / "h.json", nproc=4, env=env, workdir=tmp_path)
    result = json.loads((tmp_path / "h.json").read_text())
    assert [row["spec"] for row in result["rows"]] == ["stc:density=0.01", "fp16"]
    for row in result["rows"]:
        assert row["link_bytes_per_node"] is None
        assert all(row["seconds"][m] > 0 for m in ("gloo", "flat", "hierarchical"))
        assert row["predicted_seconds"]["hierarchical"] > 0
    out = run_script("benchmarks/hierarchy.py", "--predict", "64x8", "--rate", "100gbit", "--specs", "qsgd:bits=4",
                     nproc=1, workdir=tmp_path)
    row = next(line.split() for line in out.splitlines() if line.startswith("qsgd:bits=4"))
    assert float(row[4]) > 4, out  # flat/hier: L = 8 minus the ring's own (P-1)/(N-1) share
    run_script("benchmarks/hierarchy.py", "--quick", "--op", "reduce_scatter", "--specs", "fp16", "--json",
               tmp_path / "r.json", nproc=4, env=env, workdir=tmp_path)
    row, = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert row["spec"] == "fp16:reduce_scatter=compressed" and row["op"] == "reduce_scatter"
    assert all(row["seconds"][m] > 0 for m in ("gloo", "flat", "hierarchical"))


def test_codecs_benchmark_quick(tmp_path):
    out = run_script("benchmarks/codecs.py", "--quick", "--json", tmp_path / "codecs.json", nproc=1, workdir=tmp_path)
    assert "faster" in out and "x floor" in out, out
    result = json.loads((tmp_path / "codecs.json").read_text())
    assert {row["codec"] for row in result["rows"]} >= {"topk:density=0.01", "stc:density=0.01", "sign",
                                                          "qsgd:bits=4"}
    assert all(row["encode_s"] > 0 and row["decode_s"] > 0 for row in result["rows"])
    assert all(row["encode_floor_s"] > 0 and row["decode_floor_s"] > 0 for row in result["rows"])


def test_soak_is_flat(tmp_path):
    """The soak's short version: memory and descriptors flat over 600 all_reduces per
    aggregation, while 60 one-off tensors pass through the backend (each would keep a
    400 KB residual forever if expired keys kept their state: +24 MB and more)."""
    run_script("benchmarks/soak.py", "--calls", "600", "--json", tmp_path / "soak.json", workdir=tmp_path)
    result = json.loads((tmp_path / "soak.json").read_text())
    assert len(result["rows"]) == 8 and result["fds_left"] == 0
    for row in result["rows"]:
        assert row["fd_growth"] == 0 and row["rss_growth_mb"] < 12, row


def test_sharded_benchmark_quick(tmp_path):
    out = run_script("benchmarks/sharded.py", "--quick", "--json", tmp_path / "s.json", nproc=1, timeout=600,
                     workdir=tmp_path)
    result = json.loads((tmp_path / "s.json").read_text())
    (fsdp,), (diloco,) = result["fsdp"], result["diloco"]
    # The example gives compress() its SGD, whose momentum folds into STC's reduce-scatter.
    assert fsdp["spec"] == "stc:density=0.01,momentum=0.9" and diloco["spec"] == "qsgd:bits=4,ef=1,norm=max"
    assert fsdp["accuracy"] > 0.2 and fsdp["fewer_bytes_than_exact"] > 50, out
    assert diloco["accuracy"] > 0.5 and diloco["fewer_bytes_than_ddp"] > 100, out
    assert "| spec | accuracy | vs exact (points)" in out

