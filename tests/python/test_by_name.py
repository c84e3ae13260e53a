"""gradzip found by name, as users' launchers and unmodified scripts reach it: torch's entry
points register "gradzip" without `import gradzip` (python/gradzip_autoload.py), `import torch`
loads no gradzip, TORCH_DEVICE_BACKEND_AUTOLOAD=0 is honoured, and a build that cannot load
beside the running torch names both torches and the command that rebuilds."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import gradzip

SCRIPT = Path(__file__).with_name("by_name.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")
# torch 2.14 and later look the name up in the torch.distributed.backends entry points when a
# group names it; older ones only run the torch.backends entry points at `import torch`.
LAZY_LOOKUP = hasattr(dist.Backend, "_ensure_backend_registered")

pytestmark = pytest.mark.torch_range


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def python(code, **env):
    return subprocess.run([sys.executable, "-c", code], env=clean_env(**env), capture_output=True, text=True,
                          timeout=120)


def torchrun(nproc, **env):
    done = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", str(nproc), str(SCRIPT)],
                          env=clean_env(**env), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    lines = re.findall(r"rank (\d+) backend (\S+) loaded-with-torch (\w+) broadcast (\S+) sent (\d+) dense (\d+) "
                       r"checksum ([^;]+);", done.stdout)
    assert len(lines) == nproc, done.stdout
    return {int(r): dict(backend=b, loaded=l, broadcast=float(y), sent=int(s), dense=int(d), checksum=c)
            for r, b, l, y, s, d, c in lines}


@pytest.mark.parametrize("backend", ["gradzip", "cpu:gradzip,cuda:gradzip"])
def test_an_unmodified_script_gets_the_spec_of_its_launch_line(backend):
    ranks = torchrun(2, BACKEND=backend, GRADZIP_AGGREGATION="topk:density=0.01")
    assert {r["backend"] for r in ranks.values()} == {backend}
    assert {r["loaded"] for r in ranks.values()} == {"False"}, "import torch loaded gradzip"
    assert {r["broadcast"] for r in ranks.values()} == {1.0}
    assert len({r["checksum"] for r in ranks.values()}) == 1, "the ranks disagree"
    # top-k 1%: indices and values of 41 of 4096 elements, far below dense's bytes
    assert all(0 < r["sent"] < r["dense"] / 20 for r in ranks.values()), ranks
    dense = torchrun(2, BACKEND=backend, GRADZIP_AGGREGATION="allreduce")
    assert dense[0]["checksum"] != ranks[0]["checksum"], "the spec on the launch line changed nothing"


def test_import_torch_loads_no_gradzip():
    done = python("import sys, torch, torch.distributed as dist; "
                  "print(sorted(m for m in sys.modules if m.startswith('gradzip')), 'gradzip' in dist.Backend.backend_list)")
    assert done.returncode == 0, done.stderr
    # torch imports the entry point's small module; before torch 2.14 it registers the name there
    expected = f"['gradzip_autoload'] {not LAZY_LOOKUP}"
    assert done.stdout.strip() == expected
    assert "gradzip" not in done.stderr


def test_autoload_off_runs_nothing_of_gradzip_at_import_torch():
    done = python("import sys, torch, torch.distributed as dist; "
                  "print(sorted(m for m in sys.modules if m.startswith('gradzip')), 'gradzip' in dist.Backend.backend_list)",
                  TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] False"


def test_the_name_is_found_once_gradzip_is_imported_whatever_the_autoload():
    done = python("import torch, gradzip, torch.distributed as dist; print('gradzip' in dist.Backend.backend_list)",
                  TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr


@pytest.fixture
def mismatched_build(tmp_path):
    """A copy of this gradzip whose record says it was built against another torch."""
    package = Path(gradzip.__file__).parent
    shutil.copytree(package, tmp_path / "gradzip", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(Path(sys.modules["gradzip_autoload"].__file__), tmp_path)
    record = json.loads((package / "_build.json").read_text())
    record["torch"] = "2.8.0"
    (tmp_path / "gradzip" / "_build.json").write_text(json.dumps(record))
    return str(tmp_path)


def test_a_build_for_another_torch_never_breaks_import_torch(mismatched_build):
    done = python("import torch; print(torch.ones(2).sum().item())", PYTHONPATH=mismatched_build)
    assert done.returncode == 0 and done.stdout.strip() == "2.0", done.stderr
    if LAZY_LOOKUP:
        assert done.stderr == ""  # nothing of gradzip runs at import torch
    else:
        assert done.stderr.count("gradzip was built against torch 2.8.0") == 1, done.stderr


def test_a_build_for_another_torch_names_both_at_import_and_at_the_first_group(mismatched_build):
    running = torch.__version__.split("+")[0]
    done = python("import gradzip", PYTHONPATH=mismatched_build)
    assert done.returncode != 0
    assert "gradzip was built against torch 2.8.0" in done.stderr and f"but torch {running}" in done.stderr
    assert "pip install --no-build-isolation" in done.stderr
    done = python("import torch.distributed as dist\n"
                  "try:\n"
                  "    dist.init_process_group('gradzip', store=dist.HashStore(), rank=0, world_size=1)\n"
                  "except Exception as e:\n"
                  "    print(type(e).__name__, e)\n",
                  PYTHONPATH=mismatched_build)
    assert done.returncode == 0, done.stderr
    assert "gradzip was built against torch 2.8.0" in done.stdout, done.stdout + done.stderr


def test_build_info_names_the_torch_and_the_libraries():
    info = gradzip.build_info()
    assert info["torch"] == torch.__version__.split("+")[0]
    assert info["torch_cuda"] == (torch.version.cuda or "")
    assert set(info["system_libraries"]) == {"libzfp", "libzstd", "libblosc"}
