"""Whole-model codecs' speed and ratio on one state dict, against compressing alone.

    python benchmarks/model_codecs.py             # a 33 MB conv + transformer state dict
    python benchmarks/model_codecs.py --quick     # a 3.5 MB one, two repetitions

gradzip's `zfp` is libzfp's fixed-accuracy stream plus a guarantee: the encoder learns
what the receiver will decode (predicted, csrc/codec/zfp_prediction.h, or decoded where
the prediction does not reach) and corrects every element outside the bound. Rows:
- "libzfp alone": the same library (Debian's libzfp, through ctypes) compressing the same
  tensors at the same absolute tolerances with nothing else: no check, no container, no
  lossless stage. The baseline of "x alone".
- "gradzip zfp codec, each tensor": the codec alone (gradzip.codec.encode on each tensor),
  so its "x alone" is the cost of the bound check.
- compress_model rows: the codec in the model container (names, shapes, the tensors below
  param_cutoff stored exactly, a CRC-32 of the whole), with and without zstd after it.
- zfpy (PyPI; APPFL's ZFP) and SZ3 (PyPI's pysz, SZ3's own Python binding, in its
  absolute-error mode at the same tolerances) when importable, and gradzip `sz`, at the
  same REL bounds (bound × the tensor's max − min). SZ3's largest error over its bound is
  checked on the first call.

One thread; the methods take turns within each of --repetitions repetitions. MB/s: the
state dict's fp32 bytes over a method's fastest call. "x alone": the median, over
repetitions, of a method's time over libzfp alone's in the same repetition (the machine's
speed drifts by ±30% from call to call; the ratio of calls made one after the other
drifts far less). The model is built from a fixed seed (initial weights, no training).
Prints a table and writes JSON.
"""
import argparse
import ctypes
import ctypes.util
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import gradzip

CUTOFF = 1024


class ConvTransformer(nn.Module):
    """A conv stem and a transformer encoder: the shapes of a small vision transformer."""

    def __init__(self, width: int, layers: int):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
                                  nn.Conv2d(128, width, 4, stride=4))
        layer = nn.TransformerEncoderLayer(width, nhead=8, dim_feedforward=4 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, 1000)


class LibZfp:
    """Debian's libzfp through ctypes: fixed-accuracy compression of a 1-D float array."""

    def __init__(self):
        path = ctypes.util.find_library("zfp")
        if path is None:
            raise SystemExit("model_codecs.py: libzfp not found (Debian: libzfp-dev)")
        lib = ctypes.CDLL(path)
        p, size, double = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_double
        for name, restype, argtypes in [("zfp_field_1d", p, [p, ctypes.c_int, size]), ("zfp_field_free", None, [p]),
                                        ("zfp_stream_open", p, [p]), ("zfp_stream_close", None, [p]),
                                        ("zfp_stream_set_accuracy", double, [p, double]),
                                        ("zfp_stream_maximum_size", size, [p, p]), ("stream_open", p, [p, size]),
                                        ("stream_close", None, [p]), ("zfp_stream_set_bit_stream", None, [p, p]),
                                        ("zfp_stream_rewind", None, [p]), ("zfp_compress", size, [p, p])]:
            function = getattr(lib, name)
            function.restype, function.argtypes = restype, argtypes
        self.lib = lib

    def compress(self, values: np.ndarray, tolerance: float) -> int:
        lib = self.lib
        field = lib.zfp_field_1d(values.ctypes.data, 3, values.size)  # zfp_type_float
        stream = lib.zfp_stream_open(None)
        lib.zfp_stream_set_accuracy(stream, tolerance)
        buffer = np.empty(lib.zfp_stream_maximum_size(stream, field), np.uint8)
        bits = lib.stream_open(buffer.ctypes.data, buffer.size)
        lib.zfp_stream_set_bit_stream(stream, bits)
        lib.zfp_stream_rewind(stream)
        written = lib.zfp_compress(stream, field)
        lib.stream_close(bits)
        lib.zfp_stream_close(stream)
        lib.zfp_field_free(field)
        return written


def lossy_tensors(state: dict) -> list:
    """The fp32 tensors a codec compresses (param_cutoff elements or more), flattened."""
    return [t.detach().reshape(-1).numpy() for t in state.values()
            if t.dtype == torch.float32 and t.numel() >= CUTOFF]


def absolute(values: np.ndarray, bound: float) -> float:
    return bound * float(values.max() - values.min())


