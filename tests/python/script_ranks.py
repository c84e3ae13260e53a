"""Runs a script on ranks as `torchrun --standalone --nproc-per-node N` does, for tests.

run_script(script, *args, nproc=N) starts N processes with torchrun's variables (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), runs the
script in each as `__main__` with its folder first on sys.path and the repository as the
working directory, and returns every rank's standard output, rank 0's first. A rank that
exits with an error, or ranks that outlive `timeout`, fail the call with every rank's
output and errors.

The ranks are forked from the server of ranks.rank_processes(), which imported torch and
gradzip once: a launch costs a fork per rank instead of torchrun's own start and one
import of torch per rank (about 4 CPU-seconds each). torchrun itself is tested by
test_launch.py and by the training example's test.
"""
import os
import runpy
import sys
import time
from pathlib import Path

from ranks import free_port, rank_processes

ROOT = Path(__file__).resolve().parents[2]


def _run_rank(script, args, env, stdout_path, stderr_path):
    for fd, path in ((1, stdout_path), (2, stderr_path)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(file, fd)
        os.close(file)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(Path(script).parent))
    runpy.run_path(str(script), run_name="__main__")


def run_script(script, *args, nproc=2, env=None, timeout=300, workdir):
    """The output of `script` run on `nproc` ranks (see the module's text); `workdir` holds
    the ranks' output files."""
    ctx = rank_processes()
    port = free_port()
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    base.update({"OMP_NUM_THREADS": "1", **(env or {})})
    procs, files = [], []
    for rank in range(nproc):
        rank_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                        LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        out, err = Path(workdir) / f"rank{rank}.out", Path(workdir) / f"rank{rank}.err"
        files.append((out, err))
        procs.append(ctx.Process(target=_run_rank, args=(ROOT / script, [str(a) for a in args], rank_env, out, err)))
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    late = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    codes = [p.exitcode for p in procs]
    stdout = "".join(out.read_text() for out, _ in files)
    if late or any(codes):
        report = "".join(f"--- rank {r}: exit code {codes[r]} ---\n{out.read_text()[-3000:]}{err.read_text()[-3000:]}"
                         for r, (out, err) in enumerate(files))
        raise AssertionError(f"{script} {' '.join(map(str, args))}: ranks {late} outlived {timeout} s\n{report}"
                             if late else f"{script} {' '.join(map(str, args))} failed\n{report}")
    return stdout
