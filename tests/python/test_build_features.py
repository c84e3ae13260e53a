"""A build made without an optional system library (libzfp, libzstd, libblosc) turns off only
what needs it, and each such feature names the library when asked for; a build with it uses
it. Which branch runs depends on the build: the main suite's build has all three, the
second-torch stage (scripts/second_torch.sh) none."""
import pytest
import torch

import gradzip
from gradzip import codec

pytestmark = pytest.mark.torch_range

LIBRARIES = gradzip.build_info()["system_libraries"]
# codec.encode(torch.linspace(-1, 1, 16), "zfp:mode=abs,bound=0.001") by a build with libzfp
ZFP_PAYLOAD = bytes.fromhex("475a010a0000000010000000000000000000fca9f1d24d62503f1900000000000000000000000000000001"
                            "59a7644aa6f4e309988009fdec844cc8848016b7600bb600")


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 4))


def test_the_zfp_codec_works_or_names_libzfp():
    x = torch.linspace(-1, 1, 16)
    if LIBRARIES["libzfp"]:
        assert (codec.decode(ZFP_PAYLOAD, like=x) - x).abs().max() <= 1e-3
        assert gradzip.Spec("zfp:mode=abs,bound=1e-3").name == "zfp"
        return
    for door in (lambda: gradzip.Spec("zfp"), lambda: codec.encode(x, "zfp", codec.State()),
                 lambda: gradzip.Spec("choco:compress=zfp"), lambda: codec.compress_model(model(), "zfp")):
        with pytest.raises(gradzip.SpecError, match="codec 'zfp' needs libzfp, which this build of gradzip was made without"):
            door()
    with pytest.raises(gradzip.PayloadError, match="a payload of codec 'zfp' needs libzfp"):
        codec.decode(ZFP_PAYLOAD, like=x)
    assert "zfp" not in gradzip.aggregations()


@pytest.mark.parametrize("method", ["zstd", "blosc"])
def test_a_lossless_stage_works_or_names_its_library(method):
    library = "lib" + method
    spec = f"sz:mode=rel,bound=1e-3,lossless={method}"
    if LIBRARIES[library]:
        data = codec.compress_model(model(), spec)
        restored = codec.decompress_model(data, like=model())
        assert all(torch.allclose(restored[k], v, atol=1e-2) for k, v in model().state_dict().items())
        return
    with pytest.raises(gradzip.SpecError, match=f"lossless={method} needs {library}"):
        codec.compress_model(model(), spec)


def test_the_container_defaults_to_a_lossless_stage_this_build_has():
    default = "zstd" if LIBRARIES["libzstd"] else "none"
    data = codec.compress_model(model(), "sz")
    assert data == codec.compress_model(model(), f"sz:lossless={default}")
    assert codec.decompress_model(data, like=model()).keys() == model().state_dict().keys()
