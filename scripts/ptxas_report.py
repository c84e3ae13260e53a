#!/usr/bin/env python3
"""Prints ptxas's resource report (registers, stack, spills, shared memory) per kernel
and architecture from a build log made with -Xptxas=-v, gradzip's kernels first.

    cmake --build build -j1 -v 2>&1 | tee build.log; python scripts/ptxas_report.py build.log
"""
import re
import subprocess
import sys
from pathlib import Path


def entries(text):
    kernel = arch = frame = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for '(sm_\d+)'", line)
        if m:
            kernel, arch, frame = m.group(1), m.group(2), None
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and kernel:
            frame = tuple(int(g) for g in m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and kernel:
            smem = re.search(r"(\d+) bytes smem", line)
            yield kernel, arch, int(m.group(1)), frame or (0, 0, 0), int(smem.group(1)) if smem else 0
            kernel = None


def codec_names():
    """CodecId's values and names (kFp16 = 2 -> {2: "fp16"}), from include/gradzip/codec.h."""
    header = Path(__file__).resolve().parent.parent / "include" / "gradzip" / "codec.h"
    body = re.search(r"enum class CodecId[^{]*\{([^}]*)\}", header.read_text()).group(1)
    return {int(v): k[1:].lower() for k, v in re.findall(r"(k\w+) = (\d+)", body)}


def short(demangled, codecs):
    name = demangled.replace("gradzip::cuda::(anonymous namespace)::", "").replace("gradzip::cuda::", "")
    name = re.sub(r"^void ", "", name)
    # template arguments (before the cut below): (gradzip::CodecId)2 -> fp16
    name = re.sub(r"\(gradzip::CodecId\)(\d+)", lambda m: codecs.get(int(m.group(1)), m.group(1)), name)
    if name.startswith("cub::"):  # cub::CUB_300001_SM_800_900::detail::scan::DeviceScanKernel<...> -> cub scan::DeviceScanKernel
        return "cub " + re.sub(r"<.*$", "", re.sub(r"^cub::CUB_\w+::(detail::)?", "", name))
    return re.sub(r"\(.*$", "", name)


def main():
    rows = list(entries(open(sys.argv[1]).read()))
    names = subprocess.run(["c++filt"], input="\n".join(r[0] for r in rows), capture_output=True, text=True).stdout.split("\n")
    codecs = codec_names()
    seen = set()
    table = []
    for (mangled, arch, regs, (stack, spill_st, spill_ld), smem), name in zip(rows, names):
        key = (short(name, codecs), arch, regs, stack, spill_st, spill_ld, smem)
        if key in seen:
            continue
        seen.add(key)
        table.append(key)
    table.sort(key=lambda r: (r[0].startswith("cub "), r[0], r[1]))
    print(f"{'kernel':40s} {'arch':6s} {'regs':>4s} {'stack':>5s} {'spill st':>8s} {'spill ld':>8s} {'smem':>6s}")
    for name, arch, regs, stack, st, ld, smem in table:
        print(f"{name[:40]:40s} {arch:6s} {regs:4d} {stack:5d} {st:8d} {ld:8d} {smem:6d}")


if __name__ == "__main__":
    main()
