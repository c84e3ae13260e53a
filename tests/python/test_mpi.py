"""The MPI transport under mpirun: the scenarios of mpi_ranks.py, each a real mpirun job."""
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gradzip
from ranks import free_port

SCRIPT = Path(__file__).with_name("mpi_ranks.py")


def mpirun(scenario, ranks, *, timeout=240, store=True):
    """Runs the scenario on `ranks` processes; returns (exit status, output, seconds)."""
    launcher = shutil.which("mpirun")
    assert launcher, "mpirun (Debian's openmpi-bin) is missing: run scripts/install-deps.sh"
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    forwarded = ["-x", "OMP_NUM_THREADS", "-x", "PYTHONWARNINGS", "-x", "PATH"]
    if store:
        env["MASTER_PORT"] = str(free_port())
        forwarded += ["-x", "MASTER_PORT"]
    flags = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    start = time.monotonic()
    done = subprocess.run([launcher, *flags, "--oversubscribe", "-np", str(ranks), *forwarded, sys.executable,
                           str(SCRIPT), scenario], env=env, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def passed_ranks(output):
    return {int(r) for r in re.findall(r"rank (\d+) ok", output)}


needs_mpi = pytest.mark.skipif(not gradzip.mpi.mpi_built(), reason="built without MPI (no libopenmpi-dev)")


def test_built_with_mpi_where_open_mpi_is_installed():
    """scripts/install-deps.sh installs Open MPI (mpirun and its headers), so a build
    without the transport where they are is a defect: this test runs whatever the build."""
    if not (shutil.which("mpirun") and shutil.which("mpicc")):
        pytest.skip("Open MPI (openmpi-bin, libopenmpi-dev) is not installed here: no MPI build is expected")
    assert gradzip.mpi.mpi_built(), "Open MPI is installed but gradzip was built without its MPI transport"


@needs_mpi
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_every_collective_matches_gloo(ranks):
    status, output, _ = mpirun("conformance", ranks)
    assert status == 0 and passed_ranks(output) == set(range(ranks)), output


@needs_mpi
def test_ddp_over_mpi_is_bitwise_ddp_over_gloo():
    status, output, _ = mpirun("ddp", 2)
    assert status == 0 and passed_ranks(output) == {0, 1}, output


@needs_mpi
def test_compressed_aggregations_gossip_and_choco_run_over_mpi_unchanged():
    status, output, _ = mpirun("compressed", 3)
    assert status == 0 and passed_ranks(output) == {0, 1, 2}, output


@needs_mpi
def test_under_mpirun_no_master_addr_or_store_is_needed():
    status, output, _ = mpirun("no_store", 2, store=False)
    assert status == 0 and passed_ranks(output) == {0, 1}, output


@needs_mpi
@pytest.mark.parametrize("scenario", ["adopted", "funneled"])
def test_an_mpi_initialized_before_gradzip(scenario):
    status, output, _ = mpirun(scenario, 2)
    assert status == 0 and passed_ranks(output) == {0, 1}, output


@needs_mpi
def test_bad_calls_give_errors_that_name_the_problem():
    status, output, _ = mpirun("errors", 3)
    assert status == 0 and passed_ranks(output) == {0, 1, 2}, output


@needs_mpi
def test_a_stopped_rank_gives_the_others_a_timeout_error():
    status, output, seconds = mpirun("stopped_rank", 3, timeout=120)
    # Ranks 0 and 2 passed their checks (a timeout error naming the call, then refusal)
    # and exited with status 3; mpirun then ended the stopped rank.
    assert passed_ranks(output) == {0, 2}, output
    assert status != 0 and seconds < 60, output


@needs_mpi
def test_a_killed_rank_ends_the_job_instead_of_hanging():
    status, output, seconds = mpirun("killed_rank", 3, timeout=120)
    assert status != 0 and seconds < 60, output
    assert "rank 1" in output and "signal 9" in output, output


def test_transport_selection(monkeypatch):
    monkeypatch.delenv("GRADZIP_TRANSPORT", raising=False)
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    assert gradzip.mpi.resolve_transport(None, env) == "mpi"
    assert gradzip.mpi.resolve_transport(None, {}) == "gloo"
    assert gradzip.mpi.resolve_transport("gloo", env) == "gloo"
    assert gradzip.mpi.resolve_transport(None, {**env, "GRADZIP_TRANSPORT": "gloo"}) == "gloo"
    assert gradzip.mpi.resolve_transport(None, {"GRADZIP_TRANSPORT": " MPI "}) == "mpi"
    with pytest.raises(ValueError, match="must be one of mpi, gloo, not 'tcp'"):
        gradzip.mpi.resolve_transport("tcp", {})
    with pytest.raises(RuntimeError, match="launched by Open MPI's mpirun"):
        gradzip.mpi.world_from_mpirun({})
