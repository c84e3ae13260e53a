"""Builds gradzip against the torch of the environment it is installed into: CMake compiles
the C++ (and, when that torch has CUDA and nvcc is found, the CUDA) sources into the module
gradzip._C, next to the Python package.

    pip install --no-build-isolation .        # or -e . while developing; `pip wheel --no-build-isolation .`

--no-build-isolation: an isolated build would install a torch of its own to build against,
not the one gradzip will run beside. The build needs a C++20 compiler, cmake (3.25 or newer)
and, if present, ninja: from the system or from PyPI (`pip install cmake ninja`).

Environment: GRADZIP_BUILD_DIR (default ./build), GRADZIP_CUDA (AUTO/ON/OFF),
GRADZIP_BUILD_TESTS (OFF/ON: also the GoogleTest binaries; `make` turns it on),
GRADZIP_CMAKE_ARGS (extra arguments for the CMake configure step, e.g.
-DGRADZIP_CUDA_ARCHITECTURES=90), MAX_JOBS (build jobs).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# What the package reads before it loads _C (the torch this build is for): CMake writes it,
# and it travels beside _C, into wheels and into editable installs alike.
BUILD_RECORD = "_build.json"


def build_tool(name):
    """A build tool from PATH, else from its PyPI package (cmake, ninja) in this environment."""
    found = shutil.which(name)
    if found:
        return found
    try:
        module = __import__(name)
    except ImportError:
        return None
    folder = getattr(module, "CMAKE_BIN_DIR", None) or getattr(module, "BIN_DIR", None)
    candidate = Path(folder or "", name)
    return str(candidate) if candidate.exists() else None


def require_torch():
    try:
        import torch  # noqa: F401
    except ImportError as error:
        sys.exit(f"gradzip builds against the torch of this environment, and none imports here ({error}): "
                 "install torch first, then `pip install --no-build-isolation .`")


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        require_torch()
        cmake = build_tool("cmake")
        if cmake is None:
            sys.exit("gradzip's build needs cmake 3.25 or newer: `pip install cmake` (or your system's package)")
        build_dir = Path(os.environ.get("GRADZIP_BUILD_DIR", ROOT / "build"))
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [
            cmake, "-S", str(ROOT), "-B", str(build_dir),
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DGRADZIP_CUDA={os.environ.get('GRADZIP_CUDA', 'AUTO')}",
            f"-DGRADZIP_BUILD_TESTS={os.environ.get('GRADZIP_BUILD_TESTS', 'OFF')}",
        ]
        ninja = build_tool("ninja")
        if ninja and not (build_dir / "CMakeCache.txt").exists():
            configure += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
        configure += os.environ.get("GRADZIP_CMAKE_ARGS", "").split()
        subprocess.check_call(configure)
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call([cmake, "--build", str(build_dir), "-j", jobs])
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(next(build_dir.glob("_C*.so")), target)
        shutil.copy2(build_dir / BUILD_RECORD, target.with_name(BUILD_RECORD))

    def get_output_mapping(self):
        mapping = super().get_output_mapping()
        for built, inplace in list(mapping.items()):
            mapping[str(Path(built).with_name(BUILD_RECORD))] = str(Path(inplace).with_name(BUILD_RECORD))
        return mapping

    def copy_extensions_to_source(self):  # an editable install: the record goes beside _C too
        super().copy_extensions_to_source()
        for built, inplace in self.get_output_mapping().items():
            if built.endswith(BUILD_RECORD):
                shutil.copy2(built, inplace)


setup(
    ext_modules=[CMakeExtension("gradzip._C")],
    cmdclass={"build_ext": CMakeBuild},
)
