"""Whole models to bytes and back, for federated servers (APPFL's compress_model shape).

    data = gradzip.codec.compress_model(model.state_dict(), "sz:mode=rel,bound=1e-3,lossless=zstd")
    weights = gradzip.codec.decompress_model(data, like=model)

The spec is a codec spec (docs/spec.md: e.g. `sz`, `zfp`, `uniform`, `qsgd:bits=8`) plus
two keys of the model container (bound in C++: gradzip/model_spec.h; docs/spec.md lists
their defaults):
- `param_cutoff` (default 1024): float tensors with fewer elements are stored exactly;
- `lossless` (default zstd; none, zstd, blosc): the stage after the codec, on every entry.
Non-float tensors (step counters, masks) are stored exactly. Float tensors that hold Inf
or NaN are refused (ValueError naming the entry): no codec bound covers them. Codecs
work in fp32; with an error-bounded codec (sz, zfp) an fp16, bf16 or fp64 tensor is coded
with its bound tightened for the roundings, and checked in its own dtype: where a value
would still leave the bound (or round past the dtype's largest), it is stored exactly. So
the bound holds on every element, in the tensor's own dtype. With a ModelState (error
feedback) the bound holds for what each round sends: the tensor plus its residual.

A model is a torch.nn.Module, a state dict, or dicts of them nested; with batched=True, a
list or dict of models (clients' models sent in one message). Only tensors are leaves.

The bytes are a versioned container (docs/model-format.md) checked with a CRC-32;
decompress_model() checks it against `like` (the names, dtypes and shapes it expects) and
raises PayloadError naming the first problem. No pickle: hostile bytes cannot run code,
and every length is checked before it is used.
"""
import functools
import struct
import zlib
from typing import Optional

import torch

from ._extension import _C
from .tensor_codec import State, decode, encode, header

MAGIC = b"GZMODEL\0"
VERSION = 1
_HEADER = struct.Struct("<8sHBBI")   # magic, version, lossless method, flags, entry count
_ENTRY = struct.Struct("<BBBQQ")     # storage, dtype, ndim, raw bytes, stored bytes
_BATCHED = 1
_PAYLOAD, _EXACT = 0, 1
_LOSSLESS = tuple(_C.lossless_methods())  # the container's byte is the index
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)