def timed_turns(calls: dict, repetitions: int) -> dict:
    """Each call's times, the calls taking turns within each repetition (so that a change
    in the machine's speed falls on all of them alike)."""
    times = {name: [] for name in calls}
    for _ in range(repetitions):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--bounds", default="1e-2,1e-3,1e-4")
    parser.add_argument("--repetitions", type=int, default=15)
    parser.add_argument("--json", default="benchmarks/results/model_codecs.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ConvTransformer(width=128, layers=2) if args.quick else ConvTransformer(width=384, layers=4)
    repetitions = 2 if args.quick else args.repetitions
    state = model.state_dict()
    total_bytes = sum(t.numel() * t.element_size() for t in state.values())
    tensors = lossy_tensors(state)
    mb = total_bytes / 1e6
    libzfp = LibZfp()
    try:
        import zfpy
    except ImportError:
        zfpy = None
    try:
        from pysz import sz as sz3, szConfig, szErrorBoundMode
    except ImportError:
        sz3 = None
    print(f"state dict: {mb:.1f} MB, {len(state)} tensors ({len(tensors)} of {CUTOFF} elements or more); "
          f"one thread; {repetitions} repetitions" + ("" if zfpy else "; zfpy not installed") +
          ("" if sz3 else "; pysz (SZ3) not installed"))

    def sz3_compress(values: np.ndarray, tolerance: float) -> np.ndarray:
        config = szConfig()
        config.errorBoundMode = szErrorBoundMode.ABS
        config.absErrorBound = tolerance
        return sz3.compress(values, config)[0]
    header = f"{'method':<34} | {'bound':>6} | {'ratio':>6} | {'comp MB/s':>9} | {'dec MB/s':>8} | {'x alone':>7}"
    print(header)
    print("-" * len(header))
    rows = []

    def row(method, bound, ratio, compress_times, decompress_times, alone_times):
        compress_s = min(compress_times)
        decompress_s = min(decompress_times) if decompress_times else None
        paired = [t / a for t, a in zip(compress_times, alone_times)]
        r = {"method": method, "bound": bound, "ratio": ratio, "compress_mb_s": mb / compress_s,
             "decompress_mb_s": mb / decompress_s if decompress_s else None, "x_alone": statistics.median(paired),
             "x_alone_quartiles": statistics.quantiles(paired, n=4) if len(paired) > 1 else paired}
        rows.append(r)
        dec = f"{r['decompress_mb_s']:8.0f}" if decompress_s else f"{'—':>8}"
        print(f"{method:<34} | {bound:>6g} | {ratio:5.2f}x | {r['compress_mb_s']:9.0f} | {dec} | {r['x_alone']:7.2f}")

    for bound in [float(b) for b in args.bounds.split(",")]:
        tolerances = [absolute(t, bound) for t in tensors]
        untouched = total_bytes - sum(t.nbytes for t in tensors)
        alone_bytes = untouched + sum(libzfp.compress(t, tol) for t, tol in zip(tensors, tolerances))
        codec_spec = gradzip.Spec(f"zfp:mode=rel,bound={bound:g}")
        torch_tensors = [torch.from_numpy(t) for t in tensors]
        codec_payloads = [gradzip.codec.encode(t, codec_spec) for t in torch_tensors]
        specs = {"gradzip zfp, lossless=none": f"zfp:mode=rel,bound={bound:g},lossless=none",
                 "gradzip zfp (zstd after)": f"zfp:mode=rel,bound={bound:g}",
                 "gradzip sz (zstd after)": f"sz:mode=rel,bound={bound:g}"}
        specs = {name: spec + f",param_cutoff={CUTOFF}" for name, spec in specs.items()}
        payloads = {name: gradzip.codec.compress_model(state, spec) for name, spec in specs.items()}
        compress = {"libzfp alone": lambda: [libzfp.compress(t, tol) for t, tol in zip(tensors, tolerances)]}
        compress["gradzip zfp codec, each tensor"] = lambda: [gradzip.codec.encode(t, codec_spec) for t in torch_tensors]
        compress.update({name: (lambda spec=spec: gradzip.codec.compress_model(state, spec)) for name, spec in specs.items()})
        payloads["gradzip zfp codec, each tensor"] = b"x" * (untouched + sum(len(p) for p in codec_payloads))
        decompress = {"gradzip zfp codec, each tensor": lambda: [gradzip.codec.decode(p, like=t)
                                                                  for p, t in zip(codec_payloads, torch_tensors)]}
        decompress.update({name: (lambda p=p: gradzip.codec.decompress_model(p, state)) for name, p in payloads.items()
                           if name in specs})
        if zfpy is not None:
            streams = [zfpy.compress_numpy(t, tolerance=tol) for t, tol in zip(tensors, tolerances)]
            payloads["zfpy (APPFL's ZFP), no check"] = b"x" * (untouched + sum(len(s) for s in streams))
            compress["zfpy (APPFL's ZFP), no check"] = lambda: [zfpy.compress_numpy(t, tolerance=tol)
                                                                 for t, tol in zip(tensors, tolerances)]
            decompress["zfpy (APPFL's ZFP), no check"] = lambda: [zfpy.decompress_numpy(s) for s in streams]
        if sz3 is not None:
            sz3_streams = [sz3_compress(t, tol) for t, tol in zip(tensors, tolerances)]
            errors = [(float(np.abs(sz3.decompress(s, np.float32, t.shape)[0] - t).max()), tol)
                      for s, t, tol in zip(sz3_streams, tensors, tolerances)]
            # A constant tensor's bound is 0: any error there is infinitely over it.
            worst = max(e / tol if tol > 0 else (0.0 if e == 0 else float("inf")) for e, tol in errors)
            name = f"SZ3 (pysz), err/bound {worst:.3f}"
            payloads[name] = b"x" * (untouched + sum(s.nbytes for s in sz3_streams))
            compress[name] = lambda: [sz3_compress(t, tol) for t, tol in zip(tensors, tolerances)]
            decompress[name] = lambda: [sz3.decompress(s, np.float32, t.shape)[0] for s, t in zip(sz3_streams, tensors)]
        compress_s = timed_turns(compress, repetitions)
        decompress_s = timed_turns(decompress, repetitions)
        alone = compress_s["libzfp alone"]
        row("libzfp alone", bound, total_bytes / alone_bytes, alone, None, alone)
        for name in compress_s:
            if name != "libzfp alone":
                row(name, bound, total_bytes / len(payloads[name]), compress_s[name], decompress_s[name], alone)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "state_dict_mb": mb,
                               "repetitions": repetitions, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
