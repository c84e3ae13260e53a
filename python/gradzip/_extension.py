"""Loads gradzip._C, first refusing a torch other than the one it was built against (c10d's
Backend changes in nearly every torch release): the error names both and the command that
rebuilds."""
import torch

from gradzip_autoload import build_mismatch

_WHY = build_mismatch()
if _WHY is not None:
    raise ImportError(_WHY)

try:
    from . import _C
except ImportError as error:
    raise ImportError(
        f"gradzip's C++ extension failed to load beside torch {torch.__version__}: {error}"
    ) from error