class ModelState:
    """Error feedback across rounds: one gradzip.codec.State per compressed entry, made on
    first use and kept by the entry's name. Asking for a ModelState asks for error
    feedback, whatever the codec's default (a spec's explicit ef=0 still turns it off)."""

    def __init__(self, seed: int = 0, rank: int = 0):
        self.seed, self.rank = seed, rank
        self.entries = {}

    def entry(self, name: str) -> State:
        if name not in self.entries:
            self.entries[name] = State(seed=self.seed, rank=self.rank, error_feedback=True)
        return self.entries[name]

    def state_dict(self) -> dict:
        return {"seed": self.seed, "rank": self.rank,
                "entries": {name: s.state_dict() for name, s in self.entries.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.rank, self.entries = state["seed"], state["rank"], {}
        for name, entry in state["entries"].items():
            self.entry(name).load_state_dict(entry)


@functools.lru_cache(maxsize=64)
def bind_model_spec(spec) -> "_C.ModelSpec":
    """A model spec bound once (gradzip/model_spec.h): the codec's spec, the container's
    keys param_cutoff and lossless with their defaults, the codec's error bound; SpecError
    naming what is wrong."""
    return spec if isinstance(spec, _C.ModelSpec) else _C.ModelSpec(str(spec))


def _reference(tensor: torch.Tensor, entry_state) -> torch.Tensor:
    """What the codec is asked to approximate, in float64: the tensor, plus the error-feedback
    residual when its State adds one."""
    x = tensor.detach().to("cpu", torch.float64).view(-1)
    if entry_state is not None and entry_state.error_feedback and entry_state.residual is not None:
        x = x + entry_state.residual.double()
    return x


def _tightened_spec(model_spec, dtype: torch.dtype, reference: torch.Tensor):
    """For an fp16, bf16 or fp64 tensor: the codec spec (mode=abs) whose bound leaves room
    for the roundings between the dtype and the codec's fp32 (half an ulp at the largest
    magnitude, in the coarser of the two), and the bound itself. None when nothing is left."""
    relative, bound = model_spec.error_bound
    if relative:
        bound = bound * (reference.max() - reference.min()).item() if reference.numel() else 0.0
    info = torch.finfo(dtype if dtype != torch.float64 else torch.float32)
    largest = (reference.abs().max().item() if reference.numel() else 0.0) + bound
    tight = bound - max(info.eps * largest, info.tiny * info.eps) / 2
    if not tight > 0.0:
        return None
    return model_spec.with_absolute_bound(tight), bound


def _encode_entry(path, tensor, model_spec, entry_state):
    """The entry's codec payload, or None when it must be stored exactly: an error-bounded
    codec on an fp16, bf16 or fp64 tensor whose decoded values, in that dtype, would leave
    the bound (the bound finer than the dtype, or a value rounding past its largest)."""
    if model_spec.error_bound is None or tensor.dtype == torch.float32:
        raw = encode(tensor, model_spec.codec, entry_state)
        if not header(raw)["finite"]:  # the encoder's own check
            raise ValueError(f"gradzip: {path} holds Inf or NaN: no codec's bound covers them")
        return raw
    if not bool(torch.isfinite(tensor).all()) or tensor.abs().max().item() > torch.finfo(torch.float32).max:
        raise ValueError(f"gradzip: {path} holds Inf, NaN or values beyond fp32: no codec's bound covers them")
    reference = _reference(tensor, entry_state)
    tightened = _tightened_spec(model_spec, tensor.dtype, reference)
    if tightened is None:
        return None
    saved = entry_state.state_dict() if entry_state is not None else None
    if saved is not None and saved["residual"] is not None:
        saved["residual"] = saved["residual"].clone()
    raw = encode(tensor, tightened[0], entry_state)
    decoded = decode(raw, like=tensor).to("cpu", torch.float64).view(-1)
    if bool(torch.isfinite(decoded).all()) and bool(((decoded - reference).abs() <= tightened[1]).all()):
        return raw
    if entry_state is not None:
        entry_state.load_state_dict(saved)  # nothing was sent through the codec
    return None


def _leaves(model, path, out):
    if isinstance(model, torch.nn.Module):
        model = model.state_dict()
    if isinstance(model, torch.Tensor):
        out.append((path, model))
    elif isinstance(model, dict):
        for key, value in model.items():
            if not isinstance(key, str):
                raise TypeError(f"gradzip: model keys are strings; {path or 'the model'} has key {key!r}")
            _leaves(value, f"{path}.{key}" if path else key, out)
    elif isinstance(model, (list, tuple)):
        for i, value in enumerate(model):
            _leaves(value, f"{path}.{i}" if path else str(i), out)
    else:
        raise TypeError(f"gradzip: a model's leaves are tensors; {path or 'the model'} is a {type(model).__name__}")
    return out


def _flatten(model, batched: bool):
    if batched and not isinstance(model, (list, tuple, dict)):
        raise TypeError(f"gradzip: batched=True takes a list or dict of models, not a {type(model).__name__}")
    if not batched and isinstance(model, (list, tuple)):
        raise TypeError("gradzip: a list of models needs batched=True")
    return _leaves(model, "", [])


def _rebuild(like, values):
    if isinstance(like, torch.nn.Module):
        like = like.state_dict()
    if isinstance(like, torch.Tensor):
        return next(values)
    if isinstance(like, dict):
        return type(like)((key, _rebuild(value, values)) for key, value in like.items())
    return type(like)(_rebuild(value, values) for value in like)


def _exact_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().to("cpu").resolve_conj().resolve_neg().contiguous()
    return t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def compress_model(model, spec: str, batched: bool = False, state: Optional[ModelState] = None) -> bytes:
    """The bytes of `model` under `spec` (see the module doc); with a ModelState, each
    compressed entry keeps its error-feedback residual across calls."""
    model_spec = bind_model_spec(spec)
    cutoff, lossless = model_spec.param_cutoff, model_spec.lossless
    leaves = _flatten(model, batched)
    chunks = [_HEADER.pack(MAGIC, VERSION, _LOSSLESS.index(lossless), _BATCHED if batched else 0, len(leaves))]
    for path, tensor in leaves:
        if tensor.dtype not in _DTYPES:
            raise TypeError(f"gradzip: {path} has dtype {tensor.dtype}, which the model container does not store")
        lossy = tensor.is_floating_point() and tensor.numel() >= max(cutoff, 1)
        raw = _encode_entry(path, tensor, model_spec, state.entry(path) if state is not None else None) if lossy else None
        lossy = raw is not None
        if not lossy:
            raw = _exact_bytes(tensor)
        stored = raw if lossless == "none" else _C.lossless_compress(lossless, raw)
        name = path.encode()
        chunks += [struct.pack("<H", len(name)), name,
                   _ENTRY.pack(_PAYLOAD if lossy else _EXACT, _DTYPES.index(tensor.dtype), tensor.dim(), len(raw),
                               len(stored)),
                   struct.pack(f"<{tensor.dim()}Q", *tensor.shape), stored]
    body = b"".join(chunks)
    return body + struct.pack("<I", zlib.crc32(body))


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, size: int, what: str) -> bytes:
        if size > len(self.data) - self.at:
            raise _C.PayloadError(f"gradzip: invalid model container: truncated: {what} needs {size} bytes at "
                                  f"offset {self.at}, only {len(self.data) - self.at} left")
        self.at += size
        return self.data[self.at - size:self.at]

    def unpack(self, layout: struct.Struct, what: str):
        return layout.unpack(self.take(layout.size, what))


def _fail(why: str):
    raise _C.PayloadError(f"gradzip: invalid model container: {why}")


def read_container(data: bytes):
    """(lossless method, batched, [(path, storage, dtype, shape, raw size, stored bytes)]):
    the container's entries, with its framing checked (magic, version, CRC-32, lengths)."""
    data = bytes(data)
    if len(data) < _HEADER.size + 4:
        _fail(f"{len(data)} bytes, fewer than its header and checksum")
    if data[:8] != MAGIC:
        _fail("not a gradzip model container (bad magic)")
    body, (crc,) = data[:-4], struct.unpack("<I", data[-4:])
    if zlib.crc32(body) != crc:
        _fail("the CRC-32 does not match: the bytes were damaged")
    r = _Reader(body)
    _, version, lossless, flags, count = r.unpack(_HEADER, "header")
    if version != VERSION:
        _fail(f"format version {version}, this build reads version {VERSION}")
    if lossless >= len(_LOSSLESS):
        _fail(f"unknown lossless stage {lossless}")
    if flags & ~_BATCHED:
        _fail(f"unknown flags {flags}")
    entries = []
    for _ in range(count):
        (length,) = struct.unpack("<H", r.take(2, "an entry name's length"))
        try:
            path = r.take(length, "an entry name").decode()
        except UnicodeDecodeError:
            _fail(f"entry {len(entries)}'s name is not UTF-8")
        storage, dtype, ndim, raw_size, stored_size = r.unpack(_ENTRY, f"entry {path!r}")
        if storage not in (_PAYLOAD, _EXACT):
            _fail(f"entry {path!r} has unknown storage {storage}")
        if dtype >= len(_DTYPES):
            _fail(f"entry {path!r} has unknown dtype {dtype}")
        shape = struct.unpack(f"<{ndim}Q", r.take(8 * ndim, f"entry {path!r}'s shape"))
        stored = r.take(stored_size, f"entry {path!r}'s bytes")
        entries.append((path, storage, _DTYPES[dtype], shape, raw_size, stored))
    if r.at != len(body):
        _fail(f"{len(body) - r.at} bytes follow the last entry")
    return _LOSSLESS[lossless], bool(flags & _BATCHED), entries


def decompress_model(data: bytes, like, batched: bool = False, accept=None):
    """The model compress_model() turned into `data`, shaped like `like` (a Module gives a
    state dict; dicts and lists keep their type), each tensor on its `like` tensor's device.

    accept: the codec names a payload may use (e.g. ["sz"]; default None: any). A server
    that names the codec its clients were told to use refuses every other one before
    decoding it. What decoding costs is bounded by `like` whatever the bytes say: every
    entry's size is checked against its tensor's before anything is allocated, and each
    codec's decode time by its element count (docs/wire-format.md, "Decoder cost")."""
    if accept is not None:
        accept = [accept] if isinstance(accept, str) else list(accept)
        known = [kind["name"] for kind in _C.codec_kinds()]
        unknown = [name for name in accept if name not in known]
        if unknown:
            raise ValueError(f"gradzip.codec.decompress_model: accept names {unknown}, not codecs; codecs: "
                             + ", ".join(known))
    lossless, was_batched, entries = read_container(data)
    if was_batched != batched:
        _fail(f"it was written with batched={was_batched}, read with batched={batched}")
    expected = _flatten(like, batched)
    if len(entries) != len(expected):
        _fail(f"it holds {len(entries)} tensors, the model {len(expected)}")
    values = []
    for (path, storage, dtype, shape, raw_size, stored), (want, tensor) in zip(entries, expected):
        if path != want:
            _fail(f"entry {path!r} where the model has {want!r}")
        if dtype != tensor.dtype or tuple(shape) != tuple(tensor.shape):
            _fail(f"entry {path!r} is {dtype} {list(shape)}, the model's is {tensor.dtype} {list(tensor.shape)}")
        numel = tensor.numel()
        exact_size = numel * tensor.element_size()
        limit = exact_size if storage == _EXACT else 8 * numel + 1024  # above every codec's largest payload
        if raw_size > limit or (storage == _EXACT and raw_size != exact_size):
            _fail(f"entry {path!r} says {raw_size} bytes, {'exactly' if storage == _EXACT else 'at most'} {limit} fit")
        if storage == _PAYLOAD and not tensor.is_floating_point():
            _fail(f"entry {path!r} is a codec payload, but its dtype {dtype} is not floating")
        raw = _C.lossless_decompress(lossless, stored, raw_size)
        if storage == _PAYLOAD and accept is not None:
            codec = header(raw)["codec"]
            if codec not in accept:
                _fail(f"entry {path!r} is a {codec} payload; this call accepts {', '.join(accept)}")
        if storage == _EXACT:
            if dtype == torch.bool and raw and max(raw) > 1:
                _fail(f"entry {path!r} is bool, but holds bytes other than 0 and 1")
            value = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(tensor.shape) \
                if numel else torch.empty(tensor.shape, dtype=dtype)
            values.append(value.to(tensor.device))
        else:
            values.append(decode(raw, like=tensor))
    return _rebuild(like, iter(values))


def model_stats(data: bytes) -> dict:
    """Bit accounting of a container, as TFF reports it per round: `dense_bits` (every
    tensor at its own dtype's width), `sent_bits` (the container's bytes × 8, framing
    included), and per entry its `dense_bits`, `sent_bits` and storage."""
    _, _, entries = read_container(data)
    per_entry, dense = {}, 0
    for path, storage, dtype, shape, _, stored in entries:
        numel = 1
        for d in shape:
            numel *= d
        bits = numel * torch.empty((), dtype=dtype).element_size() * 8
        dense += bits
        per_entry[path] = {"dense_bits": bits, "sent_bits": len(stored) * 8,
                           "storage": "codec" if storage == _PAYLOAD else "exact"}
    return {"dense_bits": dense, "sent_bits": len(bytes(data)) * 8, "entries": per_entry}
