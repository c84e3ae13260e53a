"""Builds gradzip: CMake compiles the C++ (and, when torch has CUDA and nvcc is found,
the CUDA) sources into the module gradzip._C, next to the Python package.

    pip install --no-build-isolation .        # or -e . while developing

Environment: GRADZIP_BUILD_DIR (default ./build), GRADZIP_CUDA (AUTO/ON/OFF),
GRADZIP_CMAKE_ARGS (extra arguments for the CMake configure step), MAX_JOBS (build jobs).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = Path(os.environ.get("GRADZIP_BUILD_DIR", ROOT / "build"))
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DGRADZIP_CUDA={os.environ.get('GRADZIP_CUDA', 'AUTO')}",
        ] + os.environ.get("GRADZIP_CMAKE_ARGS", "").split()
        subprocess.check_call(configure)
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", str(build_dir), "-j", jobs])
        built = next(build_dir.glob("_C*.so"))
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target)


setup(
    ext_modules=[CMakeExtension("gradzip._C")],
    cmdclass={"build_ext": CMakeBuild},
)
