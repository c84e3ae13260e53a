"""gradzip.codec.compress_model / decompress_model: APPFL's shapes, error bounds on every
element, exact storage where promised, and a container that refuses damaged or hostile
bytes with PayloadError."""
import struct
import zlib
from collections import OrderedDict

import pytest
import torch

import gradzip
from gradzip import codec
from gradzip.model_codec import _ENTRY, _HEADER

PayloadError = gradzip.PayloadError


def model_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return OrderedDict([
        ("conv.weight", torch.randn(16, 3, 5, 5, generator=g) * 0.1),
        ("conv.bias", torch.randn(16, generator=g)),
        ("fc.weight", torch.randn(64, 300, generator=g) * 0.05),
        ("fc.half", (torch.randn(2000, generator=g)).half()),
        ("fc.bf16", (torch.randn(2000, generator=g)).bfloat16()),
        ("fc.double", torch.randn(3000, generator=g, dtype=torch.float64)),
        ("bn.num_batches_tracked", torch.tensor(17)),
        ("mask", torch.rand(1500, generator=g) > 0.5),
        ("ids", torch.randint(-5, 5, (40, 40), generator=g)),
        ("empty", torch.zeros(0, 3)),
    ])


def bound_of(spec, t):
    bound = float(spec.split("bound=")[1].split(",")[0])
    t = t.double()
    return bound if "mode=abs" in spec else bound * (t.max() - t.min()).item()


@pytest.mark.parametrize("spec", ["sz:mode=rel,bound=1e-3", "sz:mode=abs,bound=1e-4,lossless=blosc",
                                  "zfp:mode=rel,bound=1e-2,lossless=none", "zfp:mode=abs,bound=1e-5"])
def test_error_bound_holds_on_every_element_and_the_rest_is_exact(spec):
    state = model_state()
    out = codec.decompress_model(codec.compress_model(state, spec), like=state)
    assert list(out) == list(state) and isinstance(out, OrderedDict)
    for name, t in state.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape, name
        if t.is_floating_point() and t.numel() >= 1024:
            err = (out[name].double() - t.float().double()).abs().max().item()
            assert err <= bound_of(spec, t.float()), (name, err)
        else:
            assert torch.equal(out[name], t), name


def test_param_cutoff_stores_small_tensors_exactly():
    state = model_state()
    out = codec.decompress_model(codec.compress_model(state, "sz:bound=1e-1,param_cutoff=100000"), like=state)
    for name, t in state.items():
        assert torch.equal(out[name], t), name
    stats = codec.model_stats(codec.compress_model(state, "sz:bound=1e-1,param_cutoff=0"))
    assert stats["entries"]["conv.bias"]["storage"] == "codec"
    assert stats["entries"]["ids"]["storage"] == "exact"


def test_every_codec_goes_through_the_container():
    state = model_state()
    for kind in gradzip._C.codec_kinds():
        spec = kind["name"]
        out = codec.decompress_model(codec.compress_model(state, spec), like=state)
        for name, t in state.items():
            assert out[name].shape == t.shape and out[name].dtype == t.dtype, (spec, name)
            if not t.is_floating_point():
                assert torch.equal(out[name], t), (spec, name)


def test_modules_nested_dicts_and_batched_models():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(100, 50), torch.nn.BatchNorm1d(50), torch.nn.Linear(50, 3))
    out = codec.decompress_model(codec.compress_model(net, "sz:bound=1e-4"), like=net)
    net.load_state_dict(out)  # names, shapes and dtypes fit the module
    nested = {"client": {"model": model_state(1), "extra": [torch.ones(3000), torch.arange(5)]}}
    back = codec.decompress_model(codec.compress_model(nested, "zfp:bound=1e-3"), like=nested)
    assert torch.equal(back["client"]["extra"][1], torch.arange(5))
    clients = [model_state(s) for s in range(3)]
    data = codec.compress_model(clients, "uniform", batched=True)
    out = codec.decompress_model(data, like=clients, batched=True)
    assert isinstance(out, list) and len(out) == 3
    with pytest.raises(PayloadError, match="batched=True"):
        codec.decompress_model(data, like=clients)
    with pytest.raises(TypeError, match="batched=True"):
        codec.compress_model(clients, "uniform")
    with pytest.raises(TypeError, match="list or dict of models"):
        codec.compress_model(torch.ones(3), "uniform", batched=True)
    with pytest.raises(TypeError, match="leaves are tensors"):
        codec.compress_model({"lr": 0.1}, "uniform")


def test_non_finite_weights_are_refused_by_name():
    state = model_state()
    state["fc.weight"][3, 7] = float("nan")
    with pytest.raises(ValueError, match="fc.weight holds Inf or NaN"):
        codec.compress_model(state, "sz")
    state = model_state()
    state["fc.double"][0] = float("inf")
    with pytest.raises(ValueError, match="fc.double"):
        codec.compress_model(state, "zfp")


