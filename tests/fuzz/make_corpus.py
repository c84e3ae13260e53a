"""Writes the fuzzers' seed corpus: valid payloads of every codec, from small tensors with
the shapes that reach each code path (ties, zeros, Inf, both STC position codings, QSGD
widths, sign blocks, top-k's 4-byte indices and its coded positions, sz's exact values and
Rice escapes, zfp's corrections, polar's partial blocks, uniform's widths), into tests/fuzz/corpus/<codec>/,
and gossip message headers into tests/fuzz/corpus/peer_header/.

    .venv/bin/python tests/fuzz/make_corpus.py
"""
import hashlib
import pathlib
import struct

import torch

import gradzip

SPECS = {
    "identity": ["identity"],
    "fp16": ["fp16"],
    "bf16": ["bf16"],
    "topk": ["topk:density=0.1", "topk:density=0.5", "topk:density=1", "topk:density=0.1,approx=1",
             "topk:density=0.1,values=fp16", "topk:density=0.9,values=bf16"],
    "randomk": ["randomk:density=0.1", "randomk:density=0.5,seed=7"],
    "stc": ["stc:density=0.01", "stc:density=0.3", "stc:density=0.9"],
    "sign": ["sign", "sign:block=8", "sign:block=0", "sign:vote=majority"],
    "qsgd": ["qsgd:bits=2", "qsgd:bits=4", "qsgd:bits=8,bucket=16", "qsgd:bits=4,norm=max"],
    "sz": ["sz:mode=abs,bound=1e-2", "sz:predictor=lorenzo", "sz:mode=abs,bound=1e-30"],
    "zfp": ["zfp:mode=abs,bound=1e-2", "zfp", "zfp:mode=abs,bound=1e-30"],
    "polar": ["polar:block=16", "polar:rate=0.25,block=64", "polar:rate=1,block=8"],
    "uniform": ["uniform:threshold=0", "uniform:bits=3,threshold=0", "uniform"],
}


def inputs():
    g = torch.Generator().manual_seed(0)
    yield torch.randn(1, generator=g)
    yield torch.randn(37, generator=g)
    yield torch.zeros(64)
    ties = torch.ones(100)
    ties[::3] = -1
    yield ties
    yield torch.randn(300, generator=g) * 1e-3


def unseeded_codecs():
    """Registered codecs that SPECS gives no seed specs (fuzz.sh refuses to fuzz them)."""
    return sorted({kind["name"] for kind in gradzip._C.codec_kinds()} - SPECS.keys())


def main():
    if unseeded_codecs():
        raise SystemExit(f"make_corpus.py: no seed specs for {', '.join(unseeded_codecs())}: add them to SPECS")
    root = pathlib.Path(__file__).parent / "corpus"
    for codec, specs in SPECS.items():
        folder = root / codec
        folder.mkdir(parents=True, exist_ok=True)
        for spec in specs:
            for x in inputs():
                data = gradzip.codec.encode(x, spec)
                (folder / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)
        inf = torch.randn(20)
        inf[3] = float("inf")
        data = gradzip.codec.encode(inf, specs[0])  # the non-finite payload
        (folder / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)


def peer_headers():
    """gossip/choco headers (csrc/aggregate/peer_header.h): bytes, finite, dtype, numel, step, accepts."""
    folder = pathlib.Path(__file__).parent / "corpus" / "peer_header"
    folder.mkdir(parents=True, exist_ok=True)
    for fields in ([4000, 1, 6, 1000, 0, 4000], [0, 0, 6, 1000, 7, 600], [129, 1, 15, 300, 2, 129], [8, 1, 6, 2]):
        data = struct.pack(f"<{len(fields)}q", *fields)
        (folder / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)


if __name__ == "__main__":
    main()
    peer_headers()
