"""gradzip.codec: tensors and whole models to bytes and back, for code that moves bytes
itself (a federated server).

    state = gradzip.codec.State()                       # error feedback across calls
    data = gradzip.codec.encode(grad, "stc:density=0.01", state)
    total = gradzip.codec.decode(data, like=grad)

    blob = gradzip.codec.compress_model(model, "sz:mode=rel,bound=1e-3")
    weights = gradzip.codec.decompress_model(blob, like=model)

One tensor: gradzip.tensor_codec. Whole models in one checked container (APPFL's
compress_model shape): gradzip.model_codec.
"""
from .model_codec import ModelState, compress_model, decompress_model, model_stats
from .tensor_codec import PayloadError, State, decode, encode, header, max_payload_bytes

__all__ = ["ModelState", "PayloadError", "State", "compress_model", "decode", "decompress_model", "encode", "header",
           "max_payload_bytes", "model_stats"]