def test_bad_model_keys_are_refused():
    with pytest.raises(gradzip.SpecError, match="lossless must be one of none, zstd, blosc, got 'lz4'"):
        codec.compress_model(model_state(), "sz:lossless=lz4")
    with pytest.raises(gradzip.SpecError, match="param_cutoff.*-3"):
        codec.compress_model(model_state(), "sz:param_cutoff=-3")
    with pytest.raises(gradzip.SpecError, match="unknown key 'density'.*container's keys param_cutoff, lossless"):
        codec.compress_model(model_state(), "sz:density=0.1")
    with pytest.raises(gradzip.SpecError, match="'allreduce' is an aggregation without a codec"):
        codec.compress_model(model_state(), "allreduce:lossless=none")


def test_the_model_spec_is_bound_once_with_the_defaults_of_its_key_table():
    keys = {key["name"]: key["default"] for key in gradzip._C.model_container_keys()}
    assert keys == {"param_cutoff": "1024", "lossless": "zstd"}
    spec = gradzip._C.ModelSpec("zfp:lossless=blosc,bound=1e-2")
    assert (spec.param_cutoff, spec.lossless) == (1024, "blosc")
    assert str(spec) == "zfp:bound=1e-2,lossless=blosc" and str(spec.codec) == "zfp:bound=1e-2"
    assert spec.error_bound == (True, 1e-2)  # mode's default, from zfp's key table
    tight = spec.with_absolute_bound(0.1 + 0.2)
    assert isinstance(tight, gradzip.Spec) and tight.params == {"bound": repr(0.1 + 0.2), "mode": "abs"}
    assert gradzip._C.ModelSpec("sz:mode=abs,param_cutoff=0,ef=1").error_bound == (False, 1e-3)
    assert str(gradzip._C.ModelSpec("sz:mode=abs,param_cutoff=0,ef=1").codec) == "sz:ef=1,mode=abs"
    assert gradzip._C.ModelSpec("uniform:bits=4").error_bound is None
    with pytest.raises(gradzip.SpecError, match="takes no error bound"):
        gradzip._C.ModelSpec("uniform").with_absolute_bound(0.5)


def test_error_feedback_across_rounds_keeps_what_was_not_sent():
    state = {"w": torch.randn(5000)}
    memory = codec.ModelState(seed=3)
    total_in = torch.zeros(5000, dtype=torch.float64)
    total_out = torch.zeros(5000, dtype=torch.float64)
    for r in range(5):
        update = {"w": torch.randn(5000, generator=torch.Generator().manual_seed(r))}
        out = codec.decompress_model(codec.compress_model(update, "topk:density=0.05", state=memory), like=state)
        total_in += update["w"].double()
        total_out += out["w"].double()
    residual = memory.entries["w"].residual.double()
    assert torch.allclose(total_out + residual, total_in, atol=1e-4)
    restored = codec.ModelState()
    restored.load_state_dict(memory.state_dict())
    assert torch.equal(restored.entries["w"].residual, memory.entries["w"].residual)


def test_tff_bit_accounting():
    state = {"big": torch.randn(20000), "small": torch.randn(10000)}
    data = codec.compress_model(state, "uniform:lossless=none")
    stats = codec.model_stats(data)
    assert stats["dense_bits"] == 30000 * 32
    assert stats["sent_bits"] == len(data) * 8
    big, small = stats["entries"]["big"], stats["entries"]["small"]
    assert big["sent_bits"] == 8 * (16 + 10) + 20000 * 8  # header + min/max + 8 bits per element
    assert small["sent_bits"] == 8 * (16 + 1) + 10000 * 32  # at most 10000 elements: fp32


# --- hostile and damaged bytes ---------------------------------------------------------

def small_state():
    g = torch.Generator().manual_seed(4)
    return OrderedDict([("a", torch.randn(1200, generator=g)), ("b", torch.arange(6)), ("c", torch.randn(2, 700, generator=g))])


def reseal(body: bytes) -> bytes:
    return body + struct.pack("<I", zlib.crc32(body))


