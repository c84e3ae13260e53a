"""Compiles every torch-facing source of gradzip against another torch release's headers
(-fsyntax-only), without installing that torch: the headers come from its wheel. It answers
"does gradzip build against release X" for releases that cannot be installed here; a full
build and the smoke set beside a release that can be is scripts/second_torch.sh.

    python scripts/torch_headers_check.py torch-2.11.0-*.whl [...]   (a wheel: `pip download --no-deps torch==2.11.0`)

The compile lines are those of a configured CPU-only build (default build-torch2.13.0, which
scripts/second_torch.sh makes), with that build's torch headers swapped for the wheel's and its
precompiled header left out. Prints one line per release and exits non-zero if any fails.
"""
import argparse
import re
import shlex
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def compile_lines(build):
    """(source, argv) for each C++ compile of `build` that sees torch's headers."""
    out = subprocess.run(["ninja", "-C", str(build), "-t", "commands", "_C"], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        if " -c " not in line or "/torch/include" not in line or not line.rstrip().endswith(".cpp"):
            continue
        argv = shlex.split(line)
        argv = argv[argv.index(next(a for a in argv if re.search(r"(^|/)(c\+\+|g\+\+|clang\+\+)$", a))):]
        yield argv[-1], argv


def syntax_only(argv, torch_include):
    """argv with the wheel's headers, no precompiled header, no output: only a syntax check."""
    kept, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
            continue
        if arg in ("-include", "-MT", "-MF", "-o"):
            skip = 1
            continue
        if arg in ("-MD", "-Winvalid-pch", "-fpch-preprocess", "-c"):
            continue
        kept.append(re.sub(r"^.*?/torch/include", str(torch_include), arg) if "/torch/include" in arg else arg)
    return kept[:-1] + ["-fsyntax-only", kept[-1]]


def check(wheel, lines, jobs):
    with tempfile.TemporaryDirectory() as scratch, zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.startswith("torch/include/") or m == "torch/version.py"]
        archive.extractall(scratch, members)
        version = re.search(r"__version__ = '([^']+)'", Path(scratch, "torch/version.py").read_text()).group(1)
        include = Path(scratch, "torch/include")

        def one(item):
            source, argv = item
            done = subprocess.run(syntax_only(argv, include), capture_output=True, text=True)
            return source, done.returncode, done.stderr

        with ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(one, lines))
    failed = [(s, err) for s, rc, err in results if rc != 0]
    print(f"torch {version}: {len(results) - len(failed)}/{len(results)} sources compile", flush=True)
    for source, err in failed:
        errors = [l for l in err.splitlines() if "error" in l][:5]
        print(f"  {source}:\n    " + "\n    ".join(errors))
    return not failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheels", nargs="+", type=Path)
    parser.add_argument("--build", type=Path, default=Path("build-torch2.13.0"))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    lines = list(compile_lines(args.build))
    if not lines:
        sys.exit(f"no compile lines in {args.build}: run scripts/second_torch.sh first")
    ok = [check(wheel, lines, args.jobs) for wheel in args.wheels]
    sys.exit(0 if all(ok) else 1)


if __name__ == "__main__":
    main()
