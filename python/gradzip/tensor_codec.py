"""Tensors to bytes and back, for code that moves bytes itself (a federated server).

    state = gradzip.codec.State()                       # error feedback across calls
    data = gradzip.codec.encode(grad, "stc:density=0.01", state)
    total = gradzip.codec.decode(data, like=grad)

The spec is the same string the backend and the hook take (docs/spec.md): a codec, its
keys, and the keys of its aggregation (`ef` and `seed` apply here and override the
State's; `min_numel`, `warmup` shape all-reduces only). The bytes are the wire format of
docs/wire-format.md. decode() checks every length and index and raises PayloadError
(a ValueError) naming what is wrong with a truncated, corrupt or hostile payload.
"""
from typing import Optional

import torch

from ._extension import _C
from .spec import SpecError, bind_spec

PayloadError = _C.PayloadError


class State:
    """What one tensor's encoder keeps between calls.

    residual: the error-feedback residual, what earlier payloads did not carry
        (allocated on first use; None until then).
    step: how many payloads were encoded; seeds random-k and QSGD draws.
    seed: the seed of those draws (default 0).
    rank: this sender's index, so QSGD senders draw independently (default 0).
    error_feedback: add the residual before encoding and keep what was not sent; None
        (the default): as every door does, the spec's `ef`, else its codec's default
        (gradzip.Spec.uses_error_feedback: on for topk, stc and sign, off otherwise).
        A spec's explicit `ef` overrides it.
    """

    def __init__(self, seed: int = 0, rank: int = 0, error_feedback: Optional[bool] = None):
        self.residual: Optional[torch.Tensor] = None
        self.step = 0
        self.seed = seed
        self.rank = rank
        self.error_feedback = error_feedback

    def state_dict(self) -> dict:
        return {"residual": self.residual, "step": self.step, "seed": self.seed, "rank": self.rank,
                "error_feedback": self.error_feedback}

    def load_state_dict(self, state: dict) -> None:
        self.residual, self.step = state["residual"], state["step"]
        self.seed, self.rank, self.error_feedback = state["seed"], state["rank"], state["error_feedback"]


def max_payload_bytes(spec, numel: int) -> int:
    """The most bytes a payload of `numel` elements under `spec` can take: the size of a
    buffer that encode(..., out=buffer) always fits."""
    return _C.max_payload_bytes(_codec_spec(spec), numel)


def _codec_spec(spec):
    bound = bind_spec(spec)
    if bound.codec is None:
        raise SpecError(f"gradzip.codec: {str(bound)!r} names an aggregation without a codec; codecs: "
                        + ", ".join(kind["name"] for kind in _C.codec_kinds()))
    if bound.decentralized:
        raise SpecError(f"gradzip.codec: {str(bound)!r} is decentralized gossip, not a codec; encode with "
                        f"{bound.codec!r} instead")
    return bound


def encode(tensor: torch.Tensor, spec, state: Optional[State] = None, out: Optional[torch.Tensor] = None):
    """The payload of `tensor` (any shape, a floating dtype) under `spec` (a string or a
    gradzip.Spec naming a codec): bytes, or with `out` (a contiguous uint8 CPU tensor of at
    least max_payload_bytes(spec, tensor.numel()) bytes, kept from call to call) the view
    of `out` that the payload was written into, with no bytes object made.

    With a State, encodes tensor + state.residual (when error feedback is on: the spec's
    `ef`, else state.error_feedback, else the codec's default), updates the residual and
    advances state.step.

    A tensor holding Inf or NaN (a step mixed precision will skip) gives a header-only
    non-finite payload that decodes to all NaN, and leaves the State as it was."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        raise TypeError(f"gradzip.codec.encode takes a floating tensor, not {getattr(tensor, 'dtype', type(tensor))}")
    bound = _codec_spec(spec)
    x = tensor.detach().to("cpu", torch.float32).contiguous().view(-1)
    residual, seed, step, rank = None, 0, 0, 0
    if state is not None:
        seed, step, rank = state.seed, state.step, state.rank
        if bound.error_feedback is not None:
            error_feedback = bound.error_feedback
        elif state.error_feedback is not None:
            error_feedback = state.error_feedback
        else:
            error_feedback = bound.uses_error_feedback
        if error_feedback:
            if state.residual is None:
                state.residual = torch.zeros(x.numel(), dtype=torch.float32)
            if state.residual.numel() != x.numel():
                raise ValueError(f"gradzip.codec.encode: the state's residual has {state.residual.numel()} "
                                 f"elements, the tensor {x.numel()}: use one State per tensor")
            residual = state.residual
    if bound.seed is not None:
        seed = bound.seed
    if out is None:
        data, finite = _C.encode(x, bound, residual, seed, step, rank)
    else:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"gradzip.codec.encode: out must be a uint8 tensor, not {type(out).__name__}")
        size, finite = _C.encode_into(x, bound, residual, seed, step, rank, out)
        data = out[:size]
    if state is not None and finite:
        state.step += 1
    return data


def decode(data, like: torch.Tensor) -> torch.Tensor:
    """A new tensor shaped like `like` (its dtype and device too) holding the payload's values
    (all NaN for a non-finite payload). `data`: bytes, or a uint8 CPU tensor (what
    encode(..., out=...) returns)."""
    values = torch.zeros(like.numel(), dtype=torch.float32)
    _C.decode_add(data.contiguous() if isinstance(data, torch.Tensor) else bytes(data), values)
    return values.view(like.shape).to(device=like.device, dtype=like.dtype)


def header(data: bytes) -> dict:
    """The payload's header: codec name, wire-format version, element count, and whether
    its sender's input was finite (False: a non-finite payload, the header alone)."""
    raw = bytes(data.contiguous().numpy()[:16]) if isinstance(data, torch.Tensor) else bytes(data)
    codec, version, numel, finite = _C.payload_header(raw)
    return {"codec": codec, "version": version, "numel": numel, "finite": finite}