def test_every_truncation_and_flip_is_refused():
    state = small_state()
    data = codec.compress_model(state, "sz:bound=1e-3,lossless=none")
    for cut in range(0, len(data), max(1, len(data) // 300)):
        with pytest.raises(PayloadError):
            codec.decompress_model(data[:cut], like=state)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        damaged = bytearray(data)
        at = int(torch.randint(len(data), (1,), generator=g))
        damaged[at] ^= int(torch.randint(1, 256, (1,), generator=g))
        with pytest.raises(PayloadError):
            codec.decompress_model(bytes(damaged), like=state)


def test_resealed_hostile_containers_are_refused_by_what_is_wrong():
    state = small_state()
    data = codec.compress_model(state, "sz:bound=1e-3,lossless=none")
    body = data[:-4]
    header = _HEADER.unpack(body[:_HEADER.size])

    def with_header(**changes):
        fields = dict(zip(["magic", "version", "lossless", "flags", "count"], header))
        fields.update(changes)
        return reseal(_HEADER.pack(*fields.values()) + body[_HEADER.size:])

    cases = [
        (with_header(version=9), "format version 9"),
        (with_header(lossless=7), "unknown lossless stage 7"),
        (with_header(flags=4), "unknown flags"),
        (with_header(count=2), "bytes follow the last entry"),
        (with_header(count=4), "truncated"),
        (reseal(b"NOTMODEL" + body[8:]), "bad magic"),
    ]
    # The first entry's fields: name length (2), name "a", then storage, dtype, ndim, sizes.
    at = _HEADER.size + 2 + 1
    storage, dtype, ndim, raw_size, stored_size = _ENTRY.unpack(body[at:at + _ENTRY.size])

    def with_entry(**changes):
        fields = dict(zip(["storage", "dtype", "ndim", "raw", "stored"], (storage, dtype, ndim, raw_size, stored_size)))
        fields.update(changes)
        return reseal(body[:at] + _ENTRY.pack(*fields.values()) + body[at + _ENTRY.size:])

    cases += [
        (with_entry(storage=5), "unknown storage 5"),
        (with_entry(dtype=99), "unknown dtype 99"),
        (with_entry(dtype=1), "the model's is torch.float32"),
        (with_entry(raw=1 << 40), "at most"),
        (with_entry(storage=1), "exactly"),
        (reseal(body[:_HEADER.size + 2] + b"z" + body[_HEADER.size + 3:]), "entry 'z' where the model has 'a'"),
    ]
    # A codec payload whose element count lies: the codec's own checks name it.
    payload_at = at + _ENTRY.size + 8 * ndim
    payload = bytearray(body[payload_at:payload_at + stored_size])
    payload[8:16] = struct.pack("<Q", 999)
    cases.append((reseal(body[:payload_at] + bytes(payload) + body[payload_at + stored_size:]), "999 elements"))
    for hostile, why in cases:
        with pytest.raises(PayloadError, match=why):
            codec.decompress_model(hostile, like=state)
    with pytest.raises(PayloadError, match="CRC-32"):
        codec.decompress_model(data[:-1] + bytes([data[-1] ^ 1]), like=state)
    with pytest.raises(PayloadError, match="holds 3 tensors, the model 2"):
        codec.decompress_model(data, like=OrderedDict(list(state.items())[:2]))


def test_the_container_never_unpickles():
    import gradzip.model_codec as module
    source = open(module.__file__).read()
    assert "pickle" not in source.replace("No pickle", "").replace("no pickle", "")


def test_half_precision_near_its_largest_value_never_decodes_to_inf():
    g = torch.Generator().manual_seed(7)
    x = ((torch.rand(100000, generator=g) * 2 - 1) * 65504).half()
    x[:100] = 65504
    near = torch.full((4096,), 60000.0).half()
    for spec, t in (("zfp:mode=rel,bound=1e-3", x), ("sz:mode=abs,bound=1000,lossless=none", near),
                    ("sz:mode=abs,bound=1000,predictor=lorenzo", near)):
        out = codec.decompress_model(codec.compress_model({"w": t}, spec), like={"w": t})["w"]
        assert bool(torch.isfinite(out).all()), spec
        assert (out.double() - t.double()).abs().max().item() <= bound_of(spec, t.float()), spec


def test_with_error_feedback_the_bound_holds_for_what_each_round_sends():
    memory = codec.ModelState()
    x = {"w": torch.randn(5000)}
    for _ in range(3):
        before = memory.entries["w"].residual.clone() if "w" in memory.entries else torch.zeros(5000)
        out = codec.decompress_model(codec.compress_model(x, "sz:mode=abs,bound=0.01", state=memory), like=x)
        assert (out["w"].double() - (x["w"] + before).double()).abs().max().item() <= 0.01


def test_exact_entries_are_checked_and_conjugate_views_stored():
    state = {"mask": torch.rand(2000) > 0.5, "z": torch.randn(1500, dtype=torch.complex64).conj()}
    data = codec.compress_model(state, "sz:lossless=none")
    back = codec.decompress_model(data, like=state)
    assert torch.equal(back["mask"], state["mask"]) and torch.equal(back["z"], state["z"].resolve_conj())
    body = bytearray(data[:-4])
    at = body.index(b"mask") + 4 + _ENTRY.size + 8  # the first byte of the bool entry's data
    body[at] = 7
    with pytest.raises(PayloadError, match="bytes other than 0 and 1"):
        codec.decompress_model(reseal(bytes(body)), like=state)


def test_a_server_accepts_only_the_codecs_it_names():
    state = model_state()
    sz = codec.compress_model(state, "sz:bound=1e-3")
    polar = codec.compress_model(state, "polar")
    assert codec.decompress_model(sz, like=state, accept=["sz"]).keys() == state.keys()
    assert codec.decompress_model(sz, like=state, accept="sz").keys() == state.keys()
    with pytest.raises(PayloadError, match="entry 'conv.weight' is a polar payload; this call accepts sz, zfp"):
        codec.decompress_model(polar, like=state, accept=["sz", "zfp"])
    with pytest.raises(ValueError, match=r"accept names \['szz'\], not codecs"):
        codec.decompress_model(sz, like=state, accept=["szz"])
