"""Writes the golden checkpoint files of the gradzip build that Python imports.

    PYTHONPATH=<that build's python/> python tests/python/checkpoints/generate.py DIR [--doors a,b]

For every door of checkpoint_scenarios.py, two ranks run the scenario; DIR/<door>.pt gets
each rank's checkpoint and the outputs of the step after it, with the build that wrote
them. Files of a format are written once, by a build that shipped it, and committed
(tests/python/checkpoints/README.md lists them); test_checkpoints.py loads every one.
"""
import argparse
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from checkpoint_scenarios import SPECS, scenario  # noqa: E402
from ranks import run_ranks  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--doors", default=",".join(SPECS))
    args = parser.parse_args()
    import gradzip
    source = Path(gradzip.__file__).resolve().parents[2]
    commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    for door in args.doors.split(","):
        results = run_ranks(scenario, 2, door)
        torch.save({"door": door, "spec": SPECS[door], "world_size": 2, "written_by": commit,
                    "torch": torch.__version__,
                    "checkpoints": [r["checkpoint"] for r in results], "outputs": [r["outputs"] for r in results]},
                   out / f"{door}.pt")
        print(f"{out / f'{door}.pt'}: {SPECS[door]} (gradzip {commit[:12]} at {source})")


if __name__ == "__main__":
    main()
