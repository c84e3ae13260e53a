"""Loads gradzip._C and refuses a torch other than the one it was built against:
c10d's Backend changes in nearly every torch release."""
import torch

try:
    from . import _C
except ImportError as error:
    raise ImportError(
        f"gradzip's C++ extension failed to load with torch {torch.__version__}: {error}. "
        "gradzip is built for one torch version; rebuild it next to this torch with "
        "`pip install --no-build-isolation .` in the gradzip checkout."
    ) from error

_BUILT = _C.built_torch_version()
_RUNNING = torch.__version__.split("+")[0]
if _BUILT != _RUNNING:
    raise ImportError(
        f"gradzip was built against torch {_BUILT} but torch {_RUNNING} is installed; "
        "rebuild gradzip with `pip install --no-build-isolation .` in the gradzip checkout."
    )
