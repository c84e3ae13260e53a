"""Finds gradzip by name without `import gradzip`: torch's entry points call these, so an
unmodified script's ``init_process_group("gradzip")`` (or ``backend="cpu:gradzip,cuda:gradzip"``)
works with only GRADZIP_AGGREGATION set.

- ``torch.distributed.backends`` (torch 2.14 and later): torch calls
  register_backend_name() when a group first names "gradzip"; nothing runs at ``import torch``.
- ``torch.backends`` (every torch): torch calls autoload() at the end of ``import torch``
  unless TORCH_DEVICE_BACKEND_AUTOLOAD=0. Where the first entry point exists it does nothing;
  before 2.14 it registers the name. It never raises: a gradzip that cannot work beside this
  torch gives one warning, and torch works on.

Both register a creator that loads the extension at the first gradzip group, so neither loads
it (nor imports the gradzip package) itself: this module reads gradzip/_build.json.
"""
import importlib.util
import json
import os
import warnings

_RUN_AGAIN = "pip install --no-build-isolation --force-reinstall --no-deps <gradzip's source>"


def build_mismatch():
    """Why this gradzip cannot load beside the running torch, or None when it can: the torch
    (release and CUDA version) it was built against differs from the running one, or it has no
    build at all."""
    import torch

    spec = importlib.util.find_spec("gradzip")
    folders = list(spec.submodule_search_locations or []) if spec else []
    record = next((os.path.join(f, "_build.json") for f in folders if os.path.exists(os.path.join(f, "_build.json"))), None)
    if record is None:
        return f"gradzip has no built extension beside {folders or 'its package'}: build it with `{_RUN_AGAIN}`"
    with open(record) as f:
        built = json.load(f)
    running = {"torch": torch.__version__.split("+")[0], "torch_cuda": torch.version.cuda or ""}
    if built != running:
        return (f"gradzip was built against {describe(built)} but {describe(running)} is running; "
                f"rebuild it in this environment with `{_RUN_AGAIN}`")
    return None


def describe(build):
    return f"torch {build['torch']} ({'CUDA ' + build['torch_cuda'] if build['torch_cuda'] else 'CPU-only'})"


def _create_backend(dist_opts, backend_options):
    from gradzip.backend import _create_backend as create  # the extension loads here, at the first group

    return create(dist_opts, backend_options)


def register_backend_name():
    """Registers the name "gradzip" with a creator that loads gradzip at the first group.
    Raises ImportError, naming both torches, when this build cannot load beside this torch."""
    import torch.distributed as dist

    if "gradzip" in dist.Backend.backend_list:
        return
    why = build_mismatch()
    if why is not None:
        raise ImportError(why)
    dist.Backend.register_backend("gradzip", _create_backend, extended_api=True, devices=["cpu", "cuda"])


def autoload():
    """The ``torch.backends`` entry point: never raises. A build that cannot load beside this
    torch warns once, here, and its name stays registered to a creator that raises the same
    words, so that a group naming "gradzip" says why rather than "invalid backend"."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or hasattr(dist.Backend, "_ensure_backend_registered"):
            return  # no c10d in this torch, or it finds the name through torch.distributed.backends
        try:
            register_backend_name()
        except ImportError as mismatch:
            why = str(mismatch)
            warnings.warn(f"gradzip: {why}", RuntimeWarning, stacklevel=2)

            def refuse(dist_opts, backend_options):
                raise ImportError(why)

            dist.Backend.register_backend("gradzip", refuse, extended_api=True, devices=["cpu", "cuda"])
    except Exception as error:  # noqa: BLE001 -- a plugin must never break `import torch`
        warnings.warn(f"gradzip: the backend name 'gradzip' is not registered: {error}", RuntimeWarning, stacklevel=2)
