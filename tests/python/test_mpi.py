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
ROOT = Path(__file__).resolve().parents[2]


def launcher_command(ranks, forwarded):
    """The command that starts `ranks` processes under the launcher of the MPI this build
    links (Open MPI's mpirun, MPICH's mpiexec), passing on the variables `forwarded`."""
    family = gradzip.mpi.library_family(gradzip.mpi.mpi_library())
    if family == "MPICH":
        launcher = shutil.which("mpiexec.mpich") or shutil.which("mpiexec.hydra")
        assert launcher, "MPICH's mpiexec is missing: install Debian's mpich"
        return [launcher, "-n", str(ranks)]  # Hydra passes the whole environment on
    launcher = shutil.which("mpirun.openmpi") or shutil.which("mpirun")
    assert launcher, "mpirun (Debian's openmpi-bin) is missing: run scripts/install-deps.sh"
    flags = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [launcher, *flags, "--oversubscribe", "-np", str(ranks), *[f for name in forwarded for f in ("-x", name)]]


def mpirun(scenario, ranks, *, timeout=240, store=True, env=None, script=SCRIPT, args=None):
    """Runs the scenario of `script` (mpi_ranks.py; another script takes `args` instead) on
    `ranks` processes, with the variables `env` added; returns (exit status, output, seconds)."""
    added = dict(env or {})
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **added)
    forwarded = ["OMP_NUM_THREADS", "PYTHONWARNINGS", "PATH", *added]
    if store:
        env["MASTER_PORT"] = str(free_port())
        forwarded.append("MASTER_PORT")
    start = time.monotonic()
    command = [str(script), *(args if args is not None else [scenario])]
    done = subprocess.run([*launcher_command(ranks, forwarded), sys.executable, *command], env=env,
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def passed_ranks(output):
    return {int(r) for r in re.findall(r"rank (\d+) ok", output)}


needs_mpi = pytest.mark.skipif(not gradzip.mpi.mpi_built(), reason="built without MPI (no libopenmpi-dev or libmpich-dev)")


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
def test_host_staging_over_mpi_gives_the_mpi_transports_bits():
    status, output, _ = mpirun("staged", 3)
    assert status == 0 and passed_ranks(output) == {0, 1, 2}, output


@needs_mpi
def test_the_hierarchical_exchange_runs_over_mpi_sub_communicators():
    status, output, _ = mpirun("hierarchical", 4, env={"GRADZIP_NODE_SIZE": "2"})
    assert status == 0 and passed_ranks(output) == {0, 1, 2, 3}, output


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
def test_waiting_for_a_late_rank_holds_no_core():
    """benchmarks/late_peer.py's short mode: ranks that wait 1.5 s for a late rank use at
    most a quarter of a core meanwhile (a wait that only yields uses all it gets)."""
    status, output, _ = mpirun(None, 3, script=ROOT / "benchmarks" / "late_peer.py",
                               args=["--late", "1.5", "--check", "0.25"])
    assert status == 0 and len(re.findall(r"wait, rank [12]: ", output)) == 4, output


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
    # Rank 1 killed itself, and the launcher says a process died of SIGKILL (Open MPI:
    # "rank 1 with PID ... exited on signal 9"; MPICH: "Killed (signal 9)").
    assert "rank 1 is pid" in output and "signal 9" in output, output


OPEN_MPI = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"
MPICH = "MPICH Version:      4.0.2\nMPICH Release date: Thu Apr  7 12:34:45 CDT 2022"


def test_the_build_names_the_mpi_it_links():
    library = gradzip.mpi.mpi_library()
    assert bool(library) == gradzip.mpi.mpi_built()
    if library:
        assert gradzip.mpi.library_family(library) in ("Open MPI", "MPICH"), library


def test_transport_selection(monkeypatch):
    monkeypatch.delenv("GRADZIP_TRANSPORT", raising=False)
    ompi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    hydra = {"PMI_RANK": "1", "PMI_SIZE": "3"}
    assert gradzip.mpi.library_family(OPEN_MPI) == "Open MPI" and gradzip.mpi.library_family(MPICH) == "MPICH"
    assert gradzip.mpi.library_family("Intel(R) MPI Library 2021.6") == "MPICH"
    assert gradzip.mpi.library_family("") is None
    # The launcher of the MPI the build links picks MPI; any other launcher, or none, Gloo.
    assert gradzip.mpi.resolve_transport(None, ompi, OPEN_MPI) == "mpi"
    assert gradzip.mpi.resolve_transport(None, hydra, MPICH) == "mpi"
    assert gradzip.mpi.resolve_transport(None, hydra, OPEN_MPI) == "gloo"
    assert gradzip.mpi.resolve_transport(None, ompi, MPICH) == "gloo"
    assert gradzip.mpi.resolve_transport(None, ompi, "") == "gloo"
    assert gradzip.mpi.resolve_transport(None, {}, OPEN_MPI) == "gloo"
    assert gradzip.mpi.world_from_mpirun(hydra, MPICH) == (1, 3)
    assert gradzip.mpi.world_from_mpirun(ompi, OPEN_MPI) == (0, 2)
    # Chosen explicitly.
    assert gradzip.mpi.resolve_transport("gloo", ompi, OPEN_MPI) == "gloo"
    assert gradzip.mpi.resolve_transport(None, {**ompi, "GRADZIP_TRANSPORT": "gloo"}, OPEN_MPI) == "gloo"
    assert gradzip.mpi.resolve_transport(None, {"GRADZIP_TRANSPORT": " MPI "}, MPICH) == "mpi"
    with pytest.raises(ValueError, match="must be one of mpi, gloo, not 'tcp'"):
        gradzip.mpi.resolve_transport("tcp", {}, OPEN_MPI)
    # Refusals that name the problem.
    with pytest.raises(RuntimeError, match="no MPI transport: install Open MPI .* or MPICH"):
        gradzip.mpi.resolve_transport("mpi", {}, "")
    with pytest.raises(RuntimeError, match="started by MPICH's mpiexec .* links another MPI \\(Open MPI v4.1.4"):
        gradzip.mpi.resolve_transport("mpi", hydra, OPEN_MPI)
    with pytest.raises(RuntimeError, match="started by Open MPI's mpirun .* links another MPI \\(MPICH Version"):
        gradzip.mpi.resolve_transport("mpi", ompi, MPICH)
    with pytest.raises(RuntimeError, match="started by Open MPI's mpirun \\(OMPI_COMM_WORLD_RANK and"):
        gradzip.mpi.world_from_mpirun({}, OPEN_MPI)
    with pytest.raises(RuntimeError, match="started by MPICH's mpiexec \\(Hydra\\) \\(PMI_RANK and PMI_SIZE"):
        gradzip.mpi.world_from_mpirun(ompi, MPICH)
