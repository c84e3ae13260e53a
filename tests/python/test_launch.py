"""The same script runs under torchrun, mpirun and srun."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gradzip import launch_environment
from ranks import free_port

SCRIPT = Path(__file__).with_name("launched_allreduce.py")
VENV_BIN = Path(sys.executable).parent


TORCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def rank_lines(output):
    """The ranks' lines; ranks share one stdout, so lines may run into each other."""
    return set(re.findall(r"rank \d+ of \d+ local \d+ backend \w+ sum \d+", output))


def expected_lines(world):
    total = world * (world + 1) // 2
    return {f"rank {r} of {world} local {r} backend gradzip sum {total}" for r in range(world)}


def test_open_mpi_variables_fill_the_torch_ones():
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    assert launch_environment(env) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_slurm_and_mpich_variables_fill_the_torch_ones():
    env = {"SLURM_PROCID": "2", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NNODES": "1",
           "MASTER_PORT": "1234"}
    assert launch_environment(env)["RANK"] == "2" and env["WORLD_SIZE"] == "8" and env["MASTER_PORT"] == "1234"
    env = {"PMI_RANK": "1", "PMI_SIZE": "2"}
    assert launch_environment(env)["RANK"] == "1" and env["LOCAL_RANK"] == "0"


def test_torch_variables_win_over_the_launchers():
    env = {"RANK": "0", "WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6",
           "MASTER_ADDR": "10.1.2.3"}
    assert launch_environment(env)["RANK"] == "0" and env["WORLD_SIZE"] == "1"
    assert env["MASTER_ADDR"] == "10.1.2.3"


def test_multi_node_slurm_without_master_addr_is_an_error():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_NNODES": "2"}
    with pytest.raises(RuntimeError, match="needs MASTER_ADDR"):
        launch_environment(env)


def test_no_launcher_is_an_error_that_says_so(monkeypatch):
    import gradzip
    for name in TORCH_VARIABLES + ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.setenv(name, "")  # so that monkeypatch removes what launch_environment adds
        monkeypatch.delenv(name)
    with pytest.raises(RuntimeError, match="cannot tell this process's rank"):
        gradzip.init_process_group("gradzip")


def run(cmd, env=None, timeout=120):
    full_env = {k: v for k, v in os.environ.items() if k not in TORCH_VARIABLES}
    full_env.update(OMP_NUM_THREADS="1", **(env or {}))
    done = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return rank_lines(done.stdout)


def test_torchrun():
    lines = run([str(VENV_BIN / "torchrun"), "--standalone", "--nproc-per-node", "3", str(SCRIPT)])
    assert lines == expected_lines(3)


def test_mpirun():
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun (Debian's openmpi-bin) is missing: run scripts/install-deps.sh"
    flags = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    lines = run([mpirun, *flags, "--oversubscribe", "-np", "3", "-x", "PATH", "-x", "OMP_NUM_THREADS",
                 "-x", "MASTER_PORT", sys.executable, str(SCRIPT)], env={"MASTER_PORT": str(free_port())})
    assert lines == expected_lines(3)


def test_srun_variables():
    """SLURM is not installed here: start the ranks as srun would, with its variables."""
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(SCRIPT)], stdout=subprocess.PIPE, text=True,
                              env={**{k: v for k, v in os.environ.items() if k not in TORCH_VARIABLES},
                                   "SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r),
                                   "SLURM_NNODES": "1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"})
             for r in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert rank_lines("\n".join(outputs)) == expected_lines(2)
